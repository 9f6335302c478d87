"""What the retrieval endpoints share: their inputs as ``Piece``s (text, images, videos, or
token ids), a piece or a (query, document) pair as a prompt, and prompt-only pooling requests
run together (all tokenized before any is sent: one bad input fails the call alone)."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request

from sglang.srt.entrypoints.http_utils import collect_all
from sglang.srt.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    ChatMessage,
    ContentPart,
    ImagePart,
    ImageURL,
    TextPart,
    VideoPart,
    VideoURL,
)
from sglang.srt.entrypoints.openai.protocol_retrieval import (
    MultimodalContent,
    MultimodalEmbeddingInput,
)
from sglang.srt.entrypoints.openai.serving_chat import render_chat
from sglang.srt.layers.pooling_config import PoolingConfig
from sglang.srt.managers.inputs import GenerateInput
from sglang.srt.managers.tokenizer_manager import RequestError, StreamEvent, TokenizerManager
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.server_args import ServerArgs

NOT_POOLING = (
    "this model does not serve embeddings or scores: launch it with --is-embedding "
    "(or serve a checkpoint with a sentence-transformers pooling config)"
)


@dataclass
class Piece:
    """One thing to embed or score: content parts in order, or token ids."""

    parts: list[ContentPart] = field(default_factory=list)
    input_ids: list[int] | None = None

    @property
    def has_media(self) -> bool:
        return any(p.type != "text" for p in self.parts)

    @property
    def text(self) -> str:
        return "".join(p.text for p in self.parts if isinstance(p, TextPart))

    def document(self) -> dict[str, Any]:
        """The piece as a rerank result echoes it (vLLM's ``text`` / ``multi_modal``)."""
        if not self.has_media:
            return {"text": self.text}
        return {"multi_modal": [p.model_dump(exclude_none=True) for p in self.parts]}


def piece_of(value: Any) -> Piece:
    """A string, SGLang's / Jina's ``{"text", "image", "video"}``, vLLM's ``{"content"}``, a
    list of content parts, or token ids."""
    if isinstance(value, str):
        return Piece([TextPart(type="text", text=value)])
    if isinstance(value, MultimodalEmbeddingInput):
        parts: list[ContentPart] = []
        if value.image is not None:
            parts.append(ImagePart(type="image_url", image_url=ImageURL(url=value.image)))
        if value.video is not None:
            parts.append(VideoPart(type="video_url", video_url=VideoURL(url=value.video)))
        if value.text is not None:
            parts.append(TextPart(type="text", text=value.text))
        if not parts:
            raise RequestError("an input needs text, an image or a video")
        return Piece(parts)
    if isinstance(value, MultimodalContent):
        return Piece(list(value.content))
    if isinstance(value, list) and value and all(isinstance(t, int) for t in value):
        return Piece(input_ids=list(value))
    if isinstance(value, list) and value and not any(isinstance(t, (int, str)) for t in value):
        return Piece(list(value))
    raise RequestError("an input must be text, token ids, or text / image / video content")


def check_serves_pooling(manager: TokenizerManager) -> PoolingConfig:
    if manager.pooling is None:
        raise RequestError(NOT_POOLING)
    return manager.pooling


def piece_input(
    manager: TokenizerManager,
    args: ServerArgs,
    piece: Piece,
    mm_processor_kwargs: dict[str, Any] | None = None,
) -> GenerateInput:
    """Token ids as they are, text alone as it is (special tokens added), anything with media
    through the chat template as one user turn with the generation prompt (as SGLang renders
    its multimodal embedding inputs)."""
    if piece.input_ids is not None:
        return prompt_input(None, piece.input_ids)
    if not piece.has_media:
        if not piece.text.strip():
            raise RequestError("an input cannot be empty or whitespace only")
        return prompt_input(piece.text, None)
    messages = [ChatMessage(role="user", content=piece.parts)]
    body = ChatCompletionRequest(messages=messages, mm_processor_kwargs=mm_processor_kwargs)
    return chat_input(manager, args, body, add_generation_prompt=True)


def pair_input(
    manager: TokenizerManager,
    args: ServerArgs,
    query: Piece,
    document: Piece,
    instruct: str | None,
    mm_processor_kwargs: dict[str, Any] | None = None,
) -> GenerateInput:
    """A cross-encoder's prompt: one user turn holding the query's parts, then the document's,
    after ``instruct`` as a system turn, with the generation prompt; the head reads its last
    token."""
    if query.input_ids is not None or document.input_ids is not None:
        raise RequestError("a cross-encoder scores text / image / video content, not token ids")
    messages = [ChatMessage(role="user", content=[*query.parts, *document.parts])]
    if instruct:
        messages.insert(0, ChatMessage(role="system", content=instruct))
    body = ChatCompletionRequest(messages=messages, mm_processor_kwargs=mm_processor_kwargs)
    return chat_input(manager, args, body, add_generation_prompt=True)


def chat_input(
    manager: TokenizerManager,
    args: ServerArgs,
    body: ChatCompletionRequest,
    add_generation_prompt: bool,
) -> GenerateInput:
    chat = render_chat(manager, body, args, add_generation_prompt=add_generation_prompt)
    return chat.generate_input(uuid.uuid4().hex, _prompt_only(), manager.tokenizer.bos_token)


def prompt_input(prompt: str | None, input_ids: list[int] | None) -> GenerateInput:
    return GenerateInput(uuid.uuid4().hex, prompt, input_ids, [], _prompt_only())


def _prompt_only() -> SamplingParams:
    return SamplingParams.from_dict({"max_new_tokens": 0})


async def run_pooling(
    manager: TokenizerManager, inputs: list[GenerateInput], request: Request
) -> list[StreamEvent]:
    """Tokenize every input (a bad one fails the call before any is sent), then run them all
    as pooling requests; their final events, in order."""
    if not inputs:
        raise RequestError("the input cannot be empty")
    tokenized = await asyncio.gather(*(manager.tokenize(inp) for inp in inputs))
    for t in tokenized:
        t.pooling = True
    events = await collect_all([manager.generate(t) for t in tokenized], request)
    for event in events:
        if event.embedding is None:
            raise RequestError("a pooling request ended without its pooled vector", 500)
    return events


def pooling_usage(events: list[StreamEvent]) -> dict[str, int]:
    """A retrieval response's ``usage``: prompt tokens only."""
    tokens = sum(e.meta["prompt_tokens"] for e in events)
    return {"prompt_tokens": tokens, "total_tokens": tokens}
