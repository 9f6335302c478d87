"""OpenAI ``POST /v1/chat/completions``: messages -> the model's chat template -> one tokenized
request -> choices (streamed or whole), with tools, reasoning and logprobs."""

from __future__ import annotations

import functools
import json
import logging
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any, NamedTuple

from fastapi import Request
from fastapi.responses import Response

from sglang.srt.core.io_struct import (
    TokenizedRequest,
    processors_per_request,
    salts_per_request,
)
from sglang.srt.entrypoints.http_utils import merge_streams, parse_body, sse_response
from sglang.srt.entrypoints.openai.logprobs import LogprobFormatter
from sglang.srt.entrypoints.openai.protocol import (
    UNIMPLEMENTED_CHAT_FIELDS,
    ChatCompletionRequest,
    ChatMessage,
    reject_unimplemented,
    sampling_dict,
)
from sglang.srt.entrypoints.openai.serving_base import (
    OpenAIServingBase,
    UsageOf,
    extra_sampling,
    finish_reason,
    matched_stop,
)
from sglang.srt.entrypoints.reasoning_parser import ReasoningParser, prompt_opens_reasoning
from sglang.srt.function_call import get_tool_call_parser
from sglang.srt.managers.inputs import GenerateInput
from sglang.srt.managers.tokenizer_manager import RequestError, StreamEvent, TokenizerManager
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.server_args import ServerArgs

logger = logging.getLogger(__name__)


@dataclass
class ChatFormat:
    """What shapes a chat answer: the tool-call parser (when tools are active), logprobs, and
    (with --reasoning-parser) a maker of per-choice reasoning splitters, applied first."""

    parser: ModuleType | None
    logprobs: LogprobFormatter | None
    reasoning: Callable[[], ReasoningParser] | None = None


class OpenAIServingChat(OpenAIServingBase):
    body_model = ChatCompletionRequest

    def __init__(self, manager: TokenizerManager, args: ServerArgs) -> None:
        super().__init__(manager, args)
        self.tool_parser = get_tool_call_parser(args.tool_call_parser)
        if args.chat_template and is_template_name(args.chat_template):
            _warn_template_name(args.chat_template)

    async def handle(self, request: Request) -> Response:
        body = await parse_body(request, ChatCompletionRequest)
        reject_unimplemented(body, UNIMPLEMENTED_CHAT_FIELDS)
        tools = active_tools(body)
        chat = render_chat(self.manager, body, self.args, tools)
        tokenized = await self.tokenize(body, chat)
        tokenized.ask_logprobs((body.top_logprobs or 0) if body.logprobs else None)
        tokenized.cache_salt = salts_per_request(body.cache_salt, 1)[0]
        enabled = self.args.enable_custom_logit_processor
        tokenized.custom_logit_processor = processors_per_request(
            body.custom_logit_processor, 1, enabled
        )[0]
        choices = await self.start_choices([tokenized])
        fmt = ChatFormat(
            self.tool_parser if tools else None,
            self.logprob_formatter() if body.logprobs else None,
            self._reasoning_parsers(body, chat.prompt),
        )
        rid = f"chatcmpl-{tokenized.rid}"
        if body.stream:
            head = self.head(rid, "chat.completion.chunk")
            usage = self.stream_usage(body, choices)
            merged = merge_streams(choices.streams)
            return sse_response(
                chat_chunks(merged, head, len(choices.streams), fmt, usage), request
            )
        return await self.respond_whole(
            rid, "chat.completion", choices, request, lambda i, e: chat_choice(i, e, fmt)
        )

    async def tokenize(self, body: ChatCompletionRequest, chat: RenderedChat) -> TokenizedRequest:
        """The rendered chat as one tokenized request with the body's sampling (tool_choice's
        grammar included); it reasons from the start when the prompt opened a reasoning block."""
        max_new = body.max_completion_tokens
        max_new = body.max_tokens if max_new is None else max_new
        sampling = extra_sampling(body, sampling_dict(body, max_new))
        self._add_tool_choice_grammar(body, sampling)
        tokenized = await self.manager.tokenize(self._input(body, chat, sampling))
        parser = self.args.reasoning_parser
        tokenized.require_reasoning = bool(parser) and prompt_opens_reasoning(chat.prompt, parser)
        return tokenized

    def _input(
        self, body: ChatCompletionRequest, chat: RenderedChat, sampling: dict[str, Any]
    ) -> GenerateInput:
        """Without max_tokens, the answer may run to the context length (the scheduler cuts
        it to what the prompt leaves)."""
        params = SamplingParams.from_dict(sampling)
        if not params.max_new_tokens_given:
            params.max_new_tokens = self.manager.context_length
        rid = body.rid or uuid.uuid4().hex
        return chat.generate_input(rid, params, self.manager.tokenizer.bos_token)

    def _add_tool_choice_grammar(self, body: ChatCompletionRequest, params: dict) -> None:
        """``tool_choice: "required"`` or a named function: a structural tag that forces the
        call(s) in the parser's format."""
        choice = body.tool_choice
        if choice is None or choice in ("none", "auto"):  # clients send "auto" without tools too
            return
        if not body.tools:
            raise RequestError("tool_choice needs tools")
        if self.tool_parser is None:
            raise RequestError(
                "tool_choice 'required' or a named function needs the server to run with "
                "--tool-call-parser"
            )
        tools = active_tools(body) or []
        choice_value = choice if isinstance(choice, str) else choice.model_dump()
        if isinstance(choice_value, dict):
            name = choice_value["function"]["name"]
            if name not in {t["function"]["name"] for t in tools}:
                raise RequestError(f"tool_choice names function {name!r}, which is not in tools")
        tag = self.tool_parser.structural_tag(tools, choice_value, body.parallel_tool_calls)
        params["structural_tag"] = json.dumps(tag)

    def _reasoning_parsers(
        self, body: ChatCompletionRequest, prompt: str
    ) -> Callable[[], ReasoningParser] | None:
        """With --reasoning-parser (and the request not opting out), a maker of per-choice
        parsers that start inside the reasoning block when the rendered prompt opened it."""
        name = self.args.reasoning_parser
        if name is None or not body.separate_reasoning:
            return None
        opened = prompt_opens_reasoning(prompt, name)
        return lambda: ReasoningParser(name, in_reasoning=opened)


def active_tools(body: ChatCompletionRequest) -> list[dict[str, Any]] | None:
    """The tools the template shows the model (none with ``tool_choice: "none"``)."""
    if not body.tools or body.tool_choice == "none":
        return None
    return [tool.model_dump(exclude_none=True) for tool in body.tools]


# The chat template ---------------------------------------------------------------------------
class RenderedChat(NamedTuple):
    """The prompt, the image and video references in order, and each video's sampling options
    (the request's ``mm_processor_kwargs``, then the part's own)."""

    prompt: str
    images: list[str]
    videos: list[str]
    video_options: list[dict[str, Any]]

    def generate_input(
        self, rid: str, params: SamplingParams, bos_token: str | None
    ) -> GenerateInput:
        """The rendered chat as one request; special tokens are added unless the template
        already wrote the BOS."""
        return GenerateInput(
            rid,
            self.prompt,
            None,
            self.images,
            params,
            add_special_tokens=not (bos_token and self.prompt.startswith(bos_token)),
            videos=self.videos,
            video_options=self.video_options,
        )


def render_chat(
    manager: Any,
    body: ChatCompletionRequest,
    args: ServerArgs,
    tools: list[dict] | None = None,
    add_generation_prompt: bool = True,
) -> RenderedChat:
    """The chat template (``manager.tokenizer``'s, or --chat-template) over messages whose
    image and video parts become the template's image and video entries."""
    if body.mm_processor_kwargs is not None and not isinstance(body.mm_processor_kwargs, dict):
        raise RequestError("mm_processor_kwargs must be an object")
    chat = RenderedChat("", [], [], [])
    messages = [_template_message(msg, body, chat) for msg in body.messages]
    messages, assistant_prefix = _split_final_assistant(messages, body.continue_final_message)
    tokenizer = manager.tokenizer
    template = _chat_template(args)
    if template is None and not getattr(tokenizer, "chat_template", None):
        raise RequestError("the model has no chat template; use /v1/completions or /generate")
    kwargs = body.chat_template_kwargs or {}
    reserved = sorted(set(kwargs) & _RESERVED_TEMPLATE_ARGS)
    if reserved:
        raise RequestError(f"chat_template_kwargs may not set {', '.join(reserved)}")
    extra = {**kwargs, "tools": tools} if tools else kwargs
    try:
        prompt = tokenizer.apply_chat_template(
            messages,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
            chat_template=template,
            **extra,
        )
    except Exception as exc:  # the template's own checks (roles, tool messages) fail here
        raise RequestError(f"the chat template cannot render these messages: {exc}") from exc
    return chat._replace(prompt=prompt + (assistant_prefix or ""))


def _split_final_assistant(
    messages: list[dict[str, Any]], continue_final: bool
) -> tuple[list[dict[str, Any]], str | None]:
    """SGLang's ``continue_final_message``: a final assistant message given as a string leaves
    the list, and its text follows the opened assistant turn, which the answer continues."""
    last = messages[-1] if messages else None
    if continue_final and last and last["role"] == "assistant" and isinstance(last["content"], str):
        return messages[:-1], last["content"]
    return messages, None


_RESERVED_TEMPLATE_ARGS = {
    "messages", "conversation", "tokenize", "add_generation_prompt", "chat_template",
    "return_dict", "return_tensors", "continue_final_message", "tools", "documents",
}  # fmt: skip


def _template_message(
    msg: ChatMessage, body: ChatCompletionRequest, media: RenderedChat
) -> dict[str, Any]:
    """One message as templates take it; its image and video references join ``media``."""
    content: Any = msg.content or ""
    if isinstance(content, list):
        parts = []
        for part in content:
            if part.type == "text":
                parts.append({"type": "text", "text": part.text})
            elif part.type == "video_url":
                media.videos.append(part.video_url.url)
                options = {**(body.mm_processor_kwargs or {}), **part.video_url.options()}
                media.video_options.append(options)
                parts.append({"type": "video"})
            else:
                media.images.append(part.image_url.url)
                parts.append({"type": "image"})
        content = parts
        if msg.role == "tool":  # templates print a tool result as text
            content = "".join(p["text"] for p in parts if p["type"] == "text")
    return {"role": msg.role, "content": content, **_tool_fields(msg)}


def _tool_fields(msg: ChatMessage) -> dict[str, Any]:
    """Tool calls of an assistant turn (arguments as objects, as templates expect) and the id of
    a tool result."""
    out: dict[str, Any] = {}
    if msg.tool_calls:
        out["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.function.name,
             "arguments": _arguments(c.function.arguments)}}
            for c in msg.tool_calls
        ]  # fmt: skip
    if msg.tool_call_id is not None:
        out["tool_call_id"] = msg.tool_call_id
    if msg.name is not None:
        out["name"] = msg.name
    return out


def _arguments(arguments: str | dict | None) -> Any:
    if not isinstance(arguments, str):
        return arguments or {}
    try:
        return json.loads(arguments)
    except json.JSONDecodeError:
        return arguments


def _chat_template(args: ServerArgs) -> str | None:
    if not args.chat_template:
        return None
    if args.chat_template.endswith(".jinja"):
        with open(args.chat_template) as f:
            return f.read()
    if is_template_name(args.chat_template):
        return None  # the model's own (the server warned at start-up)
    return args.chat_template


def is_template_name(value: str) -> bool:
    """Whether ``--chat-template`` names one of SGLang's built-in templates (``chatml-llava``,
    ``qwen2-vl``, ...) rather than holding Jinja: a rendered name would replace every prompt
    with that word."""
    return "{" not in value and "\n" not in value and len(value) < 64


@functools.cache
def _warn_template_name(name: str) -> None:
    logger.warning(
        "--chat-template %r names a built-in SGLang template, which this server does not "
        "have: chats use the model's own template (give a Jinja template, inline or as a "
        ".jinja file, to replace it)",
        name,
    )


# Responses -----------------------------------------------------------------------------------
def chat_choice(index: int, event: StreamEvent, fmt: ChatFormat) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": event.text}
    message["reasoning_content"] = None  # as SGLang: the key is always there
    if fmt.reasoning is not None:
        message["reasoning_content"], message["content"] = fmt.reasoning().parse(event.text)
    finish = finish_reason(event.finish_reason)
    if fmt.parser is not None:
        content, calls = fmt.parser.parse(message["content"])
        if calls:
            message["content"] = content
            message["tool_calls"] = [c.to_openai() for c in calls]
            finish = "tool_calls"
    logprobs = None if fmt.logprobs is None else {"content": fmt.logprobs.chat(event.meta)}
    return {
        "index": index,
        "message": message,
        "logprobs": logprobs,
        "finish_reason": finish,
        "matched_stop": matched_stop(event.finish_reason),
    }


@dataclass
class _ChoiceState:
    tools: Any = None  # the parser's StreamParser
    reasoning: ReasoningParser | None = None
    sent_logprobs: int = 0
    calls: int = 0
    started: bool = False  # its first chunk has gone out


async def chat_chunks(
    merged: AsyncIterator[tuple[int, StreamEvent]],
    head: dict[str, Any],
    num_choices: int,
    fmt: ChatFormat,
    final_usage: UsageOf | None = None,
) -> AsyncIterator[dict]:
    """SSE chunks of a chat stream: per choice a role chunk, sent with its first token (as
    SGLang and vLLM do: a client timing the first chunk measures the time to the first token),
    content / tool-call deltas (with their logprobs), an empty delta carrying the finish reason,
    then usage if asked for."""
    states = [
        _ChoiceState(
            fmt.parser.StreamParser() if fmt.parser else None,
            fmt.reasoning() if fmt.reasoning else None,
        )
        for _ in range(num_choices)
    ]
    finals: list[StreamEvent | None] = [None] * num_choices
    async for i, event in merged:
        state, finish = states[i], finish_reason(event.finish_reason)
        if not state.started:
            state.started = True
            yield _chunk(head, i, {"role": "assistant", "content": ""})
        content, calls = event.delta, []
        if state.reasoning is not None:
            reasoning, content = state.reasoning.feed(content, final=finish is not None)
            if reasoning:
                yield _chunk(head, i, {"reasoning_content": reasoning})
        if state.tools is not None:
            content, calls = state.tools.feed(content)
            if finish is not None:
                content += state.tools.finish()
                finish = "tool_calls" if state.tools.calls else finish
        logprobs = None
        if fmt.logprobs is not None:
            logprobs = {"content": fmt.logprobs.chat(event.meta, state.sent_logprobs)}
            state.sent_logprobs = len(event.meta.get("output_token_logprobs", ()))
        if content or (logprobs and logprobs["content"]):
            yield _chunk(head, i, {"content": content}, logprobs=logprobs)
        for call in calls:
            yield _chunk(head, i, {"tool_calls": [call.to_openai(index=state.calls)]})
            state.calls += 1
        if finish is not None:
            finals[i] = event
            yield _chunk(head, i, {}, finish=finish, matched=matched_stop(event.finish_reason))
    if final_usage is not None:
        yield {**head, "choices": [], "usage": final_usage([e for e in finals if e is not None])}


def _chunk(
    head: dict[str, Any],
    index: int,
    delta: dict,
    logprobs: Any = None,
    finish: str | None = None,
    matched: int | str | None = None,
) -> dict[str, Any]:
    """One choice's chunk. As in SGLang, every delta carries ``role``, ``content`` and
    ``reasoning_content`` (null where unset; clients read ``delta.reasoning_content``
    unguarded), ``tool_calls`` only when it has some."""
    delta = {"role": None, "content": None, "reasoning_content": None, **delta}
    choice = {
        "index": index,
        "delta": delta,
        "logprobs": logprobs,
        "finish_reason": finish,
        "matched_stop": matched,
    }
    return {**head, "choices": [choice]}
