"""SGLang's native ``POST /generate``: one prompt or a batch, n > 1 fanned out, streamed or
answered whole."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from sglang.srt.core.io_struct import (
    TokenizedRequest,
    processors_per_request,
    salts_per_request,
    token_ids_per_request,
)
from sglang.srt.entrypoints.http_utils import (
    EventStream,
    collect_all,
    merge_streams,
    parse_body,
    sse_response,
)
from sglang.srt.entrypoints.openai.protocol import (
    UNIMPLEMENTED_GENERATE_FIELDS,
    GenerateRequest,
    reject_unimplemented,
)
from sglang.srt.managers.inputs import split_generate_inputs
from sglang.srt.managers.parallel_sampling import start_choices
from sglang.srt.managers.tokenizer_manager import StreamEvent, TokenizerManager
from sglang.srt.server_args import ServerArgs


class GenerateHandler:
    body_model = GenerateRequest

    def __init__(self, manager: TokenizerManager, args: ServerArgs) -> None:
        self.manager = manager
        self.prefill_for_n = not args.disable_radix_cache
        self.custom_processors = args.enable_custom_logit_processor

    async def handle(self, request: Request) -> Response:
        body = await parse_body(request, GenerateRequest)
        reject_unimplemented(body, UNIMPLEMENTED_GENERATE_FIELDS)
        tokenized, batched = await self._tokenize(body)
        choices = await start_choices(self.manager.generate, tokenized, self.prefill_for_n)
        batched = batched or len(choices.streams) > len(tokenized)  # n > 1 answers with a list
        if body.stream:
            return sse_response(_chunks(choices.streams, batched), request)
        outs = [_output(event) for event in await collect_all(choices.streams, request)]
        return JSONResponse(outs if batched else outs[0])

    async def _tokenize(self, body: GenerateRequest) -> tuple[list[TokenizedRequest], bool]:
        """The body's requests, tokenized, with the logprobs they ask for; and whether the body
        is a batch."""
        inputs, batched = split_generate_inputs(
            body.text,
            body.sampling_params,
            body.input_ids,
            body.image_data,
            body.rid,
            body.video_data,
            body.mm_processor_kwargs,
        )
        token_ids = token_ids_per_request(body.token_ids_logprob, len(inputs))
        salts = salts_per_request(body.cache_salt, len(inputs))
        processors = processors_per_request(
            body.custom_logit_processor, len(inputs), self.custom_processors
        )
        tokenized = await asyncio.gather(*(self.manager.tokenize(inp) for inp in inputs))
        top = body.top_logprobs_num if body.return_logprob else None
        for t, ids, salt, processor in zip(tokenized, token_ids, salts, processors):
            t.ask_logprobs(top, body.logprob_start_len, ids)
            t.cache_salt, t.custom_logit_processor = salt, processor
            t.return_text_in_logprobs = body.return_text_in_logprobs
            t.require_reasoning = body.require_reasoning
        return list(tokenized), batched


async def _chunks(streams: list[EventStream], batched: bool) -> AsyncIterator[dict]:
    async for i, event in merge_streams(streams):
        out = _output(event)
        if batched:
            out["index"] = i
        yield out


def _output(event: StreamEvent) -> dict:
    return {"text": event.text, "output_ids": event.output_ids, "meta_info": event.meta}
