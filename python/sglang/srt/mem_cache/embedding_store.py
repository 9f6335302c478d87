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

import hashlib
import json
import logging
import struct
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from urllib.parse import urlparse

import torch

from sglang.srt.mem_cache.mm_embedding_cache import CachedEmbedding

logger = logging.getLogger(__name__)

MAGIC = b"SGLEMB01"
_HEADER_LEN = struct.Struct("<I")
MAX_HEADER_BYTES = 1 << 16
WIRE_DTYPES = {
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float32": torch.float32,
}
_DTYPE_NAMES = {dtype: name for name, dtype in WIRE_DTYPES.items()}


class InvalidEntry(ValueError):
    """An entry that is not what the reader expects (corrupt, truncated, foreign)."""


def _digest(payload: bytes | memoryview) -> str:
    return hashlib.blake2b(payload, digest_size=16).hexdigest()


def encode_entry(entry: CachedEmbedding, fingerprint: str, key: int) -> bytes:
    """An embedding as bytes: MAGIC, a little-endian u32 header length, a JSON header
    (fingerprint, key, each tensor's dtype and shape, the payload's digest), then the tensors'
    raw bytes in order."""
    tensors = [t.detach().contiguous().cpu() for t in (entry.embedding, *entry.extras)]
    for t in tensors:
        if t.dtype not in _DTYPE_NAMES:
            raise ValueError(f"embeddings travel as {sorted(WIRE_DTYPES)}, not {t.dtype}")
    payload = b"".join(t.view(torch.uint8).numpy().tobytes() for t in tensors)
    header = json.dumps(
        {
            "fingerprint": fingerprint,
            "key": f"{key:016x}",
            "tensors": [{"dtype": _DTYPE_NAMES[t.dtype], "shape": list(t.shape)} for t in tensors],
            "digest": _digest(payload),
        }
    ).encode()
    return MAGIC + _HEADER_LEN.pack(len(header)) + header + payload


def decode_entry(
    data: bytes,
    fingerprint: str,
    key: int,
    num_tokens: int,
    dtype: torch.dtype | None = None,
) -> CachedEmbedding:
    """The embedding in ``data``, checked against what the reader expects; raises
    ``InvalidEntry`` otherwise. The tensors own their storage."""
    prefix = len(MAGIC) + _HEADER_LEN.size
    if len(data) < prefix or not data.startswith(MAGIC):
        raise InvalidEntry("not an embedding entry")
    (header_len,) = _HEADER_LEN.unpack_from(data, len(MAGIC))
    if header_len > MAX_HEADER_BYTES or prefix + header_len > len(data):
        raise InvalidEntry("truncated header")
    try:
        header = json.loads(data[prefix : prefix + header_len])
        specs = [(WIRE_DTYPES[s["dtype"]], [int(d) for d in s["shape"]]) for s in header["tensors"]]
    except (ValueError, KeyError, TypeError) as e:
        raise InvalidEntry(f"unreadable header: {e}") from None
    if header.get("fingerprint") != fingerprint or header.get("key") != f"{key:016x}":
        raise InvalidEntry("written for another model, processor or item")
    if not specs or any(len(shape) != 2 or shape[0] != num_tokens for _, shape in specs):
        raise InvalidEntry(f"shapes {[s for _, s in specs]} do not hold {num_tokens} tokens")
    if dtype is not None and any(d != dtype for d, _ in specs):
        raise InvalidEntry(f"dtype is not {dtype}")
    payload = memoryview(data)[prefix + header_len :]
    sizes = [shape[0] * shape[1] * d.itemsize for d, shape in specs]
    if len(payload) != sum(sizes):
        raise InvalidEntry(f"{len(payload)} payload bytes, the header needs {sum(sizes)}")
    if header.get("digest") != _digest(payload):
        raise InvalidEntry("payload digest mismatch")
    tensors, offset = [], 0
    for (d, shape), size in zip(specs, sizes):
        raw = bytearray(payload[offset : offset + size])
        tensors.append(torch.frombuffer(raw, dtype=torch.uint8).view(d).reshape(shape))
        offset += size
    return CachedEmbedding(tensors[0], tensors[1:])


@dataclass
class StoreCounters:
    hits: int = 0
    misses: int = 0
    saved: int = 0
    rejected: int = 0  # entries that failed the checks on arrival
    errors: int = 0  # operations the store failed (down, slow, full)
    skipped: int = 0  # operations not tried while the store was marked down
    bytes_loaded: int = 0
    bytes_saved: int = 0
    load_seconds: float = 0.0
    save_seconds: float = 0.0


class EmbeddingStore(ABC):
    """Batched exists / load / save of embeddings by item key, over a backend's raw get / put.

    A subclass implements ``_get_many``, ``_put_many``, ``_exists`` and ``_delete`` on names
    (str) and bytes, and raises on any failure; this class names keys, encodes and checks
    entries, counts, and turns failures into misses."""

    def __init__(self, fingerprint: str, ttl_s: float | None, retry_after_s: float = 5.0) -> None:
        self.fingerprint = fingerprint
        self.ttl_s = ttl_s
        self.retry_after_s = retry_after_s
        self.counters = StoreCounters()
        self._down_until = 0.0
        self.last_error: str | None = None

    def name(self, key: int) -> str:
        return f"sglang:mm:{self.fingerprint}:{key:016x}"

    @property
    def available(self) -> bool:
        """False for ``retry_after_s`` after a failed operation."""
        return time.monotonic() >= self._down_until

    def exists(self, key: int) -> bool:
        found = self._guarded(lambda: self._exists(self.name(key)))
        return bool(found)

    def load(
        self, wanted: dict[int, int], dtype: torch.dtype | None = None
    ) -> dict[int, CachedEmbedding]:
        """The stored entries among ``wanted`` (key -> token count) that pass the checks."""
        if not wanted:
            return {}
        start = time.perf_counter()
        keys = list(wanted)
        blobs = self._guarded(lambda: self._get_many([self.name(k) for k in keys]))
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
                self._guarded(lambda k=key: self._delete(self.name(k)))
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
        if self._guarded(lambda: self._put_many(blobs)) is not None:
            self.counters.saved += len(blobs)
            self.counters.bytes_saved += sum(len(b) for b in blobs.values())
        self.counters.save_seconds += time.perf_counter() - start

    def stats(self) -> dict[str, int | float | bool | str | None]:
        return {
            "backend": self.backend,
            "available": self.available,
            "last_error": self.last_error,
            **vars(self.counters),
        }

    def _guarded(self, op):
        """``op()``, or None when the store is marked down or ``op`` fails (then it is marked
        down for ``retry_after_s``)."""
        if not self.available:
            self.counters.skipped += 1
            return None
        try:
            result = op()
        except Exception as e:  # a store that fails in any way is treated as absent
            self.counters.errors += 1
            self.last_error = f"{type(e).__name__}: {e}"
            self._down_until = time.monotonic() + self.retry_after_s
            logger.warning(
                "embedding store failed (%s); encoding locally, next try in %.0f s",
                self.last_error,
                self.retry_after_s,
            )
            return None
        return True if result is None else result

    backend: str = "abstract"

    @abstractmethod
    def _get_many(self, names: list[str]) -> list[bytes | None]: ...

    @abstractmethod
    def _put_many(self, blobs: dict[str, bytes]) -> None: ...

    @abstractmethod
    def _exists(self, name: str) -> bool: ...

    @abstractmethod
    def _delete(self, name: str) -> None: ...


class RedisEmbeddingStore(EmbeddingStore):
    """Redis (``redis://host:port/db``). Bound its size on the server: ``maxmemory`` with
    ``maxmemory-policy allkeys-lru``; with ``noeviction`` a full store refuses writes, which
    count as errors."""

    backend = "redis"

    def __init__(
        self,
        url: str,
        fingerprint: str,
        ttl_s: float | None,
        timeout_s: float = 1.0,
        retry_after_s: float = 5.0,
    ) -> None:
        super().__init__(fingerprint, ttl_s, retry_after_s)
        try:
            import redis
            from redis.backoff import NoBackoff
            from redis.retry import Retry
        except ImportError:
            raise ImportError("the Redis embedding store needs `pip install redis`") from None

        self.client = redis.Redis.from_url(
            url,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            retry=Retry(NoBackoff(), 0),
            health_check_interval=0,
        )

    def _get_many(self, names: list[str]) -> list[bytes | None]:
        return self.client.mget(names)

    def _put_many(self, blobs: dict[str, bytes]) -> None:
        pipe = self.client.pipeline(transaction=False)
        for name, blob in blobs.items():
            pipe.set(name, blob, px=int(self.ttl_s * 1000) if self.ttl_s else None)
        pipe.execute()

    def _exists(self, name: str) -> bool:
        return bool(self.client.exists(name))

    def _delete(self, name: str) -> None:
        self.client.delete(name)


STORE_SCHEMES = {"redis": RedisEmbeddingStore}


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
    return STORE_SCHEMES[urlparse(url).scheme](url, fingerprint, ttl_s, timeout_s)
