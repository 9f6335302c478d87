"""Prefix cache for hybrid models: per-token KV of the full-attention layers (as ``RadixCache``)
plus snapshots of the linear-attention state at some node ends.

A linear-attention layer's state after a prefix cannot be rebuilt from per-token data: a cached
prefix is usable only up to a point where the state after exactly that prefix was saved. So a
node may own a snapshot (a ``StatePool`` slot holding the state after the tokens from the root to
the node's end), and ``match_prefix`` stops at the deepest matched node that owns one. Snapshots
live under their own budget (``capacity`` slots) with LRU eviction; evicting a snapshot keeps the
node's KV (an ancestor of another snapshot still needs it), evicting a node frees its snapshot.

Snapshots are taken while requests run (``reserve_snapshot``: the slot is "pending" and owned by
the request) and handed to the tree when the request's tokens are inserted
(``attach_snapshot``); a running request's own state slot can be handed over the same way.

Invariants (checked by ``check_integrity``, on top of ``RadixCache``'s):
- every snapshot belongs to a node of the tree, at most one per node, and snapshot slots are
  distinct;
- snapshots in the tree plus pending ones never exceed ``capacity``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence

import torch

from sglang.srt.mem_cache.radix_cache import RadixCache, TreeNode, _match_len
from sglang.srt.mem_cache.state_pool import StatePool


class HybridRadixCache(RadixCache):
    def __init__(
        self, free_slots: Callable[[torch.Tensor], None], state_pool: StatePool, capacity: int
    ) -> None:
        self.state_pool = state_pool
        self.capacity = capacity
        self._snapshots: OrderedDict[TreeNode, int] = OrderedDict()  # LRU first
        self.pending = 0
        self.snapshot_evictions = 0
        super().__init__(free_slots)

    def reset(self) -> None:
        for slot in getattr(self, "_snapshots", {}).values():
            self.state_pool.free(slot)
        self._snapshots = OrderedDict()
        super().reset()

    @property
    def num_snapshots(self) -> int:
        return len(self._snapshots)

    def snapshot_of(self, node: TreeNode) -> int | None:
        return self._snapshots.get(node)

    # Matching ----------------------------------------------------------------------------------
    def match_prefix(self, key: Sequence[int]) -> tuple[torch.Tensor, TreeNode]:
        """Longest cached prefix of ``key`` that ends at a snapshot: its KV slots and that node
        (the root when there is none)."""
        slots, node = super().match_prefix(key)
        depth = len(slots)
        while node is not self.root and node not in self._snapshots:
            depth -= len(node.key)
            node = node.parent  # type: ignore[assignment]
        if node in self._snapshots:
            self._snapshots.move_to_end(node)
        return slots[:depth], node

    # Snapshots ---------------------------------------------------------------------------------
    def reserve_snapshot(self, evict: bool) -> int | None:
        """A state slot for a snapshot to be taken, counted as pending until attached or
        cancelled; None when the budget is full (and ``evict`` is False, or nothing can go)."""
        if not self._make_room(evict):
            return None
        slot = self.state_pool.alloc()
        assert slot is not None, "the state pool holds capacity snapshot slots"
        self.pending += 1
        return slot

    def cancel_snapshot(self, slot: int) -> None:
        self.pending -= 1
        self.state_pool.free(slot)

    def attach_snapshot(self, key: Sequence[int], slot: int, reserved: bool = True) -> bool:
        """Give ``slot`` (the state after exactly ``key``, already inserted) to the node ending
        there. ``reserved``: the slot came from ``reserve_snapshot``; otherwise it is a request's
        own state slot, admitted if the budget allows. Returns whether the tree kept it (when
        not, the slot is freed)."""
        if reserved:
            self.pending -= 1
        elif not self._make_room(evict=True):
            self.state_pool.free(slot)
            return False
        node = self._node_at(key)
        if node is None or node in self._snapshots:
            self.state_pool.free(slot)
            return False
        self._snapshots[node] = slot
        return True

    def _make_room(self, evict: bool) -> bool:
        while self.num_snapshots + self.pending >= self.capacity:
            if not (evict and self._snapshots):
                return False
            node, slot = self._snapshots.popitem(last=False)
            self.state_pool.free(slot)
            self.snapshot_evictions += 1
            self._prune(node)
        return True

    def _prune(self, node: TreeNode) -> None:
        """Drop unlocked leaves that no longer lead to any snapshot: their KV is unusable."""
        while (
            node is not self.root
            and not node.children
            and node.lock_ref == 0
            and node not in self._snapshots
        ):
            node = self._remove_leaf(node)

    def _node_at(self, key: Sequence[int]) -> TreeNode | None:
        """The node ending exactly after ``key`` (splitting one if needed), or None."""
        node, done = self.root, 0
        while done < len(key):
            child = node.children.get(key[done])
            if child is None:
                return None
            n = _match_len(child.key, key[done:])
            if n < len(child.key):
                if done + n < len(key):
                    return None
                child = self._split(child, n)
            node, done = child, done + n
        return None if node is self.root else node

    def _remove_leaf(self, leaf: TreeNode) -> TreeNode:
        slot = self._snapshots.pop(leaf, None)
        if slot is not None:
            self.state_pool.free(slot)
        return super()._remove_leaf(leaf)

    def check_integrity(self) -> None:
        super().check_integrity()
        nodes = set(self._nodes())
        assert all(node in nodes for node in self._snapshots), "snapshot on a node not in tree"
        slots = list(self._snapshots.values())
        assert len(set(slots)) == len(slots), "a state slot is held by two snapshots"
        assert 0 <= self.pending and self.num_snapshots + self.pending <= self.capacity, (
            f"snapshots over budget: {self.num_snapshots} + {self.pending} pending "
            f"> {self.capacity}"
        )
