"""Request bodies of the HTTP API (OpenAI-compatible and SGLang's /generate)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Body(BaseModel):
    model_config = ConfigDict(extra="allow")


class ImageURL(BaseModel):
    url: str
    detail: str | None = None


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class ImagePart(BaseModel):
    type: Literal["image_url"]
    image_url: ImageURL


ContentPart = TextPart | ImagePart


class ChatMessage(BaseModel):
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[ContentPart] | None = None


class StreamOptions(BaseModel):
    include_usage: bool = False


class _Sampling(_Body):
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    seed: int | None = None
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    skip_special_tokens: bool = True
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    repetition_penalty: float | None = None


class ChatCompletionRequest(_Sampling):
    model: str | None = None
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    chat_template_kwargs: dict[str, Any] | None = None  # e.g. {"enable_thinking": false}
    separate_reasoning: bool = True  # with --reasoning-parser: reasoning_content apart


class CompletionRequest(_Sampling):
    model: str | None = None
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = 16
    echo: bool = False


class GenerateRequest(_Body):
    text: str | list[str] | None = None
    input_ids: list[int] | list[list[int]] | None = None
    image_data: Any = None
    sampling_params: dict[str, Any] | list[dict[str, Any]] | None = None
    stream: bool = False
    return_logprob: bool = False
    rid: str | list[str] | None = None


def sampling_dict(req: _Sampling, max_new_tokens: int | None) -> dict[str, Any]:
    """OpenAI-style fields -> SGLang sampling params (validated later)."""
    out: dict[str, Any] = {"max_new_tokens": max_new_tokens}
    for name in ("temperature", "top_p", "top_k", "min_p", "stop", "stop_token_ids", "seed"):
        value = getattr(req, name)
        if value is not None:
            out[name] = value
    out["ignore_eos"] = req.ignore_eos
    out["skip_special_tokens"] = req.skip_special_tokens
    out["n"] = req.n
    return out
