"""A ``ForwardBatch`` from planned requests: KV slots for this step's tokens (recorded in each
request's ``req_to_token`` row), packed token ids, positions (1-D, or 3-D for M-RoPE)."""

from __future__ import annotations

import logging

import torch

from sglang.srt.core.forward_batch import ForwardBatch
from sglang.srt.core.req import Req
from sglang.srt.managers.constraints import ConstraintManager
from sglang.srt.managers.linear_state import LinearStateManager
from sglang.srt.managers.step_failure import StepFailure
from sglang.srt.mem_cache.pools import Pools
from sglang.srt.mem_cache.radix_cache import RadixCache

logger = logging.getLogger(__name__)


class BatchBuilder:
    def __init__(
        self,
        pools: Pools,
        tree: RadixCache,
        states: LinearStateManager | None,
        constraints: ConstraintManager,
    ) -> None:
        self.device = pools.device
        self.kv_pool = pools.kv
        self.req_to_token = pools.req_to_token
        self.tree = tree
        self.states = states
        self.constraints = constraints

    def build(
        self, reqs: list[Req], is_decode: bool
    ) -> tuple[ForwardBatch | None, list[StepFailure]]:
        """The batch of ``reqs`` for their ``[computed_len, computed_len + extend_len)``, and
        the requests whose inputs could not be prepared (left out, with ``extend_len`` 0)."""
        ids: list[int] = []
        positions, locs, kept, failed = [], [], [], []
        for req in reqs:
            start, end = req.computed_len, req.computed_len + req.extend_len
            try:
                req_ids, req_positions = req.token_ids(start, end), req.positions(start, end)
            except Exception as exc:
                logger.exception("inputs of request %s failed", req.rid)
                req.extend_len = 0
                failed.append(StepFailure(req, f"cannot prepare the inputs of this request: {exc}"))
                continue
            slots = self._alloc_slots(req.extend_len)
            self.req_to_token.req_to_token[req.req_pool_idx, start:end] = slots
            ids.extend(req_ids)
            positions.append(req_positions)
            locs.append(slots)
            kept.append(req)
        if not kept:
            return None, failed
        self.constraints.prepare(kept)
        batch = ForwardBatch(
            reqs=kept,
            input_ids=torch.tensor(ids, dtype=torch.int64, device=self.device),
            positions=torch.cat(positions, dim=-1).to(self.device),
            out_cache_loc=torch.cat(locs).to(self.device),
            req_pool_indices=[r.req_pool_idx for r in kept],  # type: ignore[misc]
            prefix_lens=[r.computed_len for r in kept],
            extend_lens=[r.extend_len for r in kept],
            bidirectional_spans=[r.bidirectional_spans() for r in kept],
            is_decode=is_decode,
        )
        if self.states is not None:
            batch.state_plan = self.states.plan(batch)
        return batch, failed

    def free_step_slots(self, req: Req) -> None:
        """Give back the slots this step gave ``req`` (its forward failed)."""
        row = req.req_pool_idx
        start, end = req.computed_len, req.computed_len + req.extend_len
        self.kv_pool.free(self.req_to_token.req_to_token[row, start:end].clone())
        req.extend_len = 0

    def _alloc_slots(self, n: int) -> torch.Tensor:
        slots = self.kv_pool.alloc(n)
        if slots is None:
            self.tree.evict(n - self.kv_pool.available_size())
            slots = self.kv_pool.alloc(n)
        if slots is None:
            raise RuntimeError("KV pool exhausted despite admission control")
        return slots
