"""The OpenAI surface beyond plain text: structured outputs (``response_format``), tools,
``logit_bias``, ``logprobs``, ``n`` > 1, ``seed`` and the response / chunk formats built from
scheduler events. The HTTP routes stay thin: they call into this module."""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from sglang.srt.core.finish import FinishReason
from sglang.srt.core.io_struct import TokenizedRequest
from sglang.srt.entrypoints.protocol import ChatCompletionRequest, CompletionRequest
from sglang.srt.entrypoints.reasoning_parser import ReasoningParser
from sglang.srt.managers.parallel_sampling import prefill_request, sample_copies
from sglang.srt.managers.tokenizer_manager import RequestError, StreamEvent, TokenizerManager
from sglang.srt.server_args import ServerArgs


# Request side --------------------------------------------------------------------------------
def active_tools(body: ChatCompletionRequest) -> list[dict[str, Any]] | None:
    """The tools the template shows the model (none with ``tool_choice: "none"``)."""
    if not body.tools or body.tool_choice == "none":
        return None
    return [tool.model_dump(exclude_none=True) for tool in body.tools]


def extra_sampling(
    body: ChatCompletionRequest | CompletionRequest,
    params: dict[str, Any],
    parser: ModuleType | None = None,
) -> dict[str, Any]:
    """Add the OpenAI fields that become SGLang sampling params to ``params``."""
    if body.logit_bias:
        params["logit_bias"] = body.logit_bias
    if body.include_stop_str_in_output or body.no_stop_trim:
        params["no_stop_trim"] = True
    for kind in ("regex", "ebnf"):
        if getattr(body, kind) is not None:
            params[kind] = getattr(body, kind)
    fmt = body.response_format
    if fmt is not None and fmt.type == "json_object":
        params["json_schema"] = json.dumps({"type": "object"})
    elif fmt is not None and fmt.type == "json_schema":
        if fmt.json_schema is None or fmt.json_schema.schema_ is None:
            raise RequestError("response_format.json_schema.schema is required")
        params["json_schema"] = json.dumps(fmt.json_schema.schema_)
    if isinstance(body, ChatCompletionRequest):
        _tool_choice_grammar(body, params, parser)
    return params


def _tool_choice_grammar(
    body: ChatCompletionRequest, params: dict[str, Any], parser: ModuleType | None
) -> None:
    choice = body.tool_choice
    if choice is None or choice in ("none", "auto"):  # clients send "auto" without tools too
        return
    if not body.tools:
        raise RequestError("tool_choice needs tools")
    if parser is None:
        raise RequestError(
            "tool_choice 'required' or a named function needs the server to run with "
            "--tool-call-parser"
        )
    tools = active_tools(body) or []
    choice_value: str | dict[str, Any] = choice if isinstance(choice, str) else choice.model_dump()
    if isinstance(choice_value, dict):
        name = choice_value["function"]["name"]
        if name not in {t["function"]["name"] for t in tools}:
            raise RequestError(f"tool_choice names function {name!r}, which is not in tools")
    tag = parser.structural_tag(tools, choice_value, body.parallel_tool_calls)
    params["structural_tag"] = json.dumps(tag)


# n > 1 ---------------------------------------------------------------------------------------
@dataclass
class Choices:
    """The streams of all choices; ``prompt_of[i]`` is the prompt index of stream i."""

    streams: list[AsyncIterator[StreamEvent]]
    prompt_of: list[int]
    prefill_cached: dict[int, int] = field(default_factory=dict)  # prompt -> cached tokens


async def start_choices(
    manager: TokenizerManager, tokenized: list[TokenizedRequest], args: ServerArgs
) -> Choices:
    """One stream per choice. A prompt with n > 1 is first prefilled once, so its n choices
    share the prompt's KV through the radix cache (and its images are encoded once)."""
    parallel = [i for i, t in enumerate(tokenized) if t.sampling_params.n > 1]
    prefilled: dict[int, int] = {}
    if parallel and not args.disable_radix_cache:
        finals = await asyncio.gather(
            *(last_event(manager.generate(prefill_request(tokenized[i]))) for i in parallel)
        )
        prefilled = {i: e.meta["cached_tokens"] for i, e in zip(parallel, finals)}
    streams, prompt_of = [], []
    for i, t in enumerate(tokenized):
        for copy in sample_copies(t) if t.sampling_params.n > 1 else [t]:
            streams.append(manager.generate(copy))
            prompt_of.append(i)
    return Choices(streams, prompt_of, prefilled)


async def last_event(stream: AsyncIterator[StreamEvent]) -> StreamEvent:
    """Run a request's stream to its end; its final event."""
    event = None
    async for event in stream:  # noqa: B007
        pass
    assert event is not None
    return event


def usage(finals: list[StreamEvent], choices: Choices, args: ServerArgs) -> dict[str, Any]:
    """Prompt tokens count once per prompt, whatever its n; completion tokens per choice."""
    first: dict[int, StreamEvent] = {}
    for prompt, event in zip(choices.prompt_of, finals):
        first.setdefault(prompt, event)
    prompt_tokens = sum(e.meta["prompt_tokens"] for e in first.values())
    completion = sum(e.meta["completion_tokens"] for e in finals)
    out: dict[str, Any] = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": prompt_tokens + completion,
    }
    if args.enable_cache_report:
        cached = sum(
            choices.prefill_cached.get(p, e.meta["cached_tokens"]) for p, e in first.items()
        )
        out["prompt_tokens_details"] = {"cached_tokens": cached}
    return out


def system_fingerprint(args: ServerArgs) -> str:
    """Names the serving configuration, as OpenAI does next to ``seed``: same fingerprint, same
    seed and same parameters give the same sampled output."""
    key = f"{args.model_path}|{args.dtype}|{args.resolved_device}|{args.random_seed}"
    return "fp_" + hashlib.sha256(key.encode()).hexdigest()[:10]


# Logprobs ------------------------------------------------------------------------------------
class LogprobFormatter:
    """OpenAI logprob entries from the scheduler's ``(logprob, token id, _)`` lists. With
    ``skip_special_tokens``, the tokens that the text's decode skips (``skipped_token_ids``: EOS,
    chat and vision markers) are skipped here too, so the entries spell the text."""

    def __init__(
        self,
        token_text: Callable[[int], str],
        skip_special_tokens: bool,
        skipped_ids: frozenset[int],
    ) -> None:
        self.token = token_text  # the tokenizer manager's cached one-token decode
        self.skip = skipped_ids if skip_special_tokens else frozenset()

    def _rows(self, meta: dict[str, Any], start: int) -> list[tuple[float, int, list]]:
        chosen = meta.get("output_token_logprobs", [])[start:]
        tops = meta.get("output_top_logprobs", [])[start:] or [[] for _ in chosen]
        return [(lp, tok, top) for (lp, tok, _), top in zip(chosen, tops) if tok not in self.skip]

    def chat(self, meta: dict[str, Any], start: int = 0) -> list[dict[str, Any]]:
        return [
            {
                **self._entry(lp, tok),
                "top_logprobs": [self._entry(t_lp, t_tok) for t_lp, t_tok, _ in top],
            }
            for lp, tok, top in self._rows(meta, start)
        ]

    def _entry(self, logprob: float, token_id: int) -> dict[str, Any]:
        text = self.token(token_id)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode())}

    def completion(
        self, meta: dict[str, Any], start: int, offset: int, top: int
    ) -> tuple[dict[str, Any], int]:
        """The completions ``logprobs`` object for tokens from ``start``; text offsets count on
        from ``offset``. Returns it and the offset after it."""
        out: dict[str, Any] = {
            "tokens": [],
            "token_logprobs": [],
            "top_logprobs": [],
            "text_offset": [],
        }
        for lp, tok, alternatives in self._rows(meta, start):
            text = self.token(tok)
            out["tokens"].append(text)
            out["token_logprobs"].append(lp)
            out["text_offset"].append(offset)
            out["top_logprobs"].append({self.token(t): t_lp for t_lp, t, _ in alternatives})
            offset += len(text)
        if not top:
            out["top_logprobs"] = None
        return out, offset

    def prompt(self, meta: dict[str, Any], top: int) -> dict[str, Any]:
        """The completions ``logprobs`` object of an echoed prompt (``echo`` with ``logprobs``):
        every prompt token, the first one with a null logprob, as OpenAI's legacy API."""
        chosen = meta.get("input_token_logprobs", [])
        tops = meta.get("input_top_logprobs") or [None] * len(chosen)
        out: dict[str, Any] = {
            "tokens": [],
            "token_logprobs": [],
            "top_logprobs": [],
            "text_offset": [],
        }
        offset = 0
        for (lp, tok, _), alternatives in zip(chosen, tops):
            text = self.token(tok)
            out["tokens"].append(text)
            out["token_logprobs"].append(lp)
            out["text_offset"].append(offset)
            if alternatives is not None:
                alternatives = {self.token(t): t_lp for t_lp, t, _ in alternatives}
            out["top_logprobs"].append(alternatives)
            offset += len(text)
        if not top:
            out["top_logprobs"] = None
        return out


def _joined(first: dict[str, Any], second: dict[str, Any]) -> dict[str, Any]:
    """Two completions ``logprobs`` objects, one after the other."""
    return {k: None if first[k] is None else first[k] + second[k] for k in first}


# Responses -----------------------------------------------------------------------------------
def finish_reason(reason: FinishReason | None) -> str | None:
    return None if reason is None else reason.kind


@dataclass
class ChatFormat:
    """What shapes a chat answer: the tool-call parser (when tools are active), logprobs, and
    (with --reasoning-parser) a maker of per-choice reasoning splitters, applied first."""

    parser: ModuleType | None
    logprobs: LogprobFormatter | None
    reasoning: Callable[[], ReasoningParser] | None = None


def chat_choice(index: int, event: StreamEvent, fmt: ChatFormat) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": event.text}
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
    return {"index": index, "message": message, "logprobs": logprobs, "finish_reason": finish}


def completion_choice(
    index: int, event: StreamEvent, echo: str, fmt: LogprobFormatter | None, top: int
) -> dict[str, Any]:
    logprobs = None
    if fmt is not None:
        logprobs, _ = fmt.completion(event.meta, 0, len(echo), top)
        if echo:
            logprobs = _joined(fmt.prompt(event.meta, top), logprobs)
    return {
        "index": index,
        "text": echo + event.text,
        "logprobs": logprobs,
        "finish_reason": finish_reason(event.finish_reason),
    }


@dataclass
class _ChoiceState:
    tools: Any = None  # the parser's StreamParser
    reasoning: ReasoningParser | None = None
    sent_logprobs: int = 0
    calls: int = 0
    offset: int = 0
    started: bool = False  # its first chunk has gone out


async def chat_chunks(
    merged: AsyncIterator[tuple[int, StreamEvent]],
    head: dict[str, Any],
    num_choices: int,
    fmt: ChatFormat,
    final_usage: Any = None,
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
            yield _chunk(head, i, {}, finish=finish)
    if final_usage is not None:
        yield {**head, "choices": [], "usage": final_usage([e for e in finals if e is not None])}


async def completion_chunks(
    merged: AsyncIterator[tuple[int, StreamEvent]],
    head: dict[str, Any],
    echoes: list[str],
    fmt: LogprobFormatter | None,
    top: int,
    final_usage: Any = None,
) -> AsyncIterator[dict]:
    """SSE chunks of a completion stream. An echoed prompt goes out with the choice's first
    token (no chunk precedes it), and with the prompt's logprobs, which that output brings."""
    states = [_ChoiceState() for _ in echoes]
    finals: list[StreamEvent | None] = [None] * len(echoes)
    async for i, event in merged:
        state, finish = states[i], finish_reason(event.finish_reason)
        if not state.started:
            state.started = True
            if echoes[i]:
                echo_logprobs = None if fmt is None else fmt.prompt(event.meta, top)
                yield _completion_chunk(head, i, echoes[i], echo_logprobs, None)
                state.offset = len(echoes[i])
        logprobs = None
        if fmt is not None:
            logprobs, state.offset = fmt.completion(
                event.meta, state.sent_logprobs, state.offset, top
            )
            state.sent_logprobs = len(event.meta.get("output_token_logprobs", ()))
        if event.delta or finish is not None or (logprobs and logprobs["tokens"]):
            yield _completion_chunk(head, i, event.delta, logprobs, finish)
        if finish is not None:
            finals[i] = event
    if final_usage is not None:
        yield {**head, "choices": [], "usage": final_usage([e for e in finals if e is not None])}


def _chunk(
    head: dict[str, Any], index: int, delta: dict, logprobs: Any = None, finish: str | None = None
) -> dict[str, Any]:
    choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
    return {**head, "choices": [choice]}


def _completion_chunk(
    head: dict[str, Any], index: int, text: str, logprobs: Any, finish: str | None
) -> dict[str, Any]:
    choice = {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish}
    return {**head, "choices": [choice]}
