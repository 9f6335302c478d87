"""Continuous batching with chunked prefill over the engine-owned KV cache.

Each ``step()`` runs one batch: an extend batch (new prompts and prompt chunks, prefill first)
when there is prefill work that fits, otherwise one decode token for every running request.
Requests join and leave between steps. The parts: ``PrefillPlanner`` (admission, prompt chunks,
release), ``BatchBuilder`` (KV slots and the ``ForwardBatch``), ``OutputProcessor`` (sampling,
logprobs, finish checks).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import random
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import torch

from sglang.srt.core.finish import FinishReason
from sglang.srt.core.forward_batch import ForwardBatch
from sglang.srt.core.io_struct import TokenizedRequest
from sglang.srt.core.req import Req
from sglang.srt.managers.batch_builder import BatchBuilder
from sglang.srt.managers.compute_env import decode_threads, intra_op_threads
from sglang.srt.managers.constraints import ConstraintManager
from sglang.srt.managers.gc_monitor import GcMonitor
from sglang.srt.managers.hicache import build_hicache
from sglang.srt.managers.linear_state import LinearStateManager, turn_start_token
from sglang.srt.managers.output_processor import OutputProcessor
from sglang.srt.managers.prefill_planner import PrefillPlanner, RequestLimits, ready_to_decode
from sglang.srt.managers.step_failure import StepFailure
from sglang.srt.mem_cache.hybrid_radix_cache import HybridRadixCache
from sglang.srt.mem_cache.radix_cache import RadixCache
from sglang.srt.model_executor.dtypes import dtype_name
from sglang.srt.model_executor.model_runner import ModelRunner
from sglang.srt.server_args import ServerArgs
from sglang.version import __version__

logger = logging.getLogger(__name__)


@dataclass
class StepOutput:
    """Requests that produced a token or finished (aborted ones included) in one step."""

    reqs: list[Req]


class RequestFailed(Exception):
    """A request that cannot be queued (its M-RoPE positions failed): the API answers 500."""


class Scheduler:
    def __init__(self, args: ServerArgs, runner: ModelRunner, tokenizer: Any) -> None:
        self.args = args
        self.runner = runner
        self.tokenizer = tokenizer
        self.eos_token_ids = eos_token_ids(runner.model_path, tokenizer)
        self.seed = args.random_seed if args.random_seed is not None else random.randrange(2**31)
        self._num_reqs = 0
        self.kv_pool = runner.pools.kv
        self.req_to_token = runner.pools.req_to_token
        self.tree, self.states = prefix_caches(args, runner, tokenizer)
        self.hicache = build_hicache(args, runner, self.tree, hybrid=self.states is not None)
        self.waiting: deque[Req] = deque()
        self.running: list[Req] = []
        self.grammar_queue: list[Req] = []  # constrained requests whose grammar is compiling
        self.bidirectional = runner.adapter.bidirectional  # what attends both ways in a prompt
        self.forward_steps = 0
        self.mixed_steps = 0  # prompt-chunk batches that also carried decode steps
        self.decode_threads = (
            decode_threads(args.decode_threads, getattr(runner.text_config, "hidden_size", 0))
            if runner.device == "cpu"
            else None
        )
        self.constraints = ConstraintManager(tokenizer, runner.vocab_size, self.eos_token_ids, args)
        limits = RequestLimits(runner.max_running_requests, runner.adapter.bidirectional)
        self.planner = PrefillPlanner(
            args, runner.pools, runner.embedder, limits, self.tree, self.states, self.hicache
        )
        self.builder = BatchBuilder(runner.pools, self.tree, self.states, self.constraints)
        self.outputs = OutputProcessor(
            runner.embedder, runner.vocab_size, tokenizer, self.constraints, self.states
        )
        self.gc_monitor: GcMonitor | None = None  # the server's compute process sets one
        self.paused = False  # /pause_generation in place: no steps, every request kept as it is
        # SGLang's timeouts, in seconds (unset or <= 0: none): a request waiting to be admitted,
        # or running since its admission, for longer ends with a 503.
        self.waiting_timeout = _env_seconds("SGLANG_REQ_WAITING_TIMEOUT")
        self.running_timeout = _env_seconds("SGLANG_REQ_RUNNING_TIMEOUT")

    @property
    def chunk_size(self) -> int | None:
        """Prompt tokens per extend batch; None when prompts are not chunked."""
        return self.planner.chunk_size

    @chunk_size.setter
    def chunk_size(self, value: int | None) -> None:
        self.planner.chunk_size = value

    # Intake ------------------------------------------------------------------------------------
    def check_request(self, tokenized: TokenizedRequest) -> None:
        """Raise ValueError when the request can never run here."""
        prompt_len = len(tokenized.input_ids)
        limit = self.runner.context_length
        if prompt_len == 0:
            raise ValueError("the prompt is empty")
        if prompt_len >= limit:
            raise ValueError(
                f"the prompt has {prompt_len} tokens, more than the context length allows "
                f"({limit}, leaving room for at least one new token)"
            )
        if tokenized.pooling and self.runner.pooling is None:
            raise ValueError(
                "this model does not serve embeddings or scores: launch it with --is-embedding"
            )
        if not tokenized.pooling and self.runner.pooling is not None:
            raise ValueError(
                "this server serves embeddings and scores (/v1/embeddings, /v1/score, "
                "/v1/rerank), not generation"
            )
        adapter = self.runner.adapter
        tokenized.validate(
            self.runner.vocab_size, adapter.image_token_id, adapter.video_placeholder_id
        )
        max_new = min(tokenized.sampling_params.max_new_tokens, limit - prompt_len)
        if prompt_len + max_new > self.kv_pool.size:
            raise ValueError(
                f"the request needs {prompt_len + max_new} KV slots, more than the cache holds "
                f"({self.kv_pool.size})"
            )
        self.constraints.check(tokenized)

    def add_request(self, tokenized: TokenizedRequest) -> Req:
        """Queue a request; raises ValueError (bad request) or RequestFailed (it cannot run)."""
        self.check_request(tokenized)
        sp = tokenized.sampling_params
        pooling = self.runner.pooling.method if tokenized.pooling else None  # type: ignore[union-attr]
        if pooling is not None:
            sp.max_new_tokens = 0  # prompt only: pooled, never sampled or decoded
        sp.max_new_tokens = min(
            sp.max_new_tokens, self.runner.context_length - len(tokenized.input_ids)
        )
        self._num_reqs += 1
        generator = None
        if not sp.is_greedy:
            seed = sp.seed if sp.seed is not None else self.seed + self._num_reqs
            generator = torch.Generator().manual_seed(seed)
        req = Req(
            rid=tokenized.rid,
            input_ids=tokenized.input_ids,
            sampling_params=sp,
            mm_items=tokenized.mm_items,
            eos_token_ids=self.eos_token_ids,
            generator=generator,
            return_logprob=tokenized.return_logprob,
            top_logprobs_num=tokenized.top_logprobs_num,
            logprob_start_len=tokenized.logprob_start_len,
            token_ids_logprob=tokenized.token_ids_logprob,
            bidirectional=self.bidirectional,
            cache_salt=tokenized.cache_salt,
            custom_logit_processor=tokenized.custom_logit_processor,
            pooling=pooling,
        )
        self._set_mrope_positions(req)
        req.arrival_time = time.perf_counter()
        if self.hicache is not None:
            self.hicache.prefetch(req)
        if self.constraints.attach(req):
            self.grammar_queue.append(req)
        else:
            self.waiting.append(req)
        return req

    def _set_mrope_positions(self, req: Req) -> None:
        adapter = self.runner.adapter
        if not adapter.uses_mrope:
            return
        try:
            req.mrope_positions, req.mrope_delta = adapter.mrope(
                req.input_ids, [item.layout for item in req.mm_items]
            )
        except Exception as exc:
            logger.exception("positions of request %s failed", req.rid)
            raise RequestFailed(f"cannot compute the positions of this prompt: {exc}") from exc

    def abort(self, rid: str) -> bool:
        for queue in (self.grammar_queue, self.waiting):
            for req in queue:
                if req.rid == rid:
                    queue.remove(req)
                    req.finish_reason = FinishReason.abort()
                    if self.hicache is not None:
                        self.hicache.forget(req)
                    return True
        for req in self.running:
            if req.rid == rid:
                req.finish_reason = FinishReason.abort()
                self._retire(req)
                return True
        return False

    @property
    def has_work(self) -> bool:
        return not self.paused and bool(self.waiting or self.running or self.grammar_queue)

    def _end_timed_out(self) -> list[Req]:
        """End the requests past SGLang's waiting or running timeout (503, as SGLang answers)."""
        now = time.perf_counter()
        ended = []
        if self.waiting_timeout is not None:
            for req in [r for r in self.waiting if now - r.arrival_time > self.waiting_timeout]:
                self.waiting.remove(req)
                if self.hicache is not None:
                    self.hicache.forget(req)
                req.finish_reason = FinishReason.error("Request waiting timeout reached.", 503)
                ended.append(req)
        if self.running_timeout is not None:
            limit = self.running_timeout
            for req in [r for r in self.running if now - (r.admit_time or now) > limit]:
                req.finish_reason = FinishReason.error("Request running timeout reached.", 503)
                self._retire(req)
                ended.append(req)
        return ended

    # One step ----------------------------------------------------------------------------------
    def step(self) -> StepOutput:
        """Run one batch: schedule it, forward it, turn its logits into tokens. A failure that
        belongs to one request (its inputs, its forward, its sampling) ends that request alone;
        it is returned with the others."""
        out = self._end_timed_out()
        out += self._take_compiled_grammars()  # those whose grammar failed to compile
        batch, failed = self._schedule()
        if batch is not None:
            with intra_op_threads(self.decode_threads if batch.is_decode else None):
                batch, logits, failed_forward = self._forward(batch)
                failed += failed_forward
                if batch is not None:
                    produced, failed_sampling = self._process_outputs(batch, logits)
                    failed += failed_sampling
                    out += produced
        self._end_failed(failed)
        return StepOutput([f.req for f in failed] + out)

    def _take_compiled_grammars(self) -> list[Req]:
        """Queue the requests whose grammar compiled; return those whose compile failed."""
        if not self.grammar_queue:
            return []
        idle = not self.waiting and not self.running
        ready, failed = self.constraints.take_compiled(self.grammar_queue, idle)
        self.waiting.extend(ready)
        return failed

    def _schedule(self) -> tuple[ForwardBatch | None, list[StepFailure]]:
        """An extend batch when prompt work fits; else, or when every request of that batch
        failed, a decode batch of the running requests past their prompt."""
        failed: list[StepFailure] = []
        plan = self.planner.plan(self.waiting, self.running)
        if plan is not None:
            self.mixed_steps += bool(plan.decoding)
            batch, failed = self.builder.build(plan.reqs, is_decode=False)
            if batch is not None:
                return batch, failed
        failing = {id(f.req) for f in failed}
        reqs = ready_to_decode([r for r in self.running if id(r) not in failing])
        if not reqs:
            if self.hicache is not None and self.waiting:
                self.hicache.wait(0.005)  # the queue waits for the store: nap, do not spin
            return None, failed
        batch, failed_decode = self.builder.build(reqs, is_decode=True)
        return batch, failed + failed_decode

    def _forward(
        self, batch: ForwardBatch
    ) -> tuple[ForwardBatch | None, torch.Tensor, list[StepFailure]]:
        """Logits of ``batch``. When a batch of several requests fails, each request runs alone
        so that only the failing ones fail; returns the batch of the survivors."""
        try:
            return batch, self.runner.forward(batch), []
        except Exception:
            if len(batch.reqs) > 1:
                logger.warning("a batch of %d requests failed; rerunning one by one", batch.size)
            else:
                logger.exception("forward failed for request %s", batch.reqs[0].rid)
        message = "internal error in the forward pass"
        if len(batch.reqs) == 1:
            return None, torch.empty(0), [StepFailure(batch.reqs[0], message)]
        rows, survivors, prompt_logprobs, pooled, failed = [], [], [], [], []
        for i, req in enumerate(batch.reqs):
            if self.states is not None and self.states.is_dirty(req):
                failed.append(StepFailure(req, message))
                continue  # the failed forward already changed its linear-attention state
            try:
                alone = batch.select([i])
                rows.append(self.runner.forward(alone))
                survivors.append(i)
                prompt_logprobs.append(alone.prompt_logprobs[0] if alone.prompt_logprobs else None)
                pooled.append(alone.pooled[0] if alone.pooled else None)
            except Exception:
                logger.exception("forward failed for request %s", req.rid)
                failed.append(StepFailure(req, message))
        if not survivors:
            return None, torch.empty(0), failed
        kept = batch.select(survivors)
        if any(p is not None for p in prompt_logprobs):
            kept.prompt_logprobs = prompt_logprobs
        if any(p is not None for p in pooled):
            kept.pooled = pooled
        return kept, torch.cat(rows), failed

    def _process_outputs(
        self, batch: ForwardBatch, logits: torch.Tensor
    ) -> tuple[list[Req], list[StepFailure]]:
        """Sample the batch's requests and retire those that finished."""
        self.forward_steps += 1
        started = time.perf_counter()
        produced, failed = self.outputs.process(batch, logits)
        for req in produced:
            if req.finished:
                self._retire(req)
        self.runner.perf.sampling_seconds += time.perf_counter() - started
        return produced, failed

    def _end_failed(self, failed: list[StepFailure]) -> None:
        """Abort the requests that failed in this step: this step's KV slots go back, the rest
        is released as for a finished request."""
        for failure in failed:
            self.builder.free_step_slots(failure.req)
            failure.req.finish_reason = FinishReason.error(failure.message)
            self._retire(failure.req)

    def _retire(self, req: Req) -> None:
        self.planner.release(req)
        self.running.remove(req)

    # Maintenance and reports -------------------------------------------------------------------
    def flush_cache(self) -> bool:
        if self.running:
            return False
        self.kv_pool.free(self.tree.held_slots())
        self.tree.reset()
        self.runner.embedder.cache.clear()
        return True

    def check_integrity(self) -> None:
        self.tree.check_integrity()
        held = self.tree.total_size + sum(r.computed_len - r.cached_len for r in self.running)
        self.kv_pool.check_integrity(held)
        self.req_to_token.check_integrity()
        self.runner.embedder.cache.check_integrity()
        if self.states is not None:
            self.states.check_integrity(self.running)

    def load(self) -> dict[str, int]:
        """The load entry sglang-router reads from ``GET /get_load`` (one per data-parallel
        rank; this server has one). ``num_reqs`` counts running and waiting requests;
        ``num_tokens`` is the KV slots that running requests hold (cached prefixes nobody uses
        are free to evict, so they do not count) plus the prompt tokens still waiting for a
        slot."""
        held = self.kv_pool.size - self.kv_pool.available_size() - self.tree.evictable_size
        waiting = [*self.waiting, *self.grammar_queue]  # compiling a grammar is waiting
        return {
            "dp_rank": 0,
            "num_reqs": len(self.running) + len(waiting),
            "num_waiting_reqs": len(waiting),
            "num_tokens": held + sum(len(req.input_ids) for req in waiting),
        }

    def info(self) -> dict[str, Any]:
        """What ``/server_info`` answers: the server arguments (but the API key), the resolved
        model settings, the queues, and the counters of the caches, the encoder and the runner."""
        runner = self.runner
        hybrid = {"linear_state": self.states.stats()} if self.states is not None else {}
        return {
            **hybrid,
            **{k: v for k, v in dataclasses.asdict(self.args).items() if k != "api_key"},
            "dtype": dtype_name(runner.dtype),  # in use, after --dtype auto is resolved
            "kv_cache_dtype": dtype_name(runner.kv_cache_dtype),
            "version": __version__,
            "dp_size": 1,
            "tp_size": 1,
            "load": self.load(),
            "max_total_num_tokens": runner.max_total_tokens,
            "max_running_requests": runner.max_running_requests,
            "context_length": runner.context_length,
            "chunked_prefill_size": self.chunk_size or -1,
            "forward_steps": self.forward_steps,
            "mixed_steps": self.mixed_steps,
            "num_running_reqs": len(self.running),
            "num_queue_reqs": len(self.waiting) + len(self.grammar_queue),
            "num_grammar_queue_reqs": len(self.grammar_queue),
            "num_used_tokens": self.kv_pool.size - self.kv_pool.available_size(),
            "token_usage": 1 - self.kv_pool.available_size() / self.kv_pool.size,
            "kv_evictable_tokens": self.tree.evictable_size,
            "mm_embedding_cache": {
                "mode": self.args.mm_cache_mode,
                **runner.embedder.stats.as_dict(),
                **runner.embedder.cache.stats(),
            },
            "mm_global_cache": runner.embedder.store.stats() if runner.embedder.store else None,
            "hicache": self.hicache.stats() if self.hicache else None,
            "encoder_workers": runner.embedder.remote.as_dict() if runner.embedder.remote else None,
            "perf": runner.perf.as_dict(),
            "gc": self.gc_monitor.stats() if self.gc_monitor else None,
            "weight_quantization": runner.weight_quantization(),
            "linear_methods": runner.linear_methods,
            "memory": runner.memory_report.as_dict(),
        }


def prefix_caches(
    args: ServerArgs, runner: ModelRunner, tokenizer: Any
) -> tuple[RadixCache, LinearStateManager | None]:
    """The radix cache over the KV pool and, for hybrid models, the manager of the
    linear-attention state (whose snapshots the radix cache then holds too)."""
    if runner.state_pool is None:
        return RadixCache(runner.kv_pool.free), None
    tree = HybridRadixCache(runner.kv_pool.free, runner.state_pool, runner.state_snapshot_slots)
    states = LinearStateManager(
        runner.state_pool,
        tree,
        runner.max_running_requests,
        caching=not args.disable_radix_cache,
        turn_start_id=turn_start_token(tokenizer),
    )
    return tree, states


def _env_seconds(name: str) -> float | None:
    value = float(os.environ.get(name) or -1)
    return value if value > 0 else None


def eos_token_ids(model_path: str, tokenizer: Any) -> frozenset[int]:
    """EOS ids from generation_config.json plus the tokenizer's."""
    ids: set[int] = set()
    path = os.path.join(model_path, "generation_config.json")
    if os.path.exists(path):
        with open(path) as f:
            eos = json.load(f).get("eos_token_id")
        ids.update(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return frozenset(ids)
