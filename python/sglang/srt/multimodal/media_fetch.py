"""Resolve image references from HTTP requests (data URL, base64, http(s) URL, local path) into
bytes, with the server's safety limits."""

from __future__ import annotations

import os
from typing import Any

import httpx

from sglang.srt.multimodal.image_io import ImageError
from sglang.srt.server_args import ServerArgs


async def fetch_image_source(ref: Any, args: ServerArgs) -> Any:
    """Download http(s) images (bounded in size and time); check local paths against the
    allowed directory; pass other forms through to ``load_image``."""
    if not isinstance(ref, str):
        raise ImageError("an image must be given as a string (URL, data URL, path or base64)")
    if ref.startswith(("http://", "https://")):
        return await _download(ref, args)
    scheme = ref.split("://", 1)[0] if "://" in ref[:16] else None
    if scheme not in (None, "file"):
        raise ImageError(f"unsupported image URL scheme {scheme!r}")
    return ref


async def _download(url: str, args: ServerArgs) -> bytes:
    limit = args.media_url_max_file_size_mb * 1024 * 1024
    try:
        async with httpx.AsyncClient(
            timeout=args.media_url_timeout, follow_redirects=True
        ) as client:
            async with client.stream("GET", url) as resp:
                if resp.status_code != 200:
                    raise ImageError(f"fetching {url} returned HTTP {resp.status_code}")
                declared = int(resp.headers.get("content-length") or 0)
                if declared > limit:
                    raise ImageError(f"image at {url} is larger than {limit} bytes")
                chunks, size = [], 0
                async for chunk in resp.aiter_bytes():
                    size += len(chunk)
                    if size > limit:
                        raise ImageError(f"image at {url} is larger than {limit} bytes")
                    chunks.append(chunk)
    except httpx.TimeoutException as exc:
        raise ImageError(f"fetching {url} timed out after {args.media_url_timeout} s") from exc
    except httpx.HTTPError as exc:
        raise ImageError(f"cannot fetch {url}: {exc}") from exc
    return b"".join(chunks)


def allowed_local_dir(args: ServerArgs) -> str | None:
    path = args.allowed_local_media_path
    return os.path.realpath(path) if path else None
