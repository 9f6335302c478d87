"""The hierarchical cache's storage tier: prefix KV pages shared through a store, so a turn costs
only its new tokens on any worker and after a restart.

- **Prefetch** starts when a request arrives: its full prompt pages past what the local radix
  cache holds are looked up on a worker thread. The request waits in the queue (other requests'
  steps go on) until the pages arrived or the prefetch policy stops waiting.
- **Admission** (``take``) writes the arrived pages into free KV slots and inserts them into the
  radix cache; the prefix match that follows starts the prefill at the first missing page.
- **Write** by policy: ``write_through`` a request's full pages when it ends, ``write_back``
  pages the radix cache evicts, ``write_through_selective`` the pages of a request's cached
  prefix. Pages are copied out of the pool at once and written by a writer thread under a
  bandwidth and a pending-bytes bound (past it a write is dropped and counted, never waited for).

Invariants: a page is inserted only as the continuation of the local match (the chain key names
the whole prefix); a slot allocated for loaded pages goes to the radix cache or back to the pool.
"""

from __future__ import annotations

import concurrent.futures
import logging
import math
import threading
import time
from collections import OrderedDict, deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch

from sglang.srt.core.req import Req
from sglang.srt.mem_cache.kv_page_store import KVPageStore, Page
from sglang.srt.mem_cache.memory_pool import KVPool
from sglang.srt.mem_cache.radix_cache import RadixCache, TreeNode
from sglang.srt.mem_cache.store_backend import FileBlobs, RedisBlobs
from sglang.srt.model_executor.mm_fingerprint import kv_fingerprint
from sglang.srt.server_args import HiCacheSettings, ServerArgs

logger = logging.getLogger(__name__)

KNOWN_PAGES = 1 << 20  # chain keys remembered as stored, least recently used forgotten first
TICKETS = 4096  # writes of ended requests whose outputs may wait for them


@dataclass
class _Prefetch:
    keys: list[str]  # every full page of the request's cacheable prefix
    first: int  # the first page looked up (those before it were cached locally)
    future: Future[list[Page]]
    deadline: float  # time.monotonic() past which admission stops waiting


@dataclass
class HiCacheCounters:
    prefetches: int = 0
    prefetch_timeouts: int = 0  # prefetches admission stopped waiting for
    tokens_loaded: int = 0  # tokens inserted into the radix cache from the store
    load_no_room: int = 0  # arrived pages the KV pool had no room for
    pages_queued: int = 0
    pages_dropped: int = 0  # writes over the pending-bytes bound
    write_failures: int = 0


class _KnownPages:
    """Chain keys believed to be in the store (written, queued or loaded here): not written
    again. Thread-safe; LRU-bounded."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._keys: OrderedDict[str, None] = OrderedDict()
        self._lock = threading.Lock()

    def __contains__(self, key: str) -> bool:
        with self._lock:
            if key in self._keys:
                self._keys.move_to_end(key)
                return True
            return False

    def add(self, keys: list[str]) -> None:
        with self._lock:
            for key in keys:
                self._keys[key] = None
                self._keys.move_to_end(key)
            while len(self._keys) > self.capacity:
                self._keys.popitem(last=False)

    def discard(self, keys: list[str]) -> None:
        with self._lock:
            for key in keys:
                self._keys.pop(key, None)


@dataclass
class _Writer:
    """A thread writing queued pages at most ``bytes_per_s``, holding at most ``max_pending``
    bytes of them."""

    store: KVPageStore
    known: _KnownPages
    counters: HiCacheCounters
    bytes_per_s: float
    max_pending: int
    pending: int = 0
    _queue: deque[tuple[dict[str, Page], int, threading.Event]] = field(default_factory=deque)
    _cond: threading.Condition = field(default_factory=threading.Condition)
    _busy: bool = False

    def __post_init__(self) -> None:
        threading.Thread(target=self._run, name="hicache-writer", daemon=True).start()

    def submit(self, pages: dict[str, Page]) -> threading.Event | None:
        """Queue ``pages``; the event is set once they are written (or failed). None: over the
        pending-bytes bound, not queued."""
        size = sum(t.numel() * t.element_size() for page in pages.values() for t in page)
        done = threading.Event()
        with self._cond:
            if self.pending + size > self.max_pending:
                return None
            self.pending += size
            self._queue.append((pages, size, done))
            self._cond.notify_all()
        return done

    def drain(self, timeout: float) -> bool:
        """Wait until every queued page is written; False if ``timeout`` passed first."""
        end = time.monotonic() + timeout
        with self._cond:
            while self._queue or self._busy:
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue:
                    self._cond.wait()
                pages, size, done = self._queue.popleft()
                self._busy = True
            started = time.monotonic()
            try:
                written = self.store.save(pages)
            except Exception:  # never let the writer die: the pages are simply not stored
                logger.exception("writing KV pages failed")
                written = 0
            if not written:
                self.counters.write_failures += len(pages)
                self.known.discard(list(pages))
            done.set()
            time.sleep(max(0.0, size / self.bytes_per_s - (time.monotonic() - started)))
            with self._cond:
                self.pending -= size
                self._busy = False
                self._cond.notify_all()


class HiCache:
    def __init__(
        self, settings: HiCacheSettings, store: KVPageStore, tree: RadixCache, kv_pool: KVPool
    ) -> None:
        self.settings = settings
        self.store = store
        self.tree = tree
        self.kv_pool = kv_pool
        self.page_size = settings.page_size
        self.counters = HiCacheCounters()
        self.known = _KnownPages(KNOWN_PAGES)
        self._prefetches: dict[int, _Prefetch] = {}
        self._tickets: OrderedDict[str, threading.Event] = OrderedDict()  # rid -> its write
        self._loader = ThreadPoolExecutor(1, thread_name_prefix="hicache-prefetch")
        self._writer = _Writer(
            store,
            self.known,
            self.counters,
            settings.write_mb_per_s * 2**20,
            int(settings.max_pending_write_mb * 2**20),
        )
        if settings.write_policy == "write_back":
            tree.on_evict = self._write_evicted

    # Prefetch and admission --------------------------------------------------------------------
    def prefetch(self, req: Req) -> None:
        """Start looking up the request's pages past the local radix match."""
        key = req.radix_key(req.uncached_from)
        first = len(self.tree.match_prefix(key)[0]) // self.page_size
        missing = (len(key) // self.page_size - first) * self.page_size
        if missing <= 0 or missing < self.settings.prefetch_threshold:
            return  # before hashing the prompt: a sticky worker's turns mostly end here
        keys = self.store.keys(key)
        deadline = math.inf
        if self.settings.prefetch_policy == "timeout":
            per_ki = self.settings.prefetch_timeout_per_ki_token
            wait = self.settings.prefetch_timeout_base + per_ki * len(key) / 1024
            deadline = time.monotonic() + wait
        future = self._loader.submit(self.store.load_prefix, keys[first:])
        self._prefetches[id(req)] = _Prefetch(keys, first, future, deadline)
        self.counters.prefetches += 1

    def ready(self, req: Req) -> bool:
        """Whether admission should take ``req`` now (its prefetch is done or no longer waited
        for)."""
        p = self._prefetches.get(id(req))
        if p is None or p.future.done() or self.settings.prefetch_policy == "best_effort":
            return True
        return time.monotonic() >= p.deadline

    def wait(self, timeout: float) -> None:
        """Block up to ``timeout`` for any prefetch in flight (an idle scheduler's nap)."""
        pending = next((p for p in self._prefetches.values() if not p.future.done()), None)
        if pending is not None:
            concurrent.futures.wait([pending.future], timeout)

    def forget(self, req: Req) -> None:
        """The request left the queue without admission (aborted, timed out)."""
        self._prefetches.pop(id(req), None)

    def take(self, req: Req) -> int:
        """Insert the request's arrived pages into the radix cache; returns the tokens added."""
        p = self._prefetches.pop(id(req), None)
        if p is None:
            return 0
        if not p.future.done():
            self.counters.prefetch_timeouts += 1
            return 0
        try:
            pages = p.future.result()
        except Exception:
            logger.exception("KV page prefetch failed")
            return 0
        if not pages:
            return 0
        self.known.add(p.keys[p.first : p.first + len(pages)])
        return self._insert(req.radix_key(req.uncached_from), p.first, pages)

    def _insert(self, key: list[int], first: int, pages: list[Page]) -> int:
        size = self.page_size
        end = (first + len(pages)) * size
        local, node = self.tree.match_prefix(key[:end])
        m = len(local)
        if m >= end or m < first * size:
            return 0  # the local cache already holds them, or lost the pages before them
        n = end - m
        self.tree.inc_lock_ref(node)
        slots = self.kv_pool.alloc(n)
        if slots is None:
            self.tree.evict(n - self.kv_pool.available_size())
            slots = self.kv_pool.alloc(n)
        self.tree.dec_lock_ref(node)
        if slots is None:
            self.counters.load_no_room += 1
            return 0
        offset = m - first * size
        device_slots = slots.to(self.kv_pool.device)
        for layer in range(len(self.kv_pool.k_buffer)):
            for buffers, part in ((self.kv_pool.k_buffer, 0), (self.kv_pool.v_buffer, 1)):
                rows = torch.cat([page[2 * layer + part] for page in pages])[offset : offset + n]
                buffers[layer][device_slots] = rows.to(self.kv_pool.device)
        dup = self.tree.insert(key[:end], torch.cat([local, slots]))
        assert dup == m, "the radix cache changed between match and insert"
        self.counters.tokens_loaded += n
        return n

    # Writes ------------------------------------------------------------------------------------
    def on_release(self, req: Req, slots: torch.Tensor) -> None:
        """A request ends holding KV ``slots`` for its first ``computed_len`` tokens."""
        policy = self.settings.write_policy
        if policy == "write_back":
            return
        key = req.radix_key(req.computed_len)
        keys = self.store.keys(key)
        if policy == "write_through_selective":
            keys = keys[: req.cached_len // self.page_size]
        done = self._write(keys, range(len(keys)), slots)
        if done is not None:
            self._tickets[req.rid] = done
            while len(self._tickets) > TICKETS:
                self._tickets.popitem(last=False)

    def persisted(self, req: Req) -> bool:
        """Whether the pages of an ended request are written (or failed, or were never
        queued): its last output waits for that, so the next turn finds them on any worker."""
        done = self._tickets.get(req.rid)
        if done is not None and not done.is_set():
            return False
        self._tickets.pop(req.rid, None)
        return True

    def wait_persisted(self, reqs: list[Req], timeout: float) -> None:
        """Wait up to ``timeout`` for the pages of ended ``reqs``; those stored are forgotten
        (the others stay for ``persisted``)."""
        end = time.monotonic() + timeout
        for req in reqs:
            done = self._tickets.get(req.rid)
            if done is not None and done.wait(max(0.0, end - time.monotonic())):
                del self._tickets[req.rid]

    def _write_evicted(self, leaf: TreeNode) -> None:
        """write_back: the pages that end inside ``leaf``, which the radix cache evicts."""
        nodes = []
        node: TreeNode | None = leaf
        while node is not None and node is not self.tree.root:
            nodes.append(node)
            node = node.parent
        nodes.reverse()
        key = [t for n in nodes for t in n.key]
        slots = torch.cat([n.value for n in nodes])
        keys = self.store.keys(key)
        start = (len(key) - len(leaf.key)) // self.page_size
        self._write(keys, range(start, len(keys)), slots)

    def _write(self, keys: list[str], pages: range, slots: torch.Tensor) -> threading.Event | None:
        todo = [i for i in pages if keys[i] not in self.known]
        if not todo:
            return None
        size = self.page_size
        chosen = torch.cat([slots[i * size : (i + 1) * size] for i in todo])
        chosen = chosen.to(self.kv_pool.device)
        per_layer = [
            (k[chosen].cpu(), v[chosen].cpu())
            for k, v in zip(self.kv_pool.k_buffer, self.kv_pool.v_buffer)
        ]
        batch: dict[str, Page] = {}
        for n, i in enumerate(todo):
            rows = slice(n * size, (n + 1) * size)
            batch[keys[i]] = [t[rows] for pair in per_layer for t in pair]
        done = self._writer.submit(batch)
        if done is not None:
            self.known.add(list(batch))
            self.counters.pages_queued += len(batch)
        else:
            self.counters.pages_dropped += len(batch)
        return done

    def drain(self, timeout: float = 10.0) -> bool:
        return self._writer.drain(timeout)

    def stats(self) -> dict[str, Any]:
        return {
            "write_policy": self.settings.write_policy,
            "prefetch_policy": self.settings.prefetch_policy,
            "location": self.settings.location if self.settings.backend == "file" else None,
            **self.store.stats(),
            **vars(self.counters),
            "pending_write_bytes": self._writer.pending,
        }


def build_hicache(args: ServerArgs, runner: Any, tree: RadixCache, hybrid: bool) -> HiCache | None:
    """The storage tier the flags ask for (None: off); hybrid models are refused."""
    settings = args.hicache
    if settings is None:
        return None
    if hybrid:
        raise ValueError(
            "--enable-hierarchical-cache stores per-token KV pages; this model's "
            "linear-attention state is not stored yet (serve it without the flag)"
        )
    backend = (
        FileBlobs(settings.location)
        if settings.backend == "file"
        else RedisBlobs(settings.location, args.mm_global_cache_timeout)
    )
    fingerprint = kv_fingerprint(runner, settings.page_size)
    pool = runner.kv_pool
    store = KVPageStore(
        backend, fingerprint, settings.page_size, pool.layer_shapes, pool.dtype, settings.ttl_s
    )
    logger.info(
        "hierarchical cache: %s store, pages of %d tokens, %s, prefetch %s, fingerprint %s",
        settings.backend, settings.page_size, settings.write_policy,
        settings.prefetch_policy, fingerprint,
    )  # fmt: skip
    return HiCache(settings, store, tree, pool)
