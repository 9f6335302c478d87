"""OpenAI ``POST /v1/completions``: prompts (text or token ids) -> choices, streamed or whole,
with ``echo`` and legacy ``logprobs``."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from fastapi import Request
from fastapi.responses import Response

from sglang.srt.core.io_struct import (
    TokenizedRequest,
    processors_per_request,
    salts_per_request,
)
from sglang.srt.entrypoints.http_utils import merge_streams, parse_body, sse_response
from sglang.srt.entrypoints.openai.logprobs import LogprobFormatter, joined
from sglang.srt.entrypoints.openai.protocol import (
    UNIMPLEMENTED_COMPLETION_FIELDS,
    CompletionRequest,
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
from sglang.srt.managers.inputs import split_generate_inputs
from sglang.srt.managers.parallel_sampling import Choices
from sglang.srt.managers.tokenizer_manager import StreamEvent


class OpenAIServingCompletion(OpenAIServingBase):
    body_model = CompletionRequest

    async def handle(self, request: Request) -> Response:
        body = await parse_body(request, CompletionRequest)
        reject_unimplemented(body, UNIMPLEMENTED_COMPLETION_FIELDS)
        prompts, ids = split_prompt(body.prompt)
        params = extra_sampling(body, sampling_dict(body, body.max_tokens))
        inputs, _ = split_generate_inputs(prompts, params, ids, None, body.rid)
        salts = salts_per_request(body.cache_salt, len(inputs))
        enabled = self.args.enable_custom_logit_processor
        processors = processors_per_request(body.custom_logit_processor, len(inputs), enabled)
        tokenized = await asyncio.gather(*(self.manager.tokenize(inp) for inp in inputs))
        for t, salt, processor in zip(tokenized, salts, processors):
            t.ask_logprobs(body.logprobs, 0 if body.echo else -1)  # echo: the prompt's too
            t.cache_salt, t.custom_logit_processor = salt, processor
        choices = await self.start_choices(list(tokenized))
        echoes = self._echoes(body, prompts, list(tokenized), choices)
        fmt = None
        if body.logprobs is not None:
            fmt = self.logprob_formatter()
        top = body.logprobs or 0
        rid = f"cmpl-{uuid.uuid4().hex}"
        if body.stream:
            head = self.head(rid, "text_completion")
            usage = self.stream_usage(body, choices)
            chunks = completion_chunks(
                merge_streams(choices.streams), head, echoes, fmt, top, usage
            )
            return sse_response(chunks, request)
        return await self.respond_whole(
            rid,
            "text_completion",
            choices,
            request,
            lambda i, event: completion_choice(i, event, echoes[i], fmt, top),
        )

    def _echoes(
        self,
        body: CompletionRequest,
        prompts: list[str] | None,
        tokenized: list[TokenizedRequest],
        choices: Choices,
    ) -> list[str]:
        """The text each choice starts with: its prompt under ``echo``, else nothing."""
        if not body.echo:
            return [""] * len(choices.streams)
        if prompts is None:
            decode = self.manager.tokenizer.decode
            return [decode(tokenized[p].input_ids) for p in choices.prompt_of]
        return [prompts[p] for p in choices.prompt_of]


def split_prompt(
    prompt: str | list[str] | list[int] | list[list[int]],
) -> tuple[list[str] | None, list[list[int]] | None]:
    """The prompts as texts, or as token id lists (one list, or a list of them)."""
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], int):
        return None, [prompt]  # type: ignore[list-item]
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], list):
        return None, prompt  # type: ignore[return-value]
    return ([prompt] if isinstance(prompt, str) else prompt), None  # type: ignore[return-value]


def completion_choice(
    index: int, event: StreamEvent, echo: str, fmt: LogprobFormatter | None, top: int
) -> dict[str, Any]:
    logprobs = None
    if fmt is not None:
        logprobs, _ = fmt.completion(event.meta, 0, len(echo), top)
        if echo:
            logprobs = joined(fmt.prompt(event.meta, top), logprobs)
    return {
        "index": index,
        "text": echo + event.text,
        "logprobs": logprobs,
        "finish_reason": finish_reason(event.finish_reason),
        "matched_stop": matched_stop(event.finish_reason),
    }


@dataclass
class _ChoiceState:
    sent_logprobs: int = 0
    offset: int = 0
    started: bool = False  # its first chunk has gone out


async def completion_chunks(
    merged: AsyncIterator[tuple[int, StreamEvent]],
    head: dict[str, Any],
    echoes: list[str],
    fmt: LogprobFormatter | None,
    top: int,
    final_usage: UsageOf | None = None,
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
                yield _chunk(head, i, echoes[i], echo_logprobs, None)
                state.offset = len(echoes[i])
        logprobs = None
        if fmt is not None:
            logprobs, state.offset = fmt.completion(
                event.meta, state.sent_logprobs, state.offset, top
            )
            state.sent_logprobs = len(event.meta.get("output_token_logprobs", ()))
            if not logprobs["tokens"]:  # no new token here (held text, the finish): SGLang's null
                logprobs = None
        if event.delta or finish is not None or logprobs:
            yield _chunk(head, i, event.delta, logprobs, finish, matched_stop(event.finish_reason))
        if finish is not None:
            finals[i] = event
    if final_usage is not None:
        yield {**head, "choices": [], "usage": final_usage([e for e in finals if e is not None])}


def _chunk(
    head: dict[str, Any],
    index: int,
    text: str,
    logprobs: Any,
    finish: str | None,
    matched: int | str | None = None,
) -> dict[str, Any]:
    choice = {
        "index": index,
        "text": text,
        "logprobs": logprobs,
        "finish_reason": finish,
        "matched_stop": matched,
    }
    return {**head, "choices": [choice]}
