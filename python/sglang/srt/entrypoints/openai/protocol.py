"""Request bodies of the HTTP API (OpenAI-compatible and SGLang's /generate)."""

from __future__ import annotations

from collections.abc import Callable
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


class VideoURL(BaseModel):
    url: str
    # this video's sampling (over the request's mm_processor_kwargs)
    fps: float | None = None
    max_frames: int | None = None
    num_frames: int | None = None

    def options(self) -> dict[str, Any]:
        fields = {"fps": self.fps, "max_frames": self.max_frames, "num_frames": self.num_frames}
        return {k: v for k, v in fields.items() if v is not None}


class VideoPart(BaseModel):
    type: Literal["video_url"]
    video_url: VideoURL


ContentPart = TextPart | ImagePart | VideoPart


class FunctionCall(BaseModel):
    name: str
    arguments: str | dict[str, Any] | None = None


class ToolCallMessagePart(BaseModel):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(BaseModel):
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[ContentPart] | None = None
    tool_calls: list[ToolCallMessagePart] | None = None
    tool_call_id: str | None = None
    name: str | None = None


class FunctionDefinition(BaseModel):
    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(BaseModel):
    type: Literal["function"] = "function"
    function: FunctionDefinition


class ToolChoiceFunction(BaseModel):
    name: str


class NamedToolChoice(BaseModel):
    type: Literal["function"] = "function"
    function: ToolChoiceFunction


class JsonSchemaResponseFormat(BaseModel):
    model_config = ConfigDict(populate_by_name=True)

    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaResponseFormat | None = None


class StreamOptions(BaseModel):
    include_usage: bool = False


class _Sampling(_Body):
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    stop_regex: str | list[str] | None = None
    ignore_eos: bool = False
    seed: int | None = None
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    skip_special_tokens: bool = True
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    repetition_penalty: float | None = None
    min_tokens: int | None = None
    logit_bias: dict[str, float] | None = None
    response_format: ResponseFormat | None = None
    include_stop_str_in_output: bool = False
    no_stop_trim: bool = False
    regex: str | None = None
    ebnf: str | None = None
    custom_params: dict[str, Any] | None = None
    watermark: dict[str, Any] | None = None
    cache_salt: str | list[str] | None = None  # prefixes are shared only within one salt
    custom_logit_processor: str | list[str | None] | None = None  # CustomLogitProcessor.to_str()


class ChatCompletionRequest(_Sampling):
    model: str | None = None
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    chat_template_kwargs: dict[str, Any] | None = None  # e.g. {"enable_thinking": false}
    separate_reasoning: bool = True  # with --reasoning-parser: reasoning_content apart
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool = True
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    mm_processor_kwargs: dict[str, Any] | None = None  # video sampling: fps, max_frames, ...
    continue_final_message: bool = False  # the answer continues the final assistant message
    rid: str | None = None  # the request's id (for /abort_request)


class CompletionRequest(_Sampling):
    model: str | None = None
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = 16
    echo: bool = False
    logprobs: int | None = Field(default=None, ge=0, le=5)
    rid: str | list[str] | None = None  # the requests' ids (for /abort_request)


class GenerateRequest(_Body):
    text: str | list[str] | None = None
    input_ids: list[int] | list[list[int]] | None = None
    image_data: Any = None
    video_data: Any = None
    sampling_params: dict[str, Any] | list[dict[str, Any]] | None = None
    stream: bool = False
    return_logprob: bool = False
    top_logprobs_num: int = Field(default=0, ge=0, le=20)
    logprob_start_len: int = Field(default=-1, ge=-1)
    return_text_in_logprobs: bool = False
    token_ids_logprob: list[int] | list[list[int]] | None = None
    cache_salt: str | list[str] | None = None
    custom_logit_processor: str | list[str | None] | None = None
    rid: str | list[str] | None = None
    require_reasoning: bool = False  # count meta_info.reasoning_tokens from the output's start
    mm_processor_kwargs: dict[str, Any] | None = None  # video sampling: fps, max_frames, ...


def sampling_dict(req: _Sampling, max_new_tokens: int | None) -> dict[str, Any]:
    """OpenAI-style fields -> SGLang sampling params (validated later)."""
    if max_new_tokens is not None and max_new_tokens < 1:
        raise ValueError(f"max_tokens must be at least 1, got {max_new_tokens}")
    out: dict[str, Any] = {"max_new_tokens": max_new_tokens, "min_new_tokens": req.min_tokens}
    for name in (
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "stop",
        "stop_token_ids",
        "stop_regex",
        "seed",
        "frequency_penalty",
        "presence_penalty",
        "repetition_penalty",
        "custom_params",
        "watermark",
    ):
        out[name] = getattr(req, name)
    out["ignore_eos"] = req.ignore_eos
    out["skip_special_tokens"] = req.skip_special_tokens
    out["n"] = req.n
    return out


# Request fields this server does not implement: a request that uses one (a value other than its
# default) is answered 400 naming it, never silently ignored.
def _used(value: Any) -> bool:
    return value not in (None, False, 0, "", [], {})


def _not_in(*defaults: Any) -> Callable[[Any], bool]:
    return lambda value: value not in (None, *defaults)


UNIMPLEMENTED_CHAT_FIELDS: dict[str, Callable[[Any], bool]] = {
    "functions": _used,
    "function_call": _not_in("none", "auto"),
    "audio": _used,
    "prediction": _used,
    "modalities": _not_in(["text"]),
    "reasoning_effort": _used,
    "web_search_options": _used,
}
UNIMPLEMENTED_COMPLETION_FIELDS: dict[str, Callable[[Any], bool]] = {
    "suffix": _used,
    "best_of": _not_in(1),
}
UNIMPLEMENTED_GENERATE_FIELDS: dict[str, Callable[[Any], bool]] = {
    "return_hidden_states": _used,
    "lora_path": _used,
    "input_embeds": _used,
    "audio_data": _used,
    "session_params": _used,
}


def reject_unimplemented(body: BaseModel, rules: dict[str, Callable[[Any], bool]]) -> None:
    """Raise ValueError naming the first field of ``rules`` that ``body`` uses."""
    declared = type(body).model_fields
    extra = body.model_extra or {}
    for name, is_used in rules.items():
        value = getattr(body, name) if name in declared else extra.get(name)
        if is_used(value):
            raise ValueError(f"the request field {name!r} is not supported by this server")
