"""Continuous batching with chunked prefill over the engine-owned KV cache.

Each ``step()`` runs one batch: an extend batch (new prompts and prompt chunks, prefill first)
when there is prefill work that fits, otherwise one decode token for every running request.
Requests join and leave between steps.
"""

from __future__ import annotations

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
from sglang.srt.core.req import Req, ReqStatus, logprob_alternatives
from sglang.srt.managers.compute_env import decode_threads, intra_op_threads
from sglang.srt.managers.constraints import ConstraintManager
from sglang.srt.managers.linear_state import LinearStateManager, turn_start_token
from sglang.srt.mem_cache.hybrid_radix_cache import HybridRadixCache
from sglang.srt.mem_cache.radix_cache import RadixCache
from sglang.srt.model_executor.model_runner import ModelRunner
from sglang.srt.sampling.sampler import apply_penalties, sample
from sglang.srt.sampling.stop_strings import matched_stop, matched_stop_regex, skipped_token_ids
from sglang.srt.server_args import ServerArgs

logger = logging.getLogger(__name__)

DEFAULT_CHUNK_CPU = 2048
DEFAULT_CHUNK_GPU = 8192


@dataclass
class StepOutput:
    """Requests that produced a token or finished (aborted ones included) in one step."""

    reqs: list[Req]


class RequestFailed(Exception):
    """A failure that belongs to one request (its input, positions, forward or sampling)."""


class Scheduler:
    def __init__(self, args: ServerArgs, runner: ModelRunner, tokenizer: Any) -> None:
        self.args = args
        self.runner = runner
        self.tokenizer = tokenizer
        self.special_ids = skipped_token_ids(tokenizer)
        self.eos_token_ids = eos_token_ids(runner.model_path, tokenizer)
        self.seed = args.random_seed if args.random_seed is not None else random.randrange(2**31)
        self._num_reqs = 0
        self.kv_pool = runner.kv_pool
        self.req_to_token = runner.req_to_token_pool
        self.tree = RadixCache(self.kv_pool.free)
        self.states: LinearStateManager | None = None  # hybrid models' linear-attention state
        if runner.state_pool is not None:
            self.tree = HybridRadixCache(
                self.kv_pool.free, runner.state_pool, runner.state_snapshot_slots
            )
            self.states = LinearStateManager(
                runner.state_pool,
                self.tree,
                runner.max_running_requests,
                caching=not args.disable_radix_cache,
                turn_start_id=turn_start_token(tokenizer),
            )
        self.waiting: deque[Req] = deque()
        self.running: list[Req] = []
        chunk = args.chunked_prefill_size
        if chunk is None:
            chunk = DEFAULT_CHUNK_CPU if runner.device == "cpu" else DEFAULT_CHUNK_GPU
        self.chunk_size: int | None = None if chunk == -1 else chunk
        self.bidirectional = runner.adapter.bidirectional
        self.forward_steps = 0
        self.mixed_steps = 0  # prompt-chunk batches that also carried decode steps
        self.decode_threads = (
            decode_threads(args.decode_threads, getattr(runner.text_config, "hidden_size", 0))
            if runner.device == "cpu"
            else None
        )
        self.constraints = ConstraintManager(tokenizer, runner.vocab_size, self.eos_token_ids, args)
        self.grammar_queue: list[Req] = []  # constrained requests whose grammar is compiling

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
        )
        if self.runner.adapter.uses_mrope:
            try:
                req.mrope_positions, req.mrope_delta = self.runner.adapter.mrope(
                    req.input_ids, [item.layout for item in req.mm_items]
                )
            except Exception as exc:
                logger.exception("positions of request %s failed", req.rid)
                raise RequestFailed(f"cannot compute the positions of this prompt: {exc}") from exc
        req.arrival_time = time.perf_counter()
        if self.constraints.attach(req):
            self.grammar_queue.append(req)
        else:
            self.waiting.append(req)
        return req

    def abort(self, rid: str) -> bool:
        for req in self.grammar_queue:
            if req.rid == rid:
                self.grammar_queue.remove(req)
                req.finish_reason = FinishReason.abort()
                return True
        for req in list(self.waiting):
            if req.rid == rid:
                self.waiting.remove(req)
                req.finish_reason = FinishReason.abort()
                return True
        for req in self.running:
            if req.rid == rid:
                req.finish_reason = FinishReason.abort()
                self._release(req)
                self.running.remove(req)
                return True
        return False

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.grammar_queue)

    # One step ----------------------------------------------------------------------------------
    def step(self) -> StepOutput:
        """Run one batch. A failure that belongs to a request (its positions, its forward, its
        sampling) aborts that request alone; it is returned with the others."""
        self._failed: list[Req] = self._take_compiled_grammars()
        batch = self._schedule_extend() or self._schedule_decode()
        done: list[Req] = []
        if batch is not None:
            with intra_op_threads(self.decode_threads if batch.is_decode else None):
                batch, logits = self._forward(batch)
                if batch is not None:
                    self.forward_steps += 1
                    started = time.perf_counter()
                    done = self._process(batch, logits)
                    self.runner.perf.sampling_seconds += time.perf_counter() - started
        return StepOutput(self._failed + done)

    def _take_compiled_grammars(self) -> list[Req]:
        """Queue the requests whose grammar compiled; return those whose compile failed."""
        if not self.grammar_queue:
            return []
        idle = not self.waiting and not self.running
        ready, failed = self.constraints.take_compiled(self.grammar_queue, idle)
        self.waiting.extend(ready)
        return failed

    def _forward(self, batch: ForwardBatch) -> tuple[ForwardBatch | None, torch.Tensor]:
        """Logits of ``batch``. When a batch of several requests fails, each request runs alone
        so that only the failing ones are aborted; returns the batch of the survivors."""
        try:
            return batch, self.runner.forward(batch)
        except Exception:
            if len(batch.reqs) > 1:
                logger.warning("a batch of %d requests failed; rerunning one by one", batch.size)
            else:
                logger.exception("forward failed for request %s", batch.reqs[0].rid)
        if len(batch.reqs) == 1:
            self._fail_in_step(batch.reqs[0], "internal error in the forward pass")
            return None, torch.empty(0)
        rows, survivors, prompt_logprobs = [], [], []
        for i, req in enumerate(batch.reqs):
            if self.states is not None and self.states.is_dirty(req):
                self._fail_in_step(req, "internal error in the forward pass")
                continue  # the failed forward already changed its linear-attention state
            try:
                alone = batch.select([i])
                rows.append(self.runner.forward(alone))
                survivors.append(i)
                prompt_logprobs.append(alone.prompt_logprobs[0] if alone.prompt_logprobs else None)
            except Exception:
                logger.exception("forward failed for request %s", req.rid)
                self._fail_in_step(req, "internal error in the forward pass")
        if not survivors:
            return None, torch.empty(0)
        kept = batch.select(survivors)
        if any(p is not None for p in prompt_logprobs):
            kept.prompt_logprobs = prompt_logprobs
        return kept, torch.cat(rows)

    def _fail(self, req: Req, message: str, status_code: int = 500) -> None:
        """Abort a running request that holds no KV slots of the current step."""
        req.finish_reason = FinishReason.error(message, status_code)
        self._release(req)
        self.running.remove(req)
        self._failed.append(req)

    def _fail_in_step(self, req: Req, message: str) -> None:
        """Abort a request whose slots for this step are already allocated."""
        row = req.req_pool_idx
        start, end = req.computed_len, req.computed_len + req.extend_len
        self.kv_pool.free(self.req_to_token.req_to_token[row, start:end].clone())
        req.extend_len = 0
        self._fail(req, message)

    def _schedule_extend(self) -> ForwardBatch | None:
        decoding = self._decodes_to_mix()
        budget = min(self.chunk_size or self.args.max_prefill_tokens, self.args.max_prefill_tokens)
        budget = max(budget - len(decoding), 1)
        unbounded = self.chunk_size is None
        chosen: list[Req] = []
        for req in self.running:
            if req.is_prefilling and budget > 0:
                budget -= self._plan_extend(req, budget, unbounded and not chosen)
                chosen.append(req)
        while self.waiting and budget > 0 and len(self.running) < self.runner.max_running_requests:
            req = self.waiting[0]
            if not self._admit(req):
                break
            self.waiting.popleft()
            self.running.append(req)
            budget -= self._plan_extend(req, budget, unbounded and not chosen)
            chosen.append(req)
        chosen = [r for r in chosen if r.extend_len > 0]
        if not chosen:
            return None
        if decoding:
            self.mixed_steps += 1
        return self._build_batch(chosen + decoding, is_decode=False)

    def _decodes_to_mix(self) -> list[Req]:
        """With ``--enable-mixed-chunk``, the running requests past their prompt, which then
        take their decode step in the prompt chunk's batch. Linear-attention models keep separate
        decode batches: their one-token step has its own recurrent kernel."""
        if not self.args.enable_mixed_chunk or self.states is not None:
            return []
        return self._ready_to_decode()

    def _schedule_decode(self) -> ForwardBatch | None:
        reqs = self._ready_to_decode()
        return self._build_batch(reqs, is_decode=True) if reqs else None

    def _ready_to_decode(self) -> list[Req]:
        """The running requests past their prompt, each set to extend by its one new token."""
        reqs = [r for r in self.running if not r.is_prefilling]
        for req in reqs:
            req.extend_len = 1
        return reqs

    def _admit(self, req: Req) -> bool:
        """Match the radix prefix, reserve KV for the whole request, take a request row."""
        if self.args.disable_radix_cache:
            slots, node = torch.empty(0, dtype=torch.int64), self.tree.root
        else:
            slots, node = self.tree.match_prefix(req.radix_key(req.uncached_from))
        self.tree.inc_lock_ref(node)
        req.cached_len = req.computed_len = len(slots)
        need = self._footprint(req) + sum(self._footprint(r) for r in self.running)
        states_full = self.states is not None and not self.states.can_admit()
        if states_full or need > self.kv_pool.available_size() + self.tree.evictable_size:
            self.tree.dec_lock_ref(node)
            req.cached_len = req.computed_len = 0
            return False
        row = self.req_to_token.alloc()
        assert row is not None, "request rows are sized to max_running_requests"
        req.req_pool_idx, req.last_node, req.status = row, node, ReqStatus.RUNNING
        self.req_to_token.req_to_token[row, : len(slots)] = slots
        if self.states is not None:
            self.states.admit(req, node)
        return True

    def _footprint(self, req: Req) -> int:
        """KV slots the request still needs to finish: the rest of its prompt and decode."""
        decode_left = req.sampling_params.max_new_tokens - len(req.output_ids)
        return max(len(req.input_ids) - req.computed_len, 0) + max(decode_left, 0)

    def _plan_extend(self, req: Req, budget: int, may_exceed: bool) -> int:
        start = req.computed_len
        end = len(req.input_ids) if may_exceed else min(len(req.input_ids), start + budget)
        if self.bidirectional:
            end = self._avoid_splitting_spans(req, start, end)
        req.extend_len = end - start
        return req.extend_len

    def _avoid_splitting_spans(self, req: Req, start: int, end: int) -> int:
        """Move ``end`` off any bidirectional span it cuts (an image; a prefix-LM's prompt):
        back to the span's start, or past the span when the chunk starts inside or at it (a
        chunk then exceeds the budget rather than split it)."""
        for s, e in req.bidirectional_spans():
            if s < end < e:
                return s if s > start else e
        return end

    def _build_batch(self, reqs: list[Req], is_decode: bool) -> ForwardBatch | None:
        ids, positions, locs, kept = [], [], [], []
        for req in reqs:
            start, end = req.computed_len, req.computed_len + req.extend_len
            try:
                req_ids, req_positions = req.token_ids(start, end), req.positions(start, end)
            except Exception as exc:
                logger.exception("inputs of request %s failed", req.rid)
                req.extend_len = 0
                self._fail(req, f"cannot prepare the inputs of this request: {exc}")
                continue
            slots = self._alloc_slots(req.extend_len)
            self.req_to_token.req_to_token[req.req_pool_idx, start:end] = slots
            ids.extend(req_ids)
            positions.append(req_positions)
            locs.append(slots)
            kept.append(req)
        if not kept:
            return None
        device = self.runner.device
        spans = [r.bidirectional_spans() for r in kept]
        self.constraints.prepare(kept)
        batch = ForwardBatch(
            reqs=kept,
            input_ids=torch.tensor(ids, dtype=torch.int64, device=device),
            positions=torch.cat(positions, dim=-1).to(device),
            out_cache_loc=torch.cat(locs).to(device),
            req_pool_indices=[r.req_pool_idx for r in kept],  # type: ignore[misc]
            prefix_lens=[r.computed_len for r in kept],
            extend_lens=[r.extend_len for r in kept],
            bidirectional_spans=spans,
            is_decode=is_decode,
        )
        if self.states is not None:
            batch.state_plan = self.states.plan(batch)
        return batch

    def _alloc_slots(self, n: int) -> torch.Tensor:
        slots = self.kv_pool.alloc(n)
        if slots is None:
            self.tree.evict(n - self.kv_pool.available_size())
            slots = self.kv_pool.alloc(n)
        if slots is None:
            raise RuntimeError("KV pool exhausted despite admission control")
        return slots

    # Results -----------------------------------------------------------------------------------
    def _process(self, batch: ForwardBatch, logits: torch.Tensor) -> list[Req]:
        if self.states is not None:
            self.states.step_done(batch)
        sampled_rows, sampled_reqs = [], []
        for i, req in enumerate(batch.reqs):
            if batch.prompt_logprobs is not None and batch.prompt_logprobs[i] is not None:
                chosen, top, by_id = batch.prompt_logprobs[i]
                req.input_logprobs += chosen
                req.input_top_logprobs += top if top is not None else [None] * len(chosen)
                req.input_token_ids_logprobs += by_id if by_id is not None else [None] * len(chosen)
            req.computed_len += req.extend_len
            req.extend_len = 0
            self.runner.embedder.release(req, req.computed_len)
            if not req.is_prefilling:
                sampled_rows.append(i)
                sampled_reqs.append(req)
        if not sampled_reqs:
            return []
        logits = logits[sampled_rows]
        tokens = self._sample(sampled_reqs, logits)
        logprobs = None
        if any(r.return_logprob for r in sampled_reqs):
            logprobs = torch.log_softmax(logits, dim=-1)  # before logit_bias and grammar masks
        now = time.perf_counter()
        done = []
        for i, (req, token) in enumerate(zip(sampled_reqs, tokens)):
            if req.first_token_time is None:
                req.first_token_time = now
            if token is None:  # nothing to generate (max_new_tokens == 0) or a failed row
                if not req.finished:
                    req.finish_reason = FinishReason.length_limit(0)
            else:
                req.output_ids.append(token)
                if req.return_logprob:
                    self._take_logprobs(req, token, logprobs[i : i + 1])
                self.constraints.accept(req, token)
                self._check_finished(req)
            if req.finished:
                self._release(req)
                self.running.remove(req)
            done.append(req)
        return done

    @staticmethod
    def _take_logprobs(req: Req, token: int, logprobs: torch.Tensor) -> None:
        """Record the sampled token's logprob from its (1, vocab) row, with its top
        alternatives and the logprobs of the request's ``token_ids_logprob``."""
        req.output_logprobs.append(float(logprobs[0, token]))
        top, by_id = logprob_alternatives(logprobs, req.top_logprobs_num, req.token_ids_logprob)
        if top is not None:
            req.output_top_logprobs += top
        if by_id is not None:
            req.output_token_ids_logprobs += by_id

    def _sample(self, reqs: list[Req], logits: torch.Tensor) -> list[int | None]:
        """One token per request; None for requests that get none (``max_new_tokens == 0``,
        or a request-specific failure, which marks the request aborted)."""
        params = [r.sampling_params for r in reqs]
        if any(sp.has_penalties or sp.min_new_tokens for sp in params):
            apply_penalties(
                logits,
                params,
                [r.input_ids for r in reqs],
                [r.output_ids for r in reqs],
                [self._banned_ids(r) for r in reqs],
            )
        shaped = self.constraints.shaped(logits, reqs)
        tokens: list[int | None] = [None] * len(reqs)
        bad = torch.isnan(logits).any(dim=-1).tolist()
        greedy = shaped.argmax(dim=-1).tolist()  # what ``sample`` gives a greedy row
        for i, req in enumerate(reqs):
            if req.sampling_params.max_new_tokens == 0:
                continue
            if bad[i]:
                req.finish_reason = FinishReason.error(
                    "the model produced NaN logits for this request"
                )
                continue
            if params[i].is_greedy:
                tokens[i] = greedy[i]
                continue
            try:
                tokens[i] = sample(shaped[i : i + 1], [params[i]], [req.generator])[0]
            except Exception as exc:
                logger.exception("sampling failed for request %s", req.rid)
                req.finish_reason = FinishReason.error(f"sampling failed: {exc}")
        return tokens

    def _banned_ids(self, req: Req) -> list[int]:
        sp = req.sampling_params
        if len(req.output_ids) >= sp.min_new_tokens:
            return []
        eos = [] if sp.ignore_eos else list(req.eos_token_ids)
        return [t for t in (*eos, *(sp.stop_token_ids or ())) if 0 <= t < self.runner.vocab_size]

    def _check_finished(self, req: Req) -> None:
        sp, token = req.sampling_params, req.output_ids[-1]
        if req.finished:  # the grammar rejected the token
            return
        if req.grammar is not None and req.grammar.terminated:
            req.finish_reason = FinishReason.stop(token)
            return
        if token in (sp.stop_token_ids or ()) or (not sp.ignore_eos and token in req.eos_token_ids):
            req.finish_reason = FinishReason.stop(token)
        elif len(req.output_ids) >= sp.max_new_tokens:
            req.finish_reason = FinishReason.length_limit(len(req.output_ids))
        if req.finish_reason is None:
            stop = self._matched_stop(req)
            if stop is not None:
                req.finish_reason = FinishReason.stop(stop)

    def _matched_stop(self, req: Req) -> str | None:
        """The stop string or stop_regex pattern that the output now ends with (None if none).
        As in SGLang, a regex is reported by its pattern and the text is cut only where that
        pattern appears literally, so what a regex matched stays in the output."""
        sp, ids = req.sampling_params, req.output_ids
        skip = sp.skip_special_tokens
        if sp.stop:
            stop = matched_stop(self.tokenizer, ids, sp.stop, skip, self.special_ids)
            if stop is not None:
                return stop
        if sp.stop_regex:
            return matched_stop_regex(self.tokenizer, ids, sp.stop_regex, skip, self.special_ids)
        return None

    def _release(self, req: Req) -> None:
        """Hand the request's KV (and linear-attention state) to the radix cache (or free it)
        and drop its pins."""
        row = req.req_pool_idx
        assert row is not None
        slots = self.req_to_token.req_to_token[row, : req.computed_len].clone()
        if self.args.disable_radix_cache:
            self.kv_pool.free(slots[req.cached_len :])
        else:
            dup = self.tree.insert(req.radix_key(req.computed_len), slots)
            self.kv_pool.free(slots[req.cached_len : dup])
        if self.states is not None:
            self.states.release(req)
        self.tree.dec_lock_ref(req.last_node)
        self.req_to_token.free(row)
        req.req_pool_idx = None
        req.status = ReqStatus.FINISHED
        req.finish_time = time.perf_counter()
        self.runner.embedder.release(req)

    # Maintenance -------------------------------------------------------------------------------
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
