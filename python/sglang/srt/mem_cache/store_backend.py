"""Where shared stores keep their bytes, and how their failures become misses.

A ``BlobBackend`` gets, puts, deletes named blobs and raises on any failure: ``RedisBlobs``
(an existing Redis, ``redis://host:port/db``) or ``FileBlobs`` (a directory every worker can
reach, written atomically). ``StoreGuard`` runs a store's operations: a failed one is counted and
leaves the store alone for ``retry_after_s``, so a store that is down, slow or full never fails a
request.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, TypeVar

logger = logging.getLogger(__name__)

T = TypeVar("T")


class BlobBackend(ABC):
    kind: str = "abstract"

    @abstractmethod
    def get_many(self, names: list[str]) -> list[bytes | None]: ...

    @abstractmethod
    def put_many(self, blobs: dict[str, bytes], ttl_s: float | None) -> None: ...

    @abstractmethod
    def exists(self, name: str) -> bool: ...

    @abstractmethod
    def delete(self, name: str) -> None: ...


def redis_client(url: str, timeout_s: float) -> Any:
    """A Redis client that fails fast: no retries, bounded connect and socket time."""
    try:
        import redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry
    except ImportError:
        raise ImportError("a Redis store needs `pip install redis`") from None
    return redis.Redis.from_url(
        url,
        socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s,
        retry=Retry(NoBackoff(), 0),
        health_check_interval=0,
    )


class RedisBlobs(BlobBackend):
    """Redis; bound its size on the server (``maxmemory`` with ``allkeys-lru``: with
    ``noeviction`` a full store refuses writes, which count as errors)."""

    kind = "redis"

    def __init__(self, url: str, timeout_s: float) -> None:
        self.client = redis_client(url, timeout_s)

    def get_many(self, names: list[str]) -> list[bytes | None]:
        return self.client.mget(names)

    def put_many(self, blobs: dict[str, bytes], ttl_s: float | None) -> None:
        pipe = self.client.pipeline(transaction=False)
        for name, blob in blobs.items():
            pipe.set(name, blob, px=int(ttl_s * 1000) if ttl_s else None)
        pipe.execute()

    def exists(self, name: str) -> bool:
        return bool(self.client.exists(name))

    def delete(self, name: str) -> None:
        self.client.delete(name)


class FileBlobs(BlobBackend):
    """One file per blob under ``root`` (names may hold ``:``; no ``/``). A write goes to a
    temporary file renamed into place, so a reader sees a whole blob or none; ``ttl_s`` is not
    applied (bound the directory from outside, e.g. a cron job by age)."""

    kind = "file"

    def __init__(self, root: str) -> None:
        self.root = root
        os.makedirs(root, exist_ok=True)

    def _path(self, name: str) -> str:
        if "/" in name or name.startswith("."):
            raise ValueError(f"blob name {name!r}")
        return os.path.join(self.root, name.replace(":", "_"))

    def get_many(self, names: list[str]) -> list[bytes | None]:
        out: list[bytes | None] = []
        for name in names:
            try:
                with open(self._path(name), "rb") as f:
                    out.append(f.read())
            except FileNotFoundError:
                out.append(None)
        return out

    def put_many(self, blobs: dict[str, bytes], ttl_s: float | None) -> None:
        for name, blob in blobs.items():
            fd, tmp = tempfile.mkstemp(dir=self.root, prefix=".tmp-")
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(blob)
                os.replace(tmp, self._path(name))
            except BaseException:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
                raise

    def exists(self, name: str) -> bool:
        return os.path.exists(self._path(name))

    def delete(self, name: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._path(name))


class StoreGuard:
    """Runs a store's operations; one that raises is counted in ``errors``, and for
    ``retry_after_s`` after it every operation is ``skipped`` (returns None)."""

    def __init__(self, what: str, retry_after_s: float = 5.0) -> None:
        self.what = what
        self.retry_after_s = retry_after_s
        self.errors = 0
        self.skipped = 0
        self.last_error: str | None = None
        self._down_until = 0.0

    @property
    def available(self) -> bool:
        return time.monotonic() >= self._down_until

    def __call__(self, op: Callable[[], T]) -> T | bool | None:
        """``op()`` (True when it returns None), or None when the store is marked down or
        ``op`` fails."""
        if not self.available:
            self.skipped += 1
            return None
        try:
            result = op()
        except Exception as e:  # a store that fails in any way is treated as absent
            self.errors += 1
            self.last_error = f"{type(e).__name__}: {e}"
            self._down_until = time.monotonic() + self.retry_after_s
            logger.warning(
                "%s failed (%s); computing locally, next try in %.0f s",
                self.what,
                self.last_error,
                self.retry_after_s,
            )
            return None
        return True if result is None else result
