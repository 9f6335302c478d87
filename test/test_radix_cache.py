"""Radix cache and KV pool invariants under random insert / match / lock / evict sequences."""

from __future__ import annotations

import torch
from conftest import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang.srt.mem_cache.memory_pool import KVPool
from sglang.srt.mem_cache.radix_cache import RadixCache


def _setup(size: int = 256) -> tuple[KVPool, RadixCache]:
    pool = KVPool(size, [(1, 2)], dtype=torch.float32, device="cpu")
    return pool, RadixCache(pool.free)


def test_match_returns_longest_prefix_and_splits() -> None:
    pool, tree = _setup()
    slots = pool.alloc(5)
    assert tree.insert([1, 2, 3, 4, 5], slots) == 0
    got, node = tree.match_prefix([1, 2, 3, 9])
    assert got.tolist() == slots[:3].tolist()
    assert node.key == [1, 2, 3]
    other = pool.alloc(2)
    assert tree.insert([1, 2, 7, 8], torch.cat([slots[:2], other])) == 2
    assert tree.match_prefix([1, 2, 7, 8])[0].tolist() == [*slots[:2].tolist(), *other.tolist()]
    tree.check_integrity()


def test_locked_nodes_survive_eviction() -> None:
    pool, tree = _setup()
    a, b = pool.alloc(3), pool.alloc(3)
    tree.insert([1, 2, 3], a)
    tree.insert([4, 5, 6], b)
    _, node = tree.match_prefix([1, 2, 3])
    tree.inc_lock_ref(node)
    assert tree.evict(100) == 3
    assert tree.match_prefix([1, 2, 3])[0].tolist() == a.tolist()
    assert tree.match_prefix([4, 5, 6])[0].numel() == 0
    tree.dec_lock_ref(node)
    assert tree.evictable_size == 3 and tree.protected_size == 0
    tree.check_integrity()


ops = st.lists(
    st.tuples(
        st.sampled_from(["insert", "lock", "evict"]),
        st.lists(st.integers(0, 3), min_size=1, max_size=8),
        st.integers(1, 20),
    ),
    max_size=40,
)


@settings(max_examples=examples(150), deadline=None)
@given(ops)
def test_random_operations_keep_invariants(operations) -> None:
    pool, tree = _setup(64)
    locks = []
    for op, key, n in operations:
        if op == "insert":
            cached, node = tree.match_prefix(key)
            new = pool.alloc(len(key) - len(cached))
            if new is None:
                continue
            dup = tree.insert(key, torch.cat([cached, new]))
            assert dup == len(cached)
        elif op == "lock":
            _, node = tree.match_prefix(key)
            tree.inc_lock_ref(node)
            locks.append(node)
        else:
            before = tree.evictable_size
            freed = tree.evict(n)
            assert freed <= before and (freed >= n or tree.evictable_size == 0)
        tree.check_integrity()
        pool.check_integrity(held=tree.total_size)
    for node in locks:
        tree.dec_lock_ref(node)
    assert tree.protected_size == 0
    tree.evict(10**6)
    assert tree.total_size == 0 and pool.available_size() == pool.size
