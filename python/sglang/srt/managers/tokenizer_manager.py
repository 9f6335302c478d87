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

from sglang.srt.core.finish import FinishReason, finish_json
from sglang.srt.core.io_struct import (
    AbortRequest,
    BatchOutput,
    RequestOutput,
    RpcRequest,
    RpcResponse,
    TokenizedRequest,
    input_logprob_meta,
    logprob_meta,
    output_logprob_meta,
)
from sglang.srt.layers.pooling_config import PoolingConfig, read_pooling_config
from sglang.srt.managers.detokenizer import IncrementalDetokenizer
from sglang.srt.managers.inputs import GenerateInput, check_mm_limits, tokenize
from sglang.srt.managers.reasoning_tokens import ReasoningTokenCounter, reasoning_tag_ids
from sglang.srt.multimodal.media_fetch import (
    fetch_image_source,
    fetch_video_source,
)
from sglang.srt.multimodal.processor import MultimodalProcessor
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.sampling.stop_strings import skipped_token_ids
from sglang.srt.server_args import ServerArgs

logger = logging.getLogger(__name__)


class RequestError(ValueError):
    """A request the server rejects; ``status_code`` is the HTTP status to answer with."""

    def __init__(self, message: str, status_code: int = 400) -> None:
        super().__init__(message)
        self.status_code = status_code


def check_context_length(prompt_len: int, params: SamplingParams, context_length: int) -> None:
    """SGLang's two length checks, in its words: the prompt must leave room for one new token,
    and a ``max_new_tokens`` the request gave must fit beside the prompt (a default one is cut
    to what is left)."""
    if prompt_len >= context_length:
        raise RequestError(
            f"The input ({prompt_len} tokens) is longer than the model's context length "
            f"({context_length} tokens)."
        )
    total = prompt_len + params.max_new_tokens
    if params.max_new_tokens_given and total > context_length:
        raise RequestError(
            "Requested token count exceeds the model's maximum context length of "
            f"{context_length} tokens. You requested a total of {total} tokens: {prompt_len} "
            f"tokens from the input messages and {params.max_new_tokens} tokens for the "
            "completion. Please reduce the number of tokens in the input messages or the "
            "completion to fit within the limit."
        )


@dataclass
class ReqState:
    request: TokenizedRequest
    detokenizer: IncrementalDetokenizer  # the output ids so far and their text
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    # Logprob meta, extended by each output (every event's meta shares these lists, so a
    # stream of n tokens builds n entries, not n^2 / 2) and the prompt's, built once.
    output_meta: dict[str, list] = field(default_factory=dict)
    input_meta: dict[str, Any] = field(default_factory=dict)
    created: float = field(default_factory=time.perf_counter)
    first_token_time: float | None = None
    last_token_time: float | None = None
    finished: bool = False
    reasoning: ReasoningTokenCounter | None = None  # with --reasoning-parser


@dataclass
class StreamEvent:
    """What a caller sees after each scheduler output of its request."""

    text: str  # text so far (held back near possible stop strings until finished)
    delta: str
    output_ids: list[int]
    finish_reason: FinishReason | None
    meta: dict[str, Any]
    embedding: list[float] | None = None  # a pooling request's pooled vector (its last event)


SCHEDULER_POLL_S = 0.5


class TokenizerManager:
    """Owns the API process's side of every request. Watches the scheduler process: when it
    dies, in-flight and new requests fail at once (503) and ``on_fatal`` is called so the
    server can exit non-zero."""

    def __init__(
        self,
        args: ServerArgs,
        model_path: str,
        processor: MultimodalProcessor,
        ready: Any,
        scheduler_addrs: tuple,
        scheduler_proc: Any = None,
    ):
        self.args = args
        self.model_path = model_path
        self.context_length: int = ready.context_length
        self.model_type: str = ready.model_type
        self.processor = processor
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
        self._watch_task: asyncio.Task | None = None
        self.metrics: Any = None  # set by the HTTP server under --enable-metrics
        self.scheduler_proc = scheduler_proc
        self.fatal_error: str | None = None  # set once the scheduler is gone
        self.on_fatal: Any = None  # called once with the error, e.g. to stop the HTTP server
        self.max_token_chars = _max_token_chars(self.tokenizer)
        self.skipped_ids = skipped_token_ids(self.tokenizer)  # what skip_special_tokens drops
        self._token_texts: dict[int, str] = {}
        self.reasoning_tags = reasoning_tag_ids(self.tokenizer, args.reasoning_parser)
        self._resumed = asyncio.Event()  # cleared by /pause_generation: new requests wait
        self._resumed.set()
        # The model's pooling (None: it serves no embeddings or scores).
        self.pooling: PoolingConfig | None = None
        if args.serves_pooling:
            self.pooling = read_pooling_config(model_path, self.tokenizer, args.pooling_method)

    async def start(self) -> None:
        self._loop_task = asyncio.create_task(self._receive_loop())
        if self.scheduler_proc is not None:
            self._watch_task = asyncio.create_task(self._watch_scheduler())

    @property
    def alive(self) -> bool:
        return self.fatal_error is None

    def _check_alive(self) -> None:
        if self.fatal_error is not None:
            raise RequestError(self.fatal_error, status_code=503)

    async def _watch_scheduler(self) -> None:
        while self.scheduler_proc.is_alive():
            await asyncio.sleep(SCHEDULER_POLL_S)
        self.fail(
            f"the scheduler process exited (code {self.scheduler_proc.exitcode}); "
            "the server is shutting down"
        )

    def fail(self, message: str) -> None:
        """Fail every in-flight request and control call, refuse new ones, call ``on_fatal``."""
        if self.fatal_error is not None:
            return
        logger.error("%s", message)
        self.fatal_error = message
        self._fail_inflight(message)
        if self.on_fatal is not None:
            self.on_fatal(message)

    def _fail_inflight(self, message: str) -> None:
        for rid, state in self._states.items():
            state.queue.put_nowait(RequestOutput.failed(rid, message, 503))
        for future in self._rpcs.values():
            if not future.done():
                future.set_exception(RequestError(message, status_code=503))

    # Requests ----------------------------------------------------------------------------------
    async def tokenize(self, inp: GenerateInput) -> TokenizedRequest:
        self._check_alive()
        self._check_length_cheaply(inp)
        try:
            check_mm_limits(self.args, len(inp.images), len(inp.videos))
        except ValueError as exc:
            raise RequestError(str(exc)) from None
        if inp.images and not self.is_multimodal:
            raise RequestError("this model does not accept images")
        if inp.videos and not self.is_multimodal:
            raise RequestError("this model does not accept videos")
        try:  # before any video is fetched
            for options in inp.video_options:
                self.processor.video_settings.with_options(options)
        except ValueError as exc:
            raise RequestError(str(exc)) from None
        sources = [await fetch_image_source(ref, self.args.fetch_policy) for ref in inp.images]
        videos = [await fetch_video_source(ref, self.args.fetch_policy) for ref in inp.videos]
        loop = asyncio.get_running_loop()
        tokenized = await loop.run_in_executor(
            self._pool, self._tokenize_sync, inp, sources, videos
        )
        prompt_len = len(tokenized.input_ids)
        check_context_length(prompt_len, tokenized.sampling_params, self.context_length)
        return tokenized

    def _check_length_cheaply(self, inp: GenerateInput) -> None:
        """Reject prompts that cannot fit before tokenizing them: a text of n characters has at
        least n / max_token_chars tokens."""
        if inp.input_ids is not None:
            n = len(inp.input_ids)
        elif inp.prompt is not None:
            n = -(-len(inp.prompt) // self.max_token_chars)
        else:
            return
        if n >= self.context_length:
            raise RequestError(
                f"The input (at least {n} tokens) is longer than the model's context length "
                f"({self.context_length} tokens)."
            )

    def _tokenize_sync(self, inp: GenerateInput, sources: list, video_sources: list):
        """Decoding (videos too) and preprocessing, on the thread pool."""
        images = self.processor.load_images(sources)
        videos = self.processor.load_videos(video_sources, inp.video_options)
        tokenized = tokenize(self.processor, self.args, inp, images, videos)
        for item, img in zip(tokenized.mm_items, images):
            if img.data is not None:
                item.source = img.data  # ship the encoded bytes, not decoded pixels
        return tokenized

    async def generate(self, tokenized: TokenizedRequest) -> AsyncIterator[StreamEvent]:
        """Send a request and yield its progress; aborts it if the caller stops listening. As in
        SGLang, the first output is yielded at once, then one every ``stream_interval`` tokens,
        and the last."""
        await self._resumed.wait()
        self._check_alive()
        if tokenized.rid in self._states:
            raise RequestError(f"request id {tokenized.rid!r} is already running")
        detokenizer = IncrementalDetokenizer(
            self.tokenizer, tokenized.sampling_params, self.skipped_ids
        )
        state = ReqState(tokenized, detokenizer)
        if self.reasoning_tags is not None:
            state.reasoning = ReasoningTokenCounter(
                *self.reasoning_tags, opened=tokenized.require_reasoning
            )
        self._states[tokenized.rid] = state
        await self._to_scheduler.send_pyobj(tokenized)
        try:
            while True:
                out: RequestOutput = await state.queue.get()
                self._absorb(state, out)
                state.finished = out.finish_reason is not None
                if state.finished:
                    detokenizer.finish(out.finish_reason, out.new_token_ids)
                elif detokenizer.feed(out.new_token_ids) is None:
                    continue  # stream_interval: no event due yet
                yield StreamEvent(
                    detokenizer.text,
                    detokenizer.delta,
                    list(detokenizer.output_ids),
                    out.finish_reason,
                    self._meta(state, out),
                    out.embedding,
                )
                if state.finished:
                    return
        finally:
            self._states.pop(tokenized.rid, None)
            if not state.finished and self.alive:
                await self.abort(tokenized.rid)

    def _absorb(self, state: ReqState, out: RequestOutput) -> None:
        """Take one scheduler output into the request's state; raise the error of a failed
        request."""
        reason = out.finish_reason
        if reason is not None and reason.status_code is not None:
            state.finished = True  # the scheduler no longer holds it
            raise RequestError(reason.message or "request failed", status_code=reason.status_code)
        if state.reasoning is not None:
            state.reasoning.feed(out.new_token_ids)
        request = state.request
        text = self.token_text if request.return_text_in_logprobs else None
        if request.return_logprob:
            new = output_logprob_meta(
                request,
                out.new_token_ids,
                out.new_logprobs,
                out.new_top_logprobs,
                text,
                out.new_token_ids_logprobs,
            )
            for key, entries in new.items():
                state.output_meta.setdefault(key, []).extend(entries)
        if out.input_logprobs is not None:
            state.input_meta = input_logprob_meta(
                request,
                out.input_logprobs,
                out.input_top_logprobs or [],
                text,
                out.input_token_ids_logprobs,
            )

    def token_text(self, token_id: int) -> str:
        """One token decoded alone (special tokens included), as SGLang's logprob entries
        carry it; cached (the vocabulary bounds the cache)."""
        text = self._token_texts.get(token_id)
        if text is None:
            text = self._token_texts[token_id] = self.tokenizer.decode([token_id])
        return text

    def _meta(self, state: ReqState, out: RequestOutput) -> dict[str, Any]:
        meta: dict[str, Any] = {
            "id": state.request.rid,
            "finish_reason": finish_json(out.finish_reason),
            "prompt_tokens": out.prompt_tokens,
            "reasoning_tokens": state.reasoning.count if state.reasoning else 0,
            "completion_tokens": out.completion_tokens,
            "cached_tokens": out.cached_tokens,
            "e2e_latency": time.perf_counter() - state.created,
        }
        if out.mm_items is not None:
            meta["mm_items"] = out.mm_items
        if state.request.return_logprob:
            meta |= logprob_meta(state.request, state.output_meta, state.input_meta)
        return meta

    async def abort(self, rid: str) -> None:
        await self._to_scheduler.send_pyobj(AbortRequest(rid))

    async def abort_request(self, rid: str = "", abort_all: bool = False) -> list[str]:
        """SGLang's ``/abort_request``: end the running request ``rid`` (with its n > 1 copies)
        or, with ``abort_all``, every request; each stream ends with an ``abort`` finish.
        Returns the ids aborted."""
        if abort_all:
            targets = list(self._states)
        else:
            targets = [r for r in self._states if rid and (r == rid or r.startswith(f"{rid}-"))]
        for target in targets:
            state = self._states[target]
            out = RequestOutput(
                target,
                [],
                [],
                FinishReason.abort("aborted by /abort_request"),
                len(state.request.input_ids),
                0,
                len(state.detokenizer.output_ids),
            )
            state.queue.put_nowait(out)
            await self.abort(target)
        return targets

    # Control -----------------------------------------------------------------------------------
    async def pause_generation(self, mode: str) -> None:
        """SGLang's ``/pause_generation``: new requests wait for ``continue_generation``;
        ``abort`` ends the running ones, ``in_place`` stops the scheduler with them and their KV
        kept as they are."""
        self._resumed.clear()
        if mode == "abort":
            await self.abort_request(abort_all=True)
        else:
            await self.rpc("pause_generation")

    async def continue_generation(self) -> None:
        await self.rpc("continue_generation")
        self._resumed.set()

    async def rpc(self, method: str, timeout: float = 60.0) -> Any:
        self._check_alive()
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
        self._fail_inflight("the server is shutting down")
        for task in (self._loop_task, self._watch_task):
            if task is not None:
                task.cancel()
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._ctx.destroy(linger=0)


def _max_token_chars(tokenizer: Any) -> int:
    """An upper bound on the characters one token decodes to: the longest vocabulary entry
    (byte-level and SentencePiece spellings are never shorter than their text)."""
    return max((len(token) for token in tokenizer.get_vocab()), default=1) + 1


def load_processor(args: ServerArgs, model_path: str) -> MultimodalProcessor:
    """The tokenizer and the processor: built while the scheduler process loads the model."""
    return MultimodalProcessor(model_path, _load_config(model_path), args.allowed_local_dir)


def _load_config(model_path: str) -> Any:
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(model_path)
