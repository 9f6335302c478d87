"""Radix tree over token keys whose values are KV slot indices (page size 1).

Keys are the request's token ids with every image placeholder replaced by a value derived from
that image's content hash, so two different images never share KV.

Invariants (checked by ``check_integrity``):
- a node's ``len(key) == len(value)``; children are indexed by the first token of their key;
- ``lock_ref`` >= 0, and a locked node's ancestors are locked at least as often;
- ``evictable_size + protected_size`` equals the number of slots held by the tree, where a slot is
  protected while its node is locked by a running request;
- every slot held by the tree is distinct and owned by the tree alone.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Sequence

import torch

_clock = itertools.count()


class TreeNode:
    def __init__(self, parent: TreeNode | None = None) -> None:
        self.parent = parent
        self.children: dict[int, TreeNode] = {}
        self.key: list[int] = []
        self.value: torch.Tensor = torch.empty(0, dtype=torch.int64)
        self.lock_ref = 0
        self.last_access = next(_clock)

    def __lt__(self, other: TreeNode) -> bool:
        return self.last_access < other.last_access


def _match_len(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


class RadixCache:
    def __init__(self, free_slots: Callable[[torch.Tensor], None]) -> None:
        self._free_slots = free_slots
        self.on_evict: Callable[[TreeNode], None] | None = None  # sees a leaf before it goes
        self.reset()

    def reset(self) -> None:
        self.root = TreeNode()
        self.root.lock_ref = 1
        self.evictable_size = 0
        self.protected_size = 0

    @property
    def total_size(self) -> int:
        return self.evictable_size + self.protected_size

    def match_prefix(self, key: Sequence[int]) -> tuple[torch.Tensor, TreeNode]:
        """Longest cached prefix of ``key``: its KV slots and the node where it ends."""
        node, values = self.root, []
        node.last_access = next(_clock)
        while key and key[0] in node.children:
            child = node.children[key[0]]
            n = _match_len(child.key, key)
            if n < len(child.key):
                child = self._split(child, n)
            child.last_access = next(_clock)
            values.append(child.value)
            node, key = child, key[n:]
        slots = torch.cat(values) if values else torch.empty(0, dtype=torch.int64)
        return slots, node

    def insert(self, key: Sequence[int], value: torch.Tensor) -> int:
        """Store ``key -> value``; return how many leading tokens were already cached.

        The caller still owns ``value[:returned]`` (duplicates of tree slots) and must free them
        unless they were the tree's own slots to begin with.
        """
        assert len(key) == len(value)
        node, done = self.root, 0
        while done < len(key):
            first = key[done]
            if first not in node.children:
                leaf = TreeNode(node)
                leaf.key = list(key[done:])
                leaf.value = value[done:].clone()
                node.children[first] = leaf
                self.evictable_size += len(leaf.key)
                return done
            child = node.children[first]
            n = _match_len(child.key, key[done:])
            if n < len(child.key):
                child = self._split(child, n)
            child.last_access = next(_clock)
            node, done = child, done + n
        return done

    def _split(self, child: TreeNode, n: int) -> TreeNode:
        """Cut ``child`` after ``n`` tokens; return the new upper node."""
        upper = TreeNode(child.parent)
        upper.key, upper.value = child.key[:n], child.value[:n]
        upper.lock_ref = child.lock_ref
        upper.children = {child.key[n]: child}
        assert child.parent is not None
        child.parent.children[child.key[0]] = upper
        child.parent = upper
        child.key, child.value = child.key[n:], child.value[n:]
        return upper

    def inc_lock_ref(self, node: TreeNode) -> None:
        while node is not self.root:
            if node.lock_ref == 0:
                self.evictable_size -= len(node.key)
                self.protected_size += len(node.key)
            node.lock_ref += 1
            node = node.parent  # type: ignore[assignment]

    def dec_lock_ref(self, node: TreeNode) -> None:
        while node is not self.root:
            assert node.lock_ref > 0, "lock_ref underflow"
            if node.lock_ref == 1:
                self.evictable_size += len(node.key)
                self.protected_size -= len(node.key)
            node.lock_ref -= 1
            node = node.parent  # type: ignore[assignment]

    def evict(self, num_tokens: int) -> int:
        """Free at least ``num_tokens`` slots from unlocked leaves, least recently used first."""
        heap = [n for n in self._nodes() if not n.children and n.lock_ref == 0]
        heapq.heapify(heap)
        freed = 0
        while freed < num_tokens and heap:
            leaf = heapq.heappop(heap)
            if self.on_evict is not None:
                self.on_evict(leaf)
            freed += len(leaf.key)
            parent = self._remove_leaf(leaf)
            if parent is not self.root and not parent.children and parent.lock_ref == 0:
                heapq.heappush(heap, parent)
        return freed

    def _remove_leaf(self, leaf: TreeNode) -> TreeNode:
        """Free an unlocked leaf's slots and drop it from the tree; return its parent."""
        self._free_slots(leaf.value)
        self.evictable_size -= len(leaf.key)
        parent = leaf.parent
        assert parent is not None
        del parent.children[leaf.key[0]]
        return parent

    def held_slots(self) -> torch.Tensor:
        values = [n.value for n in self._nodes()]
        return torch.cat(values) if values else torch.empty(0, dtype=torch.int64)

    def _nodes(self) -> list[TreeNode]:
        out, stack = [], list(self.root.children.values())
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(node.children.values())
        return out

    def check_integrity(self) -> None:
        evictable = protected = 0
        for node in self._nodes():
            assert len(node.key) == len(node.value) > 0, "empty or mismatched node"
            assert node.parent is not None and node.parent.children[node.key[0]] is node
            assert node.lock_ref >= 0
            if node.parent is not self.root:
                assert node.parent.lock_ref >= node.lock_ref, "child locked more than parent"
            if node.lock_ref:
                protected += len(node.key)
            else:
                evictable += len(node.key)
        assert (evictable, protected) == (self.evictable_size, self.protected_size), (
            f"size accounting off: counted {(evictable, protected)}, "
            f"recorded {(self.evictable_size, self.protected_size)}"
        )
        slots = self.held_slots()
        assert slots.unique().numel() == slots.numel(), "a KV slot is held twice by the tree"
