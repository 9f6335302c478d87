"""The API process's side of a request: inputs -> TokenizedRequest -> scheduler, and the
scheduler's token stream -> incremental text."""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import zmq
import zmq.asyncio

from sglang.srt.entrypoints.engine import decode_output
from sglang.srt.managers.inputs import GenerateInput, tokenize
from sglang.srt.managers.io_struct import (
    AbortRequest,
    BatchOutput,
    RequestOutput,
    RpcRequest,
    RpcResponse,
    TokenizedRequest,
)
from sglang.srt.multimodal.media_fetch import allowed_local_dir, fetch_image_source
from sglang.srt.multimodal.processor import MultimodalProcessor
from sglang.srt.server_args import ServerArgs

logger = logging.getLogger(__name__)


class RequestError(ValueError):
    """A request the server rejects; ``status_code`` is the HTTP status to answer with."""

    def __init__(self, message: str, status_code: int = 400) -> None:
        super().__init__(message)
        self.status_code = status_code


@dataclass
class ReqState:
    request: TokenizedRequest
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[list[tuple[float, int]]] = field(default_factory=list)
    created: float = field(default_factory=time.perf_counter)
    first_token_time: float | None = None
    last_token_time: float | None = None
    finished: bool = False


@dataclass
class StreamEvent:
    """What a caller sees after each scheduler output of its request."""

    text: str  # text so far (held back near possible stop strings until finished)
    delta: str
    output_ids: list[int]
    finish_reason: dict[str, Any] | None
    meta: dict[str, Any]


class TokenizerManager:
    def __init__(self, args: ServerArgs, model_path: str, ready: Any, scheduler_addrs: tuple):
        self.args = args
        self.model_path = model_path
        self.context_length: int = ready.context_length
        self.model_type: str = ready.model_type
        self.processor = MultimodalProcessor(
            model_path, _load_config(model_path), allowed_local_dir(args)
        )
        self.tokenizer = self.processor.tokenizer
        self.is_multimodal = self.processor.is_multimodal
        self._ctx = zmq.asyncio.Context()
        self._to_scheduler = self._ctx.socket(zmq.PUSH)
        self._to_scheduler.connect(scheduler_addrs[0])
        self._from_scheduler = self._ctx.socket(zmq.PULL)
        self._from_scheduler.bind(scheduler_addrs[1])
        self._states: dict[str, ReqState] = {}
        self._rpcs: dict[int, asyncio.Future] = {}
        self._call_ids = itertools.count()
        self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="mm-process")
        self._loop_task: asyncio.Task | None = None
        self.metrics: Any = None  # set by the HTTP server under --enable-metrics

    async def start(self) -> None:
        self._loop_task = asyncio.create_task(self._receive_loop())

    # Requests ----------------------------------------------------------------------------------
    async def tokenize(self, inp: GenerateInput, return_logprob: bool = False) -> TokenizedRequest:
        limit = self.args.image_limit
        if limit is not None and len(inp.images) > limit:
            raise RequestError(f"{len(inp.images)} images in one request; the limit is {limit}")
        if inp.images and not self.is_multimodal:
            raise RequestError("this model does not accept images")
        sources = [await fetch_image_source(ref, self.args) for ref in inp.images]
        loop = asyncio.get_running_loop()
        tokenized = await loop.run_in_executor(
            self._pool, self._tokenize_sync, inp, sources, return_logprob
        )
        prompt_len = len(tokenized.input_ids)
        if prompt_len >= self.context_length:
            raise RequestError(
                f"the prompt has {prompt_len} tokens, more than the context length allows "
                f"({self.context_length}, leaving room for at least one new token)"
            )
        return tokenized

    def _tokenize_sync(self, inp: GenerateInput, sources: list, return_logprob: bool):
        images = self.processor.load_images(sources)
        tokenized = tokenize(self.processor, self.args, inp, images, return_logprob)
        for item, img in zip(tokenized.mm_items, images):
            if img.data is not None:
                item.source = img.data  # ship the encoded bytes, not decoded pixels
        return tokenized

    async def generate(self, tokenized: TokenizedRequest) -> AsyncIterator[StreamEvent]:
        """Send a request and yield its progress; aborts it if the caller stops listening."""
        state = ReqState(tokenized)
        self._states[tokenized.rid] = state
        await self._to_scheduler.send_pyobj(tokenized)
        stops = tokenized.sampling_params.stop or []
        hold = max((len(s) for s in stops), default=1) - 1
        sent_text = ""
        try:
            while True:
                out: RequestOutput = await state.queue.get()
                if out.finish_reason and out.finish_reason.get("status_code") == 400:
                    raise RequestError(out.finish_reason.get("message", "bad request"))
                state.output_ids += out.new_token_ids
                state.logprobs += out.new_logprobs
                state.top_logprobs += out.new_top_logprobs
                text = decode_output(
                    self.tokenizer,
                    state.output_ids,
                    tokenized.sampling_params.skip_special_tokens,
                    out.finish_reason,
                    tokenized.sampling_params.no_stop_trim,
                )
                if out.finish_reason is None:
                    # Hold back what may still turn into a stop string or a multi-byte char.
                    text = text[: len(text) - hold].rstrip("\ufffd")
                delta = text[len(sent_text) :] if text.startswith(sent_text) else ""
                sent_text = sent_text + delta
                state.finished = out.finish_reason is not None
                yield StreamEvent(
                    text if state.finished else sent_text,
                    delta,
                    list(state.output_ids),
                    out.finish_reason,
                    self._meta(state, out),
                )
                if state.finished:
                    return
        finally:
            self._states.pop(tokenized.rid, None)
            if not state.finished:
                await self.abort(tokenized.rid)

    def _meta(self, state: ReqState, out: RequestOutput) -> dict[str, Any]:
        meta: dict[str, Any] = {
            "id": state.request.rid,
            "finish_reason": out.finish_reason,
            "prompt_tokens": out.prompt_tokens,
            "completion_tokens": out.completion_tokens,
            "cached_tokens": out.cached_tokens,
            "e2e_latency": time.perf_counter() - state.created,
        }
        if state.request.return_logprob:
            meta["output_token_logprobs"] = [
                (lp, tok, None) for lp, tok in zip(state.logprobs, state.output_ids)
            ]
            if state.request.top_logprobs_num:
                meta["output_top_logprobs"] = [
                    [(lp, tok, None) for lp, tok in top] for top in state.top_logprobs
                ]
        return meta

    async def abort(self, rid: str) -> None:
        await self._to_scheduler.send_pyobj(AbortRequest(rid))

    # Control -----------------------------------------------------------------------------------
    async def rpc(self, method: str, timeout: float = 60.0) -> Any:
        call_id = next(self._call_ids)
        future = asyncio.get_running_loop().create_future()
        self._rpcs[call_id] = future
        await self._to_scheduler.send_pyobj(RpcRequest(call_id, method))
        try:
            response: RpcResponse = await asyncio.wait_for(future, timeout)
        finally:
            self._rpcs.pop(call_id, None)
        if response.error:
            raise RuntimeError(response.error)
        return response.result

    async def _receive_loop(self) -> None:
        while True:
            msg = await self._from_scheduler.recv_pyobj()
            if isinstance(msg, RpcResponse):
                future = self._rpcs.get(msg.call_id)
                if future is not None and not future.done():
                    future.set_result(msg)
                continue
            assert isinstance(msg, BatchOutput)
            now = time.perf_counter()
            for out in msg.outputs:
                state = self._states.get(out.rid)
                if state is None:
                    continue
                if self.metrics is not None:
                    self.metrics.observe(state, out, now)
                state.queue.put_nowait(out)

    def close(self) -> None:
        if self._loop_task is not None:
            self._loop_task.cancel()
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._ctx.destroy(linger=0)


def _load_config(model_path: str) -> Any:
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(model_path)
