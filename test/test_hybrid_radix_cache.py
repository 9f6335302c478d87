"""Radix cache with linear-attention state snapshots: matches end at snapshots, the snapshot
budget is LRU, node eviction frees snapshots, and slot accounting holds under random use."""

from __future__ import annotations

import torch
from conftest import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang.srt.mem_cache.hybrid_radix_cache import HybridRadixCache
from sglang.srt.mem_cache.memory_pool import KVPool
from sglang.srt.mem_cache.radix_cache import RadixCache
from sglang.srt.mem_cache.state_pool import LinearStateShape, StatePool

SHAPE = LinearStateShape((0, 2), (6, 4), (2, 3, 3), torch.float32, torch.float32)


def _setup(capacity: int, kv: int = 256) -> tuple[KVPool, StatePool, HybridRadixCache]:
    kv_pool = KVPool(kv, [(1, 2)], dtype=torch.float32, device="cpu")
    states = StatePool(capacity + 4, SHAPE, "cpu")
    return kv_pool, states, HybridRadixCache(kv_pool.free, states, capacity)


def _insert(kv_pool: KVPool, tree: HybridRadixCache, key: list[int]) -> None:
    cached, node = tree.match_prefix(key)
    tree.inc_lock_ref(node)
    slots = torch.cat([cached, kv_pool.alloc(len(key) - len(cached))])
    dup = tree.insert(key, slots)
    kv_pool.free(slots[len(cached) : dup])
    tree.dec_lock_ref(node)


def _snapshot(tree: HybridRadixCache, key: list[int], evict: bool = True) -> int | None:
    slot = tree.reserve_snapshot(evict)
    if slot is not None:
        tree.attach_snapshot(key, slot)
    return slot


def test_match_stops_at_the_deepest_snapshot() -> None:
    kv_pool, states, tree = _setup(capacity=4)
    _insert(kv_pool, tree, [1, 2, 3, 4, 5, 6])
    assert tree.match_prefix([1, 2, 3, 4, 5, 6])[0].numel() == 0  # KV alone is not enough
    slot = _snapshot(tree, [1, 2, 3])
    got, node = tree.match_prefix([1, 2, 3, 4, 5, 9])
    assert len(got) == 3 and tree.snapshot_of(node) == slot
    _snapshot(tree, [1, 2, 3, 4, 5])
    assert len(tree.match_prefix([1, 2, 3, 4, 5, 6])[0]) == 5
    assert len(tree.match_prefix([1, 2, 3, 4])[0]) == 3
    tree.check_integrity()
    states.check_integrity(held=tree.num_snapshots)


def test_snapshot_budget_is_lru_and_frees_dead_leaves() -> None:
    kv_pool, states, tree = _setup(capacity=2)
    for first in (10, 20, 30):
        _insert(kv_pool, tree, [first, 1, 2])
        assert _snapshot(tree, [first, 1, 2]) is not None
    # The first branch lost its snapshot, and with it its KV: nothing could resume from it.
    assert tree.snapshot_evictions == 1 and tree.num_snapshots == 2
    assert 10 not in tree.root.children and tree.total_size == 6
    tree.match_prefix([20, 1, 2])  # touch: 30 becomes the least recently used
    _insert(kv_pool, tree, [40, 1])
    assert _snapshot(tree, [40, 1], evict=False) is None  # full, and told not to evict
    _snapshot(tree, [40, 1])
    assert len(tree.match_prefix([20, 1, 2])[0]) == 3 and len(tree.match_prefix([30, 1, 2])[0]) == 0
    tree.check_integrity()
    states.check_integrity(held=tree.num_snapshots)
    kv_pool.check_integrity(held=tree.total_size)


def test_kv_eviction_frees_snapshots_and_reset_frees_all() -> None:
    kv_pool, states, tree = _setup(capacity=3)
    _insert(kv_pool, tree, [1, 2, 3])
    _snapshot(tree, [1, 2])
    _snapshot(tree, [1, 2, 3])
    assert tree.evict(1) == 1  # the leaf [3] and its snapshot go; [1, 2] stays
    assert tree.num_snapshots == 1 and len(tree.match_prefix([1, 2, 3])[0]) == 2
    states.check_integrity(held=1)
    kv_pool.free(tree.held_slots())
    tree.reset()
    assert tree.num_snapshots == 0 and states.available_size() == states.size


def test_duplicate_and_unknown_positions_are_refused() -> None:
    kv_pool, states, tree = _setup(capacity=3)
    _insert(kv_pool, tree, [1, 2, 3])
    _snapshot(tree, [1, 2])
    slot = tree.reserve_snapshot(evict=True)
    assert slot is not None and not tree.attach_snapshot([1, 2], slot)  # already has one
    slot = tree.reserve_snapshot(evict=True)
    assert slot is not None and not tree.attach_snapshot([1, 9], slot)  # not in the tree
    assert tree.pending == 0 and tree.num_snapshots == 1
    states.check_integrity(held=1)


ops = st.lists(
    st.tuples(
        st.sampled_from(["insert", "snapshot", "evict", "match"]),
        st.lists(st.integers(0, 3), min_size=1, max_size=8),
        st.integers(1, 12),
    ),
    max_size=40,
)


@settings(max_examples=examples(120), deadline=None)
@given(ops, st.integers(0, 4))
def test_random_operations_keep_slot_accounting(operations, capacity) -> None:
    kv_pool, states, tree = _setup(capacity, kv=64)
    for op, key, n in operations:
        if op == "insert":
            if kv_pool.available_size() >= len(key):
                _insert(kv_pool, tree, key)
        elif op == "snapshot":
            held = len(RadixCache.match_prefix(tree, key)[0])  # KV held, snapshot or not
            if held:
                _snapshot(tree, key[: min(held, n)], evict=n % 2 == 0)
        elif op == "evict":
            tree.evict(n)
        else:
            got, node = tree.match_prefix(key)
            assert (tree.snapshot_of(node) is not None) == (len(got) > 0)
        tree.check_integrity()
        states.check_integrity(held=tree.num_snapshots)
        kv_pool.check_integrity(held=tree.total_size)
    tree.evict(10**6)
    assert tree.total_size == 0 and states.available_size() == states.size
