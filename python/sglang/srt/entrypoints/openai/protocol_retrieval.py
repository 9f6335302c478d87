"""Request bodies of the retrieval endpoints: ``/v1/embeddings`` (OpenAI's ``input``, SGLang's
multimodal list, vLLM's chat ``messages``), ``/v1/score`` (vLLM's) and ``/v1/rerank`` (vLLM's,
Cohere's and Jina's shapes)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from sglang.srt.entrypoints.openai.protocol import ChatMessage, ContentPart, _Body


class MultimodalEmbeddingInput(BaseModel):
    """SGLang's multimodal embedding input (and Jina's document objects): text, image or both."""

    text: str | None = None
    image: str | None = None
    video: str | None = None


class MultimodalContent(BaseModel):
    """vLLM's ``ScoreMultiModalParam``: content parts (a query's, or one document per part)."""

    content: list[ContentPart] = Field(min_length=1)


EmbeddingInput = str | list[str] | list[int] | list[list[int]] | list[MultimodalEmbeddingInput]


class EmbeddingRequest(_Body):
    model: str | None = None
    input: EmbeddingInput | None = None
    messages: list[ChatMessage] | None = None  # vLLM's chat form: one input
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
    user: str | None = None
    # vLLM's chat options (its defaults: no generation prompt)
    add_generation_prompt: bool = False
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    mm_processor_kwargs: dict[str, Any] | None = None
    rid: str | None = None


# One query or document: a string, SGLang's / Jina's object, vLLM's content, or content parts.
RetrievalInput = str | MultimodalEmbeddingInput | MultimodalContent | list[ContentPart]


class ScoreRequest(_Body):
    """vLLM's score request: ``text_1`` against ``text_2`` (``queries`` / ``documents`` and
    ``data_1`` / ``data_2`` are its other names): one against many, or pairwise."""

    model: str | None = None
    text_1: RetrievalInput | list[RetrievalInput] | None = None
    text_2: RetrievalInput | list[RetrievalInput] | None = None
    queries: RetrievalInput | list[RetrievalInput] | None = None
    documents: RetrievalInput | list[RetrievalInput] | None = None
    data_1: RetrievalInput | list[RetrievalInput] | None = None
    data_2: RetrievalInput | list[RetrievalInput] | None = None
    instruct: str | None = None  # a system message for a cross-encoder's prompt
    mm_processor_kwargs: dict[str, Any] | None = None


class RerankRequest(_Body):
    """A query and documents (vLLM's content form counts one document per part)."""

    model: str | None = None
    query: RetrievalInput
    documents: list[RetrievalInput] | MultimodalContent
    top_n: int | None = Field(default=None, ge=0)
    return_documents: bool = True
    instruct: str | None = None
    mm_processor_kwargs: dict[str, Any] | None = None
