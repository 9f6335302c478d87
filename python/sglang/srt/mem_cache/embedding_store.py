"""A fleet-wide multimodal embedding store: entries of the per-image cache shared by every worker
through an existing key-value engine (Redis), so an image is encoded once across a fleet and a
restarted worker reuses what it encoded before.

The connector has vLLM's ECConnector shape (``exists`` / ``load`` / ``save`` per content key) in
batched form. Guarantees:
- keys carry the model-and-preprocessing fingerprint: two models, dtypes or processor settings
  never read each other's entries;
- an entry is checked on arrival (fingerprint, key, dtype, token count, byte count, digest); a
  corrupt, truncated or foreign one is dropped, counted, and the item is encoded again;
- nothing is unpickled: an entry is a JSON header and raw tensor bytes;
- the store down, slow or full never fails a request: the operation is skipped, counted, and the
  store is left alone for ``retry_after_s`` after an error;
- the store bounds its own size (Redis ``maxmemory`` with an LRU policy); entries expire after
  ``ttl_s`` seconds when set.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from urllib.parse import urlparse

import torch

from sglang.srt.mem_cache.mm_embedding_cache import CachedEmbedding
from sglang.srt.mem_cache.store_backend import BlobBackend, RedisBlobs, StoreGuard
from sglang.srt.mem_cache.wire import InvalidEntry, pack, unpack

logger = logging.getLogger(__name__)

MAGIC = b"SGLEMB01"
__all__ = ["InvalidEntry", "EmbeddingStore", "decode_entry", "encode_entry"]


def encode_entry(entry: CachedEmbedding, fingerprint: str, key: int) -> bytes:
    """An embedding as bytes (``wire.pack``): the header adds the fingerprint and the key."""
    fields = {"fingerprint": fingerprint, "key": f"{key:016x}"}
    return pack(MAGIC, fields, [entry.embedding, *entry.extras])


def decode_entry(
    data: bytes,
    fingerprint: str,
    key: int,
    num_tokens: int,
    dtype: torch.dtype | None = None,
) -> CachedEmbedding:
    """The embedding in ``data``, checked against what the reader expects; raises
    ``InvalidEntry`` otherwise. The tensors own their storage."""
    header, tensors = unpack(data, MAGIC)
    if header.get("fingerprint") != fingerprint or header.get("key") != f"{key:016x}":
        raise InvalidEntry("written for another model, processor or item")
    if not tensors or any(t.dim() != 2 or t.shape[0] != num_tokens for t in tensors):
        shapes = [list(t.shape) for t in tensors]
        raise InvalidEntry(f"shapes {shapes} do not hold {num_tokens} tokens")
    if dtype is not None and any(t.dtype != dtype for t in tensors):
        raise InvalidEntry(f"dtype is not {dtype}")
    return CachedEmbedding(tensors[0], tensors[1:])


@dataclass
class StoreCounters:
    hits: int = 0
    misses: int = 0
    saved: int = 0
    rejected: int = 0  # entries that failed the checks on arrival
    bytes_loaded: int = 0
    bytes_saved: int = 0
    load_seconds: float = 0.0
    save_seconds: float = 0.0


class EmbeddingStore:
    """Batched exists / load / save of embeddings by item key over a ``BlobBackend``: this
    class names keys, encodes and checks entries, counts, and turns failures into misses."""

    def __init__(
        self,
        backend: BlobBackend,
        fingerprint: str,
        ttl_s: float | None,
        retry_after_s: float = 5.0,
    ) -> None:
        self.blobs = backend
        self.fingerprint = fingerprint
        self.ttl_s = ttl_s
        self.counters = StoreCounters()
        self.guard = StoreGuard("embedding store", retry_after_s)

    @property
    def backend(self) -> str:
        return self.blobs.kind

    def name(self, key: int) -> str:
        return f"sglang:mm:{self.fingerprint}:{key:016x}"

    @property
    def available(self) -> bool:
        """False for ``retry_after_s`` after a failed operation."""
        return self.guard.available

    def exists(self, key: int) -> bool:
        return bool(self.guard(lambda: self.blobs.exists(self.name(key))))

    def load(
        self, wanted: dict[int, int], dtype: torch.dtype | None = None
    ) -> dict[int, CachedEmbedding]:
        """The stored entries among ``wanted`` (key -> token count) that pass the checks."""
        if not wanted:
            return {}
        start = time.perf_counter()
        keys = list(wanted)
        blobs = self.guard(lambda: self.blobs.get_many([self.name(k) for k in keys]))
        if blobs is None:
            return {}
        found: dict[int, CachedEmbedding] = {}
        for key, blob in zip(keys, blobs):
            if blob is None:
                self.counters.misses += 1
                continue
            try:
                found[key] = decode_entry(blob, self.fingerprint, key, wanted[key], dtype)
            except InvalidEntry as e:
                logger.warning("embedding store entry %s rejected: %s", self.name(key), e)
                self.counters.rejected += 1
                self.guard(lambda k=key: self.blobs.delete(self.name(k)))
                continue
            self.counters.hits += 1
            self.counters.bytes_loaded += len(blob)
        self.counters.load_seconds += time.perf_counter() - start
        return found

    def save(self, entries: dict[int, CachedEmbedding]) -> None:
        if not entries:
            return
        start = time.perf_counter()
        blobs = {self.name(k): encode_entry(e, self.fingerprint, k) for k, e in entries.items()}
        if self.guard(lambda: self.blobs.put_many(blobs, self.ttl_s)) is not None:
            self.counters.saved += len(blobs)
            self.counters.bytes_saved += sum(len(b) for b in blobs.values())
        self.counters.save_seconds += time.perf_counter() - start

    def stats(self) -> dict[str, int | float | bool | str | None]:
        return {
            "backend": self.backend,
            "available": self.available,
            "last_error": self.guard.last_error,
            "errors": self.guard.errors,  # operations the store failed (down, slow, full)
            "skipped": self.guard.skipped,  # not tried while the store was marked down
            **vars(self.counters),
        }


STORE_SCHEMES = ("redis",)


def check_store_url(url: str) -> None:
    parsed = urlparse(url)
    if parsed.scheme not in STORE_SCHEMES or not parsed.hostname:
        raise ValueError(
            f"embedding store URL {url!r}: expected one of {sorted(STORE_SCHEMES)}://host:port"
        )


def open_embedding_store(
    url: str, fingerprint: str, ttl_s: float | None, timeout_s: float
) -> EmbeddingStore:
    """The store at ``url``, by its scheme. Connecting is lazy: a store that is down at start-up
    is tried again on use."""
    check_store_url(url)
    return EmbeddingStore(RedisBlobs(url, timeout_s), fingerprint, ttl_s)
