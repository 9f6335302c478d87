"""Which requests the next extend batch runs, and how many prompt tokens each.

Admission takes a waiting request in when the KV cache can hold everything that it and the
running requests still need: its radix-cached prefix is matched and locked and it gets a request
row. ``release`` is admission's inverse. A prompt is then planned in chunks under the prefill
budget; a chunk never ends inside a bidirectional span (an image of Gemma 3/4, a prefix-LM's
prompt), since those tokens attend to each other and must be computed together.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import torch

from sglang.srt.core.req import Req, ReqStatus
from sglang.srt.managers.hicache import HiCache
from sglang.srt.managers.linear_state import LinearStateManager
from sglang.srt.mem_cache.pools import Pools
from sglang.srt.mem_cache.radix_cache import RadixCache
from sglang.srt.multimodal.embedder import MultimodalEmbedder
from sglang.srt.server_args import ServerArgs

DEFAULT_CHUNK_CPU = 2048
DEFAULT_CHUNK_GPU = 8192


@dataclass
class ExtendPlan:
    """The requests of an extend batch, each with its ``extend_len`` set."""

    prefill: list[Req]  # prompt chunks, those already running first
    decoding: list[Req]  # with --enable-mixed-chunk: decode steps taken in the same batch

    @property
    def reqs(self) -> list[Req]:
        return self.prefill + self.decoding


def chunk_size(args: ServerArgs, device: str) -> int | None:
    """Prompt tokens per extend batch; None when prompts are not chunked."""
    chunk = args.chunked_prefill_size
    if chunk is None:
        chunk = DEFAULT_CHUNK_CPU if device == "cpu" else DEFAULT_CHUNK_GPU
    return None if chunk == -1 else chunk


def ready_to_decode(running: list[Req]) -> list[Req]:
    """The running requests past their prompt, each set to extend by its one new token."""
    reqs = [r for r in running if not r.is_prefilling]
    for req in reqs:
        req.extend_len = 1
    return reqs


def avoid_splitting_spans(spans: list[tuple[int, int]], start: int, end: int) -> int:
    """Move a chunk's ``end`` off any bidirectional span it cuts: back to the span's start, or
    past the span when the chunk starts inside or at it (a chunk then exceeds the budget rather
    than split it)."""
    for s, e in spans:
        if s < end < e:
            return s if s > start else e
    return end


@dataclass(frozen=True)
class RequestLimits:
    """What bounds a prefill batch besides its token budget: the running requests the pools
    were sized for, and the model's rule for what a prompt attends both ways (a chunk never
    ends inside such a span)."""

    max_running_requests: int
    bidirectional: Any


class PrefillPlanner:
    def __init__(
        self,
        args: ServerArgs,
        pools: Pools,
        embedder: MultimodalEmbedder,
        limits: RequestLimits,
        tree: RadixCache,
        states: LinearStateManager | None,
        hicache: HiCache | None = None,
    ) -> None:
        self.args = args
        self.hicache = hicache
        self.embedder = embedder
        self.kv_pool = pools.kv
        self.req_to_token = pools.req_to_token
        self.max_running_requests = limits.max_running_requests
        self.bidirectional = limits.bidirectional
        self.tree = tree
        self.states = states
        self.chunk_size = chunk_size(args, pools.device)

    def plan(self, waiting: deque[Req], running: list[Req]) -> ExtendPlan | None:
        """Plan the next extend batch: the prompts being chunked first, then waiting requests
        for as long as they fit (moved from ``waiting`` to ``running``). None: nothing to
        prefill."""
        decoding = self._decodes_to_mix(running)
        budget = min(self.chunk_size or self.args.max_prefill_tokens, self.args.max_prefill_tokens)
        budget = max(budget - len(decoding), 1)
        unbounded = self.chunk_size is None
        chosen: list[Req] = []
        for req in running:
            if req.is_prefilling and budget > 0:
                budget -= self._plan_extend(req, budget, unbounded and not chosen)
                chosen.append(req)
        while waiting and budget > 0 and len(running) < self.max_running_requests:
            req = waiting[0]
            if self.hicache is not None and not self.hicache.ready(req):
                break  # its pages are on their way from the store
            if not self._admit(req, running):
                break
            running.append(waiting.popleft())
            req.admit_time = time.perf_counter()
            budget -= self._plan_extend(req, budget, unbounded and not chosen)
            chosen.append(req)
        chosen = [r for r in chosen if r.extend_len > 0]
        return ExtendPlan(chosen, decoding) if chosen else None

    def _decodes_to_mix(self, running: list[Req]) -> list[Req]:
        """With ``--enable-mixed-chunk``, the running requests past their prompt, which then
        take their decode step in the prompt chunk's batch. Linear-attention models keep separate
        decode batches: their one-token step has its own recurrent kernel."""
        if not self.args.enable_mixed_chunk or self.states is not None:
            return []
        return ready_to_decode(running)

    def _admit(self, req: Req, running: list[Req]) -> bool:
        """Match the radix prefix, reserve KV for the whole request, take a request row."""
        if self.args.disable_radix_cache:
            slots, node = torch.empty(0, dtype=torch.int64), self.tree.root
        else:
            if self.hicache is not None:
                self.hicache.take(req)
            slots, node = self.tree.match_prefix(req.radix_key(req.uncached_from))
        self.tree.inc_lock_ref(node)
        req.cached_len = req.computed_len = len(slots)
        need = self._footprint(req) + sum(self._footprint(r) for r in running)
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

    @staticmethod
    def _footprint(req: Req) -> int:
        """KV slots the request still needs to finish: the rest of its prompt and decode."""
        decode_left = req.sampling_params.max_new_tokens - len(req.output_ids)
        return max(len(req.input_ids) - req.computed_len, 0) + max(decode_left, 0)

    def _plan_extend(self, req: Req, budget: int, may_exceed: bool) -> int:
        start = req.computed_len
        end = len(req.input_ids) if may_exceed else min(len(req.input_ids), start + budget)
        if self.bidirectional:
            end = avoid_splitting_spans(req.bidirectional_spans(), start, end)
        req.extend_len = end - start
        return req.extend_len

    def release(self, req: Req) -> None:
        """Undo admission: hand the request's KV (and linear-attention state) to the radix cache
        (or free it), unlock its prefix, free its row and drop its image pins."""
        row = req.req_pool_idx
        assert row is not None
        slots = self.req_to_token.req_to_token[row, : req.computed_len].clone()
        if self.args.disable_radix_cache:
            self.kv_pool.free(slots[req.cached_len :])
        else:
            if self.hicache is not None:
                self.hicache.on_release(req, slots)
            dup = self.tree.insert(req.radix_key(req.computed_len), slots)
            self.kv_pool.free(slots[req.cached_len : dup])
        if self.states is not None:
            self.states.release(req)
        self.tree.dec_lock_ref(req.last_node)
        self.req_to_token.free(row)
        req.req_pool_idx = None
        req.status = ReqStatus.FINISHED
        req.finish_time = time.perf_counter()
        self.embedder.release(req)
