"""Resolve image references from HTTP requests (data URL, base64, http(s) URL, local path) into
bytes, with the server's safety limits.

Downloads are bounded in size and in total time (connect, redirects and body together). By
default they may only reach public addresses: every connection, the ones redirects open
included, resolves the host first and refuses loopback, link-local, private and other non-global
addresses, so neither a redirect nor a DNS answer can aim a fetch at the server's own network.
A refused or failed fetch says why (a non-public host, the HTTP status, the size or time limit,
an unreachable host) and names the flag that moves the limit. A non-public host is refused
before any connection is opened, so without ``--allow-private-media-urls`` no answer tells a
closed internal port from an open one.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import httpcore
import httpx

from sglang.srt.multimodal.image_io import ImageError

logger = logging.getLogger(__name__)

MAX_REDIRECTS = 5
_REDIRECTS = (301, 302, 303, 307, 308)


@dataclass(frozen=True)
class FetchPolicy:
    """What remote media fetches may do: ``max_file_size_mb`` per file within ``timeout``
    seconds in all, and private or loopback addresses only with ``allow_private``."""

    max_file_size_mb: int = 20
    timeout: float = 10.0
    allow_private: bool = False


class _FetchRefused(Exception):
    """Why one fetch failed, in words the client is shown."""


PRIVATE_HOST = (
    "its host is not a public address (loopback, private, link-local or reserved); the server "
    "fetches such URLs only when started with --allow-private-media-urls"
)


def is_public_address(ip: str) -> bool:
    addr = ipaddress.ip_address(ip.split("%", 1)[0])
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    return addr.is_global and not addr.is_multicast


class _PublicOnlyBackend(httpcore.AsyncNetworkBackend):
    """Connects only to hosts whose every resolved address is public; the connection goes to
    the address that was checked (no second lookup that a DNS answer could change)."""

    def __init__(self) -> None:
        self._inner = httpcore.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        loop = asyncio.get_running_loop()
        try:
            infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError as exc:
            raise _FetchRefused(f"its host {host[:100]!r} cannot be resolved") from exc
        addresses = [info[4][0] for info in infos]
        private = [ip for ip in addresses if not is_public_address(ip)]
        if not addresses or private:
            logger.info("%s resolves to non-public address(es) %s", host, private)
            raise _FetchRefused(PRIVATE_HOST)
        return await self._inner.connect_tcp(
            addresses[0],
            port,
            timeout=timeout,
            local_address=local_address,
            socket_options=socket_options,
        )

    async def connect_unix_socket(self, path: str, timeout=None, socket_options=None):
        raise _FetchRefused("unix sockets are not fetched")

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


def fetch_error(url: str, reason: str, kind: str = "image") -> ImageError:
    return ImageError(f"cannot fetch the {kind} at {url[:200]!r}: {reason}")


def _reason(exc: BaseException, policy: FetchPolicy) -> str:
    """What the client is told about a failed fetch."""
    if isinstance(exc, _FetchRefused):
        return str(exc)
    if isinstance(exc, (asyncio.TimeoutError, httpcore.TimeoutException)):
        return f"no complete answer within {policy.timeout:g} s (the limit is --media-url-timeout)"
    if isinstance(exc, httpcore.ConnectError):
        return "its host cannot be reached"
    if isinstance(exc, httpcore.NetworkError | httpcore.ProtocolError):
        return "the connection failed before the whole file arrived"
    return "the download failed"


async def fetch_image_source(ref: Any, policy: FetchPolicy, kind: str = "image") -> Any:
    """Download http(s) images (bounded in size and time, public addresses only unless
    allowed); pass other forms through to ``load_image``, which checks local paths."""
    if not isinstance(ref, str):
        raise ImageError(f"a {kind} must be given as a string (URL, data URL, path or base64)")
    if ref.startswith(("http://", "https://")):
        try:
            return await asyncio.wait_for(_download(ref, policy, kind), policy.timeout)
        except Exception as exc:
            logger.info("%s fetch of %s failed: %r", kind, ref[:200], exc)
            raise fetch_error(ref, _reason(exc, policy), kind) from None
    scheme = ref.split("://", 1)[0] if "://" in ref[:16] else None
    if scheme not in (None, "file"):
        raise ImageError(f"unsupported {kind} URL scheme {scheme!r}")
    return ref


async def fetch_video_source(ref: Any, policy: FetchPolicy) -> Any:
    """``fetch_image_source`` for videos: the same bounds and address rules."""
    return await fetch_image_source(ref, policy, "video")


async def _download(url: str, policy: FetchPolicy, kind: str = "image") -> bytes:
    limit = policy.max_file_size_mb * 1024 * 1024
    backend = None if policy.allow_private else _PublicOnlyBackend()
    async with httpcore.AsyncConnectionPool(network_backend=backend) as pool:
        for _ in range(MAX_REDIRECTS + 1):
            accept = f"{kind}/*".encode()
            async with pool.stream("GET", url, headers=[(b"Accept", accept)]) as resp:
                if resp.status in _REDIRECTS:
                    url = _redirect_target(url, resp.headers)
                    continue
                if resp.status != 200:
                    raise _FetchRefused(f"the server answered HTTP {resp.status}, not 200")
                return await _read_bounded(resp, limit, policy.max_file_size_mb)
    raise _FetchRefused(f"more than {MAX_REDIRECTS} redirects")


def _redirect_target(url: str, headers: list[tuple[bytes, bytes]]) -> str:
    location = next((v for k, v in headers if k.lower() == b"location"), None)
    if location is None:
        raise _FetchRefused("redirect without a location")
    target = str(httpx.URL(url).join(location.decode("latin-1")))
    if not target.startswith(("http://", "https://")):
        raise _FetchRefused(f"redirect to a non-http URL {target[:200]}")
    return target


async def _read_bounded(resp: httpcore.Response, limit: int, limit_mb: int) -> bytes:
    too_large = _FetchRefused(
        f"the file is larger than {limit_mb} MB (the limit is --media-url-max-file-size-mb)"
    )
    declared = next((v for k, v in resp.headers if k.lower() == b"content-length"), b"0")
    if declared.isdigit() and int(declared) > limit:
        raise too_large
    chunks, size = [], 0
    async for chunk in resp.aiter_stream():
        size += len(chunk)
        if size > limit:
            raise too_large
        chunks.append(chunk)
    return b"".join(chunks)
