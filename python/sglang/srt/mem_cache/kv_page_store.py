"""Prefix KV pages in a store every worker reaches (SGLang's hierarchical cache storage tier).

A page is ``page_size`` consecutive tokens of a radix key, starting at a multiple of the page
size. Its name is a chain digest: page i's key hashes page i - 1's key and page i's radix-key
entries, from a root that hashes the fleet fingerprint (checkpoint, preprocessing, dtypes, KV
dtype, quantization, page size, KV layout). So a page stands for its whole prefix, image
placeholders included (their radix-key entries carry the image's content hash), and two models,
widths or images never share a page.

An entry is ``wire``-framed: the header holds the fingerprint, the page key and the page size;
the tensors are each pool layer's K then V for the page's tokens. A corrupt, truncated or
foreign entry is counted, deleted and recomputed; the store down or full is a miss.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from sglang.srt.mem_cache.store_backend import BlobBackend, StoreGuard
from sglang.srt.mem_cache.wire import InvalidEntry, pack, unpack

logger = logging.getLogger(__name__)

MAGIC = b"SGLKVP01"
LOAD_BATCH_PAGES = 16  # pages asked for in one round trip; a miss ends the prefix


def page_keys(radix_key: Sequence[int], page_size: int, fingerprint: str) -> list[str]:
    """The chain keys of the full pages of ``radix_key`` (hex, 32 characters each)."""
    tokens = np.asarray(radix_key[: len(radix_key) // page_size * page_size], dtype=np.int64)
    parent = hashlib.blake2b(b"kv-root:" + fingerprint.encode(), digest_size=16).digest()
    keys = []
    for start in range(0, len(tokens), page_size):
        h = hashlib.blake2b(parent, digest_size=16)
        h.update(tokens[start : start + page_size].tobytes())
        parent = h.digest()
        keys.append(parent.hex())
    return keys


@dataclass
class PageCounters:
    pages_loaded: int = 0
    pages_missed: int = 0  # lookups that ended a prefix
    pages_saved: int = 0
    rejected: int = 0  # entries that failed the checks on arrival
    bytes_loaded: int = 0
    bytes_saved: int = 0
    load_seconds: float = 0.0
    save_seconds: float = 0.0


Page = list[torch.Tensor]  # per pool layer K then V, each (page_size, kv_heads, head_dim)


class KVPageStore:
    """Load and save KV pages by chain key over a ``BlobBackend``. Thread-safe as far as the
    backend is (the prefetcher loads while the writer saves)."""

    def __init__(
        self,
        backend: BlobBackend,
        fingerprint: str,
        page_size: int,
        layer_shapes: Sequence[tuple[int, int]],
        dtype: torch.dtype,
        ttl_s: float | None = None,
        retry_after_s: float = 5.0,
    ) -> None:
        self.blobs = backend
        self.fingerprint = fingerprint
        self.page_size = page_size
        self.shapes = [(page_size, *shape) for shape in layer_shapes for _ in (0, 1)]
        self.dtype = dtype
        self.ttl_s = ttl_s
        self.counters = PageCounters()
        self.guard = StoreGuard("KV page store", retry_after_s)

    def name(self, key: str) -> str:
        return f"sglang:kv:{self.fingerprint}:{key}"

    def keys(self, radix_key: Sequence[int]) -> list[str]:
        return page_keys(radix_key, self.page_size, self.fingerprint)

    # Entries -----------------------------------------------------------------------------------
    def encode(self, key: str, page: Page) -> bytes:
        fields = {"fingerprint": self.fingerprint, "key": key, "page_size": self.page_size}
        return pack(MAGIC, fields, page)

    def decode(self, key: str, data: bytes) -> Page:
        header, tensors = unpack(data, MAGIC)
        if header.get("fingerprint") != self.fingerprint or header.get("key") != key:
            raise InvalidEntry("written for another model, layout or prefix")
        shapes = [tuple(t.shape) for t in tensors]
        if shapes != self.shapes or any(t.dtype != self.dtype for t in tensors):
            raise InvalidEntry(f"tensors {shapes} are not this pool's pages {self.shapes}")
        return tensors

    # Operations --------------------------------------------------------------------------------
    def load_prefix(self, keys: Sequence[str]) -> list[Page]:
        """The stored pages of ``keys`` from the first on, up to the first missing, rejected or
        unreachable one."""
        start = time.perf_counter()
        pages: list[Page] = []
        for batch in range(0, len(keys), LOAD_BATCH_PAGES):
            wanted = list(keys[batch : batch + LOAD_BATCH_PAGES])
            blobs = self.guard(lambda w=wanted: self.blobs.get_many([self.name(k) for k in w]))
            if blobs is None:
                break
            complete = True
            for key, blob in zip(wanted, blobs):
                page = self._checked(key, blob)
                if page is None:
                    complete = False
                    break
                pages.append(page)
                self.counters.pages_loaded += 1
                self.counters.bytes_loaded += len(blob)  # type: ignore[arg-type]
            if not complete:
                break
        self.counters.load_seconds += time.perf_counter() - start
        return pages

    def _checked(self, key: str, blob: bytes | None) -> Page | None:
        if blob is None:
            self.counters.pages_missed += 1
            return None
        try:
            return self.decode(key, blob)
        except InvalidEntry as e:
            logger.warning("KV page %s rejected: %s", self.name(key), e)
            self.counters.rejected += 1
            self.guard(lambda: self.blobs.delete(self.name(key)))
            return None

    def save(self, pages: dict[str, Page]) -> int:
        """Write ``pages``; returns the bytes written (0 when the store failed)."""
        if not pages:
            return 0
        start = time.perf_counter()
        blobs = {self.name(k): self.encode(k, page) for k, page in pages.items()}
        written = 0
        if self.guard(lambda: self.blobs.put_many(blobs, self.ttl_s)) is not None:
            written = sum(len(b) for b in blobs.values())
            self.counters.pages_saved += len(blobs)
            self.counters.bytes_saved += written
        self.counters.save_seconds += time.perf_counter() - start
        return written

    def stats(self) -> dict[str, int | float | bool | str | None]:
        return {
            "backend": self.blobs.kind,
            "page_size": self.page_size,
            "available": self.guard.available,
            "last_error": self.guard.last_error,
            "errors": self.guard.errors,
            "skipped": self.guard.skipped,
            **vars(self.counters),
        }
