"""The per-image embedding cache: budget, LRU order, pins, collision guard."""

from __future__ import annotations

import torch

from sglang.srt.mem_cache.mm_embedding_cache import CachedEmbedding, MultimodalEmbeddingCache


def _entry(tokens: int, hidden: int = 4) -> CachedEmbedding:
    return CachedEmbedding(torch.zeros(tokens, hidden))


def test_lru_eviction_under_budget() -> None:
    one = _entry(4).nbytes
    cache = MultimodalEmbeddingCache(capacity_bytes=2 * one)
    assert cache.put(1, _entry(4)) and cache.put(2, _entry(4))
    assert cache.get(1, 4) is not None  # 2 is now least recently used
    assert cache.put(3, _entry(4))
    assert 2 not in cache and 1 in cache and 3 in cache
    assert cache.counters.evictions == 1
    cache.check_integrity()


def test_pinned_entries_are_not_evicted_and_big_items_not_admitted() -> None:
    one = _entry(4).nbytes
    cache = MultimodalEmbeddingCache(capacity_bytes=one)
    assert cache.put(1, _entry(4))
    cache.pin(1)
    assert not cache.put(2, _entry(4))
    assert 1 in cache and 2 not in cache
    cache.unpin(1)
    assert cache.put(2, _entry(4)) and 1 not in cache
    assert not cache.put(3, _entry(8))
    assert cache.counters.rejected == 2
    cache.check_integrity()


def test_token_count_mismatch_is_a_miss() -> None:
    cache = MultimodalEmbeddingCache(capacity_bytes=1 << 20)
    cache.put(7, _entry(4))
    assert cache.get(7, 5) is None
    assert 7 not in cache
    assert cache.counters.collisions == 1 and cache.counters.misses == 1


def test_views_into_batch_tensors_are_detected() -> None:
    batch = torch.zeros(8, 4)
    cache = MultimodalEmbeddingCache(capacity_bytes=1 << 20)
    cache.put(1, CachedEmbedding(batch[:4]))
    try:
        cache.check_integrity()
    except AssertionError:
        pass
    else:
        raise AssertionError("a view entry passed the integrity check")
    cache.clear()
    cache.put(1, CachedEmbedding(batch[:4]).owned())
    cache.check_integrity()
