"""Per-image embedding cache: content hash -> vision-encoder output, under a byte budget.

Invariants (checked by ``check_integrity``):
- ``bytes_used`` is the sum of the entries' sizes and never exceeds ``capacity_bytes``;
- entries are kept in least-recently-used order; only unpinned entries are evicted;
- pin counts are positive for pinned keys and every pinned key is present;
- each entry owns its tensors (no view into a larger batch tensor keeps that tensor alive).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass, field

import torch

logger = logging.getLogger(__name__)


@dataclass
class CachedEmbedding:
    """An item's encoder output: ``embedding`` is (num_tokens, hidden); ``extras`` holds
    per-token model extras of the same length (e.g. Qwen3-VL deepstack features per layer)."""

    embedding: torch.Tensor
    extras: list[torch.Tensor] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return self.embedding.shape[0]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.embedding, *self.extras))

    def owned(self) -> CachedEmbedding:
        """A copy whose tensors own their storage."""
        return CachedEmbedding(self.embedding.clone(), [t.clone() for t in self.extras])


@dataclass
class CacheCounters:
    hits: int = 0
    misses: int = 0
    evictions: int = 0
    rejected: int = 0
    collisions: int = 0


class MultimodalEmbeddingCache:
    def __init__(self, capacity_bytes: int) -> None:
        self.capacity_bytes = capacity_bytes
        self._entries: OrderedDict[int, CachedEmbedding] = OrderedDict()
        self._pins: dict[int, int] = {}
        self.bytes_used = 0
        self.counters = CacheCounters()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: int) -> bool:
        return key in self._entries

    def get(self, key: int, num_tokens: int) -> CachedEmbedding | None:
        """The entry for ``key`` if its token count matches ``num_tokens`` (collision guard)."""
        entry = self._entries.get(key)
        if entry is not None and entry.num_tokens != num_tokens:
            logger.warning(
                "embedding cache entry %x has %d tokens, item needs %d: dropping it",
                key,
                entry.num_tokens,
                num_tokens,
            )
            self.counters.collisions += 1
            if key not in self._pins:
                self._remove(key)
            entry = None
        if entry is None:
            self.counters.misses += 1
            return None
        self.counters.hits += 1
        self._entries.move_to_end(key)
        return entry

    def put(self, key: int, entry: CachedEmbedding) -> bool:
        """Admit ``entry`` (which must own its storage), evicting unpinned LRU entries as needed.
        Returns False when it cannot fit: larger than the budget, or the rest is pinned."""
        if key in self._entries:
            self._entries.move_to_end(key)
            return True
        size = entry.nbytes
        if size > self.capacity_bytes or size > self.capacity_bytes - self._pinned_bytes():
            self.counters.rejected += 1
            return False
        while self.bytes_used + size > self.capacity_bytes:
            victim = next(k for k in self._entries if k not in self._pins)
            self._remove(victim)
            self.counters.evictions += 1
        self._entries[key] = entry
        self.bytes_used += size
        return True

    def pin(self, key: int) -> None:
        if key in self._entries:
            self._pins[key] = self._pins.get(key, 0) + 1

    def unpin(self, key: int) -> None:
        count = self._pins.get(key, 0)
        if count <= 1:
            self._pins.pop(key, None)
        else:
            self._pins[key] = count - 1

    @property
    def num_pinned(self) -> int:
        return sum(self._pins.values())

    def stats(self) -> dict[str, int]:
        """Counters and occupancy, as ``/server_info`` reports them."""
        return {
            "hits": self.counters.hits,
            "misses": self.counters.misses,
            "evictions": self.counters.evictions,
            "entries": len(self),
            "bytes_used": self.bytes_used,
            "capacity_bytes": self.capacity_bytes,
            "pinned": self.num_pinned,
        }

    def clear(self) -> None:
        """Drop every unpinned entry."""
        for key in [k for k in self._entries if k not in self._pins]:
            self._remove(key)

    def _remove(self, key: int) -> None:
        self.bytes_used -= self._entries.pop(key).nbytes

    def _pinned_bytes(self) -> int:
        return sum(self._entries[k].nbytes for k in self._pins)

    def check_integrity(self) -> None:
        assert self.bytes_used == sum(e.nbytes for e in self._entries.values())
        assert self.bytes_used <= self.capacity_bytes, "embedding cache over budget"
        for key, count in self._pins.items():
            assert count > 0 and key in self._entries, f"bad pin on {key:x}"
        for entry in self._entries.values():
            for t in (entry.embedding, *entry.extras):
                assert t.untyped_storage().nbytes() == t.numel() * t.element_size(), (
                    "cache entry is a view into a larger tensor"
                )
