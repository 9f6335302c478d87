"""The scheduler's side of hybrid models: each running request's linear-attention state slot,
and the snapshot policy of the prefix cache.

Snapshot policy (the points a later request can resume from; see ``HybridRadixCache``):
- the end of a finished (or aborted) request's computed sequence: its own state slot is handed to
  the tree, no copy;
- inside the prompt, where a follow-up turn of a chat reuses it: just before the last turn header
  (the first token of the chat template's generation prompt, e.g. ``<|im_start|>``), since a
  template may re-render the previous answer differently (Qwen3.5 drops its thinking), and one
  token before the prompt's end (the same prompt again); these cost one extra call of each
  linear-attention layer in the step that crosses them, and evict older snapshots if needed;
- the end of every prompt chunk, only while the budget has room without evicting anything.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sglang.srt.mem_cache.hybrid_radix_cache import HybridRadixCache
from sglang.srt.mem_cache.radix_cache import TreeNode
from sglang.srt.mem_cache.state_pool import StatePool
from sglang.srt.model_executor.linear_attention import Segment, StatePlan

if TYPE_CHECKING:
    from sglang.srt.core.forward_batch import ForwardBatch
    from sglang.srt.core.req import Req


@dataclass
class _ReqState:
    slot: int
    fresh: bool  # nothing computed yet: the layers start from zero state
    points: frozenset[int]  # prefix lengths worth a snapshot
    pending: list[tuple[int, int]] = field(default_factory=list)  # (prefix length, slot), taken
    in_flight: list[tuple[int, int]] = field(default_factory=list)  # taken by the running step
    step: Segment | None = None  # the running step's segment (its ``written`` flag)


class LinearStateManager:
    """Invariant: every running request holds exactly one state slot of ``pool``, holding the
    state after its ``computed_len`` tokens (between steps); pool slots are held by running
    requests, tree snapshots or pending snapshots, and nothing else."""

    def __init__(
        self,
        pool: StatePool,
        tree: HybridRadixCache,
        max_requests: int,
        caching: bool,
        turn_start_id: int | None,
    ) -> None:
        self.pool = pool
        self.tree = tree
        self.max_requests = max_requests
        self.caching = caching
        self.turn_start_id = turn_start_id
        self._reqs: dict[int, _ReqState] = {}
        self.restored = 0  # admissions that resumed from a snapshot

    # Admission ---------------------------------------------------------------------------------
    def can_admit(self) -> bool:
        return len(self._reqs) < self.max_requests

    def admit(self, req: Req, node: TreeNode) -> None:
        """Give ``req`` a state slot, restored from ``node``'s snapshot when it has a cached
        prefix (``node`` is where its radix match ended)."""
        slot = self.pool.alloc()
        assert slot is not None, "state slots are reserved for max_running_requests"
        snapshot = self.tree.snapshot_of(node) if req.cached_len else None
        assert (snapshot is not None) == (req.cached_len > 0), "a hit must end at a snapshot"
        if snapshot is not None:
            self.pool.copy(snapshot, slot)
            self.restored += 1
        self._reqs[id(req)] = _ReqState(slot, snapshot is None, self._points(req))

    def _points(self, req: Req) -> frozenset[int]:
        if not self.caching:
            return frozenset()
        ids, n = req.input_ids, len(req.input_ids)
        points = {n - 1} if n > 1 else set()
        if self.turn_start_id is not None and self.turn_start_id in ids:
            last = n - 1 - ids[::-1].index(self.turn_start_id)
            if last > 0:
                points.add(last)
        return frozenset(points)

    # Steps -------------------------------------------------------------------------------------
    def plan(self, batch: ForwardBatch) -> StatePlan:
        segments = []
        for req, prefix, extend in zip(batch.reqs, batch.prefix_lens, batch.extend_lens):
            state = self._reqs[id(req)]
            cuts = [] if batch.is_decode else self._snapshot_cuts(req, state, prefix, extend)
            state.step = Segment(extend, state.slot, state.fresh, cuts)
            segments.append(state.step)
        return StatePlan(self.pool, segments, batch.is_decode)

    def _snapshot_cuts(
        self, req: Req, state: _ReqState, prefix: int, extend: int
    ) -> list[tuple[int, int]]:
        end = prefix + extend
        wanted = [(p, True) for p in sorted(state.points) if prefix < p <= end]
        if self.caching and end < len(req.input_ids) and end not in state.points:
            wanted.append((end, False))  # a chunk boundary: only into free room
        for pos, evict in wanted:
            slot = self.tree.reserve_snapshot(evict)
            if slot is not None:
                state.in_flight.append((pos, slot))
        return [(pos - prefix, slot) for pos, slot in state.in_flight]

    def step_done(self, batch: ForwardBatch) -> None:
        """The step's forward succeeded: its snapshots hold valid state."""
        for req in batch.reqs:
            state = self._reqs[id(req)]
            state.fresh, state.step = False, None
            state.pending += state.in_flight
            state.in_flight = []

    def is_dirty(self, req: Req) -> bool:
        """Whether a step that did not complete has (maybe partly) changed ``req``'s state."""
        step = self._reqs[id(req)].step
        return step is not None and step.written

    # Release -----------------------------------------------------------------------------------
    def release(self, req: Req) -> None:
        """``req`` leaves; call after its tokens went into the tree (when caching). Its
        snapshots and its final state go to the tree, unless a failed step left that state
        half written; the rest is freed."""
        dirty = self.is_dirty(req)
        state = self._reqs.pop(id(req))
        for _, slot in state.in_flight:
            self.tree.cancel_snapshot(slot)
        if not self.caching:
            for _, slot in state.pending:
                self.tree.cancel_snapshot(slot)
            self.pool.free(state.slot)
            return
        key = req.radix_key(req.computed_len)
        for pos, slot in state.pending:
            self.tree.attach_snapshot(key[:pos], slot)
        if not dirty and not state.fresh and req.computed_len > 0:
            self.tree.attach_snapshot(key, state.slot, reserved=False)
        else:
            self.pool.free(state.slot)

    # Introspection -----------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        return {
            "state_slots": self.pool.size,
            "state_slot_bytes": self.pool.bytes_per_slot,
            "request_slots": self.max_requests,
            "snapshot_capacity": self.tree.capacity,
            "snapshots": self.tree.num_snapshots,
            "snapshot_evictions": self.tree.snapshot_evictions,
            "restored": self.restored,
        }

    def check_integrity(self, running: list[Req]) -> None:
        assert {id(r) for r in running} == set(self._reqs), "running requests without state"
        slots = [s.slot for s in self._reqs.values()]
        assert len(set(slots)) == len(slots), "two requests share a state slot"
        assert all(not s.in_flight and s.step is None for s in self._reqs.values()), (
            "a step left unfinished"
        )
        pending = sum(len(s.pending) for s in self._reqs.values())
        assert pending == self.tree.pending, "pending snapshot count is off"
        self.pool.check_integrity(len(slots) + self.tree.num_snapshots + pending)


def turn_start_token(tokenizer: Any) -> int | None:
    """The first token of the chat template's generation prompt when it is a special token
    (e.g. ``<|im_start|>``): the header of every turn, so its last occurrence in a prompt marks
    where the conversation's history ends."""
    messages = [{"role": "user", "content": "x"}]
    try:
        bare = tokenizer.apply_chat_template(messages, tokenize=False)
        prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    except Exception:  # no template, or one that needs more than a user message
        return None
    if not isinstance(prompt, str) or not prompt.startswith(bare) or prompt == bare:
        return None
    ids = tokenizer(prompt[len(bare) :], add_special_tokens=False)["input_ids"]
    added = getattr(tokenizer, "added_tokens_decoder", {})
    specials = {i for i, token in added.items() if getattr(token, "special", False)}
    return ids[0] if ids and ids[0] in specials | set(tokenizer.all_special_ids) else None
