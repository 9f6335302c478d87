"""What the OpenAI chat and completions handlers share: the sampling fields both accept, n > 1
choices, response heads (id, model, system fingerprint), usage and the whole-response path."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse

from sglang.srt.core.finish import FinishReason
from sglang.srt.core.io_struct import TokenizedRequest
from sglang.srt.entrypoints.http_utils import collect_all
from sglang.srt.entrypoints.openai.logprobs import LogprobFormatter
from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest
from sglang.srt.managers.parallel_sampling import Choices, start_choices
from sglang.srt.managers.tokenizer_manager import RequestError, StreamEvent, TokenizerManager
from sglang.srt.server_args import ServerArgs

UsageOf = Callable[[list[StreamEvent]], dict[str, Any]]


class OpenAIServingBase:
    def __init__(self, manager: TokenizerManager, args: ServerArgs) -> None:
        self.manager = manager
        self.args = args
        self.model_name = served_model_name(args)
        self.fingerprint = system_fingerprint(args)

    async def start_choices(self, tokenized: list[TokenizedRequest]) -> Choices:
        return await start_choices(
            self.manager.generate, tokenized, prefill=not self.args.disable_radix_cache
        )

    def logprob_formatter(self) -> LogprobFormatter:
        return LogprobFormatter(self.manager.token_text)

    def head(self, rid: str, kind: str) -> dict[str, Any]:
        return {
            "id": rid,
            "object": kind,
            "created": int(time.time()),
            "model": self.model_name,
            "system_fingerprint": self.fingerprint,
        }

    def usage(self, finals: list[StreamEvent], choices: Choices) -> dict[str, Any]:
        """Prompt tokens count once per prompt, whatever its n; completion tokens per choice."""
        first: dict[int, StreamEvent] = {}
        for prompt, event in zip(choices.prompt_of, finals):
            first.setdefault(prompt, event)
        prompt_tokens = sum(e.meta["prompt_tokens"] for e in first.values())
        completion = sum(e.meta["completion_tokens"] for e in finals)
        reasoning = sum(e.meta.get("reasoning_tokens", 0) for e in finals)
        out: dict[str, Any] = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion,
            "total_tokens": prompt_tokens + completion,
            "reasoning_tokens": reasoning,  # SGLang's place for it, always there
        }
        if reasoning:  # and OpenAI's, as SGLang sets it: only when there are some
            out["completion_tokens_details"] = {"reasoning_tokens": reasoning}
        if self.args.enable_cache_report:
            cached = sum(
                choices.prefill_cached.get(p, e.meta["cached_tokens"]) for p, e in first.items()
            )
            out["prompt_tokens_details"] = {"cached_tokens": cached}
            mm_items = [item for e in first.values() for item in e.meta.get("mm_items", ())]
            if mm_items:  # where each image's or video's embedding came from
                out["prompt_tokens_details"]["mm_items"] = mm_items
        return out

    def stream_usage(
        self, body: ChatCompletionRequest | CompletionRequest, choices: Choices
    ) -> UsageOf | None:
        """The usage callback of a stream that asked for ``stream_options.include_usage``."""
        if not (body.stream_options and body.stream_options.include_usage):
            return None
        return lambda finals: self.usage(finals, choices)

    async def respond_whole(
        self,
        rid: str,
        kind: str,
        choices: Choices,
        request: Request,
        choice_of: Callable[[int, StreamEvent], dict[str, Any]],
    ) -> JSONResponse:
        """The non-streaming answer: every choice run to its end, then the response."""
        finals = await collect_all(choices.streams, request)
        return JSONResponse(
            {
                **self.head(rid, kind),
                "choices": [choice_of(i, event) for i, event in enumerate(finals)],
                "usage": self.usage(finals, choices),
            }
        )


def served_model_name(args: ServerArgs) -> str:
    return args.served_model_name or args.model_path or "default"


def system_fingerprint(args: ServerArgs) -> str:
    """Names the serving configuration, as OpenAI does next to ``seed``: same fingerprint, same
    seed and same parameters give the same sampled output."""
    key = f"{args.model_path}|{args.dtype}|{args.resolved_device}|{args.random_seed}"
    return "fp_" + hashlib.sha256(key.encode()).hexdigest()[:10]


def extra_sampling(
    body: ChatCompletionRequest | CompletionRequest, params: dict[str, Any]
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
    return params


def finish_reason(reason: FinishReason | None) -> str | None:
    return None if reason is None else reason.kind


def matched_stop(reason: FinishReason | None) -> int | str | None:
    """SGLang's ``matched_stop`` of a choice: the stop string or token id that ended it (EOS
    included), else None."""
    return None if reason is None else reason.matched
