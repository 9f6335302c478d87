"""Offline engine: ``sglang.Engine(model_path=..., **server_args).generate(...)``."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import torch

import sglang
from sglang.srt.core.finish import FinishReason, finish_json
from sglang.srt.core.io_struct import (
    TokenizedRequest,
    input_logprob_meta,
    logprob_meta,
    output_logprob_meta,
    token_ids_per_request,
)
from sglang.srt.core.req import Req
from sglang.srt.managers.constraints import MAX_TOP_LOGPROBS
from sglang.srt.managers.inputs import check_mm_limits, split_generate_inputs, tokenize
from sglang.srt.managers.parallel_sampling import fan_out
from sglang.srt.managers.scheduler import Scheduler
from sglang.srt.model_executor.dtypes import dtype_name
from sglang.srt.model_executor.model_runner import ModelRunner
from sglang.srt.multimodal.processor import MultimodalProcessor
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.server_args import ServerArgs

logger = logging.getLogger(__name__)


def resolve_model_path(model_path: str | None) -> str:
    if model_path is not None:
        return model_path
    from sglang.testing.tiny_models import default_model_path

    return str(default_model_path())


class Engine:
    def __init__(self, model_path: str | None = None, **kwargs: Any) -> None:
        model_path = resolve_model_path(model_path)
        self.server_args = ServerArgs(model_path=model_path, **kwargs)
        args = self.server_args
        if args.random_seed is not None:
            torch.manual_seed(args.random_seed)
        self.runner = ModelRunner(args, model_path)
        self.processor = MultimodalProcessor(
            model_path, self.runner.config, hf_processor=self.runner.hf_processor
        )
        self.tokenizer = self.processor.tokenizer
        self.scheduler = Scheduler(args, self.runner, self.tokenizer)

    # Public API --------------------------------------------------------------------------------
    def generate(
        self,
        prompt: str | list[str] | None = None,
        sampling_params: dict | list[dict] | None = None,
        input_ids: list[int] | list[list[int]] | None = None,
        image_data: Any = None,
        rid: str | list[str] | None = None,
        return_logprob: bool = False,
        top_logprobs_num: int = 0,
        logprob_start_len: int = -1,
        token_ids_logprob: list[int] | list[list[int]] | None = None,
        video_data: Any = None,
        mm_processor_kwargs: dict[str, Any] | None = None,
    ) -> dict | list[dict]:
        """With ``n`` > 1 in a request's sampling params, its n outputs take its place in the
        returned list (which is then a list even for one prompt). With ``return_logprob``,
        ``logprob_start_len`` >= 0 also returns the prompt tokens' logprobs from there on, and
        ``token_ids_logprob`` (ids, or a list of ids per prompt) the logprobs of those ids at
        every position. ``video_data``: one video (or a list per prompt) as encoded bytes, a
        path, base64 or a data URL, or decoded (n, height, width, 3) uint8 frames;
        ``mm_processor_kwargs`` their sampling options (``fps``, ``max_frames``, ...)."""
        if not 0 <= top_logprobs_num <= MAX_TOP_LOGPROBS:
            raise ValueError(f"top_logprobs_num must be in [0, {MAX_TOP_LOGPROBS}]")
        tokenized, batched = self.tokenize(
            prompt, sampling_params, input_ids, image_data, rid, video_data, mm_processor_kwargs
        )
        token_ids = token_ids_per_request(token_ids_logprob, len(tokenized))
        for t, ids in zip(tokenized, token_ids):
            t.ask_logprobs(top_logprobs_num if return_logprob else None, logprob_start_len, ids)
            t.validate_logprobs(self.runner.vocab_size)
        if any(t.sampling_params.n > 1 for t in tokenized):
            tokenized, batched = self._fan_out(tokenized), True
        outputs = [self.output_of(req) for req in self._run(tokenized)]
        return outputs if batched else outputs[0]

    def _run(self, tokenized: list[TokenizedRequest]) -> list[Req]:
        reqs = [self.scheduler.add_request(t) for t in tokenized]
        while not all(req.finished for req in reqs):
            self.scheduler.step()
        return reqs

    def _fan_out(self, tokenized: list[TokenizedRequest]) -> list[TokenizedRequest]:
        plan = fan_out(tokenized)
        if not self.server_args.disable_radix_cache:
            self._run(list(plan.prefills.values()))
        return plan.requests

    def tokenize(
        self,
        prompt: str | list[str] | None,
        sampling_params: dict | list[dict] | None,
        input_ids: list[int] | list[list[int]] | None,
        image_data: Any,
        rid: str | list[str] | None = None,
        video_data: Any = None,
        mm_processor_kwargs: dict[str, Any] | None = None,
    ) -> tuple[list[TokenizedRequest], bool]:
        """Validate and process inputs (all or nothing: raises ValueError)."""
        inputs, batched = split_generate_inputs(
            prompt, sampling_params, input_ids, image_data, rid, video_data, mm_processor_kwargs
        )
        tokenized = []
        for inp in inputs:
            check_mm_limits(self.server_args, len(inp.images), len(inp.videos))
            images = self.processor.load_images(inp.images)
            videos = self.processor.load_videos(inp.videos, inp.video_options)
            tokenized.append(tokenize(self.processor, self.server_args, inp, images, videos))
        for t in tokenized:
            self.scheduler.check_request(t)
        return tokenized, batched

    def output_of(self, req: Req) -> dict:
        out: dict[str, Any] = {
            "text": self._decode(req),
            "output_ids": list(req.output_ids),
            "meta_info": {
                "id": req.rid,
                "prompt_tokens": len(req.input_ids),
                "completion_tokens": len(req.output_ids),
                "cached_tokens": req.cached_len,
                "finish_reason": finish_json(req.finish_reason),
                "e2e_latency": (req.finish_time or 0.0) - req.arrival_time,
            },
        }
        if req.return_logprob:
            output = output_logprob_meta(
                req,
                req.output_ids,
                req.output_logprobs,
                req.output_top_logprobs,
                output_token_ids_logprobs=req.output_token_ids_logprobs,
            )
            prompt = {}
            if req.wants_prompt_logprobs:
                prompt = input_logprob_meta(
                    req,
                    req.input_logprobs,
                    req.input_top_logprobs,
                    input_token_ids_logprobs=req.input_token_ids_logprobs,
                )
            out["meta_info"] |= logprob_meta(req, output, prompt)
        return out

    def get_server_info(self) -> dict:
        return server_info(self.server_args, self.scheduler)

    def flush_cache(self) -> bool:
        return self.scheduler.flush_cache()

    def shutdown(self) -> None:
        self.scheduler.waiting.clear()
        self.scheduler.grammar_queue.clear()
        self.scheduler.constraints.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()

    def _decode(self, req: Req) -> str:
        return decode_output(self.tokenizer, req.output_ids, req.sampling_params, req.finish_reason)


def decode_output(
    tokenizer: Any,
    output_ids: list[int],
    params: SamplingParams,
    finish_reason: FinishReason | None,
) -> str:
    """Output text, cut before a matched stop string (after it with ``no_stop_trim``)."""
    text = tokenizer.decode(
        output_ids,
        skip_special_tokens=params.skip_special_tokens,
        spaces_between_special_tokens=params.spaces_between_special_tokens,
    )
    matched = None if finish_reason is None else finish_reason.matched
    if isinstance(matched, str) and matched in text:
        text = text[: text.find(matched) + (len(matched) if params.no_stop_trim else 0)]
    return text


def load_report(scheduler: Scheduler) -> dict:
    """The load entry sglang-router reads from ``GET /get_load`` (one per data-parallel rank;
    this server has one). ``num_reqs`` counts running and waiting requests; ``num_tokens`` is
    the KV slots that running requests hold (cached prefixes nobody uses are free to evict, so
    they do not count) plus the prompt tokens still waiting for a slot."""
    held = (
        scheduler.kv_pool.size - scheduler.kv_pool.available_size() - scheduler.tree.evictable_size
    )
    waiting = [*scheduler.waiting, *scheduler.grammar_queue]  # compiling a grammar is waiting
    queued = sum(len(req.input_ids) for req in waiting)
    return {
        "dp_rank": 0,
        "num_reqs": len(scheduler.running) + len(waiting),
        "num_waiting_reqs": len(waiting),
        "num_tokens": held + queued,
    }


def server_info(args: ServerArgs, scheduler: Scheduler) -> dict:
    runner = scheduler.runner
    cache, stats = runner.embedder.cache, runner.embedder.stats
    hybrid = {"linear_state": scheduler.states.stats()} if scheduler.states is not None else {}
    return {
        **hybrid,
        **{k: v for k, v in dataclasses.asdict(args).items() if k != "api_key"},
        "dtype": dtype_name(runner.dtype),  # in use, after --dtype auto is resolved
        "kv_cache_dtype": dtype_name(runner.kv_cache_dtype),
        "version": sglang.__version__,
        "dp_size": 1,
        "tp_size": 1,
        "load": load_report(scheduler),
        "max_total_num_tokens": runner.max_total_tokens,
        "max_running_requests": runner.max_running_requests,
        "context_length": runner.context_length,
        "chunked_prefill_size": scheduler.chunk_size or -1,
        "forward_steps": scheduler.forward_steps,
        "mixed_steps": scheduler.mixed_steps,
        "num_running_reqs": len(scheduler.running),
        "num_queue_reqs": len(scheduler.waiting) + len(scheduler.grammar_queue),
        "token_usage": 1 - scheduler.kv_pool.available_size() / scheduler.kv_pool.size,
        "kv_evictable_tokens": scheduler.tree.evictable_size,
        "mm_embedding_cache": {
            "mode": args.mm_cache_mode,
            "hits": cache.counters.hits,
            "misses": cache.counters.misses,
            "encoded_items": stats.encoded_items,
            "encoded_tokens": stats.encoded_tokens,
            "encoder_calls": stats.encoder_calls,
            "evictions": cache.counters.evictions,
            "entries": len(cache),
            "bytes_used": cache.bytes_used,
            "capacity_bytes": cache.capacity_bytes,
            "encoder_seconds": stats.encoder_seconds,
            "max_encoder_call_tokens": stats.max_call_tokens,
            "preprocess_skipped": stats.preprocess_skipped,
            "pinned": cache.num_pinned,
        },
        "perf": runner.perf.as_dict(),
        "weight_quantization": runner.quantization.as_dict() if runner.quantization else None,
        "memory": runner.memory_report.as_dict(),
    }
