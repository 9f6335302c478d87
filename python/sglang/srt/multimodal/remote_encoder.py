"""Encoder disaggregation: a language worker sends the images (and video frame groups) that miss
its caches to encoder-only workers (``POST /encode``) and takes their embeddings back.

The request is JSON: the sender's fingerprint (``model_executor.mm_fingerprint``) and, per item,
its key, modality, token count, prompt context and pixels (an encoded image's bytes, or raw
uint8 RGB pixels of an image or of a group's frames, base64). The reply is binary: per item, a
little-endian u64 length and the entry in the shared store's format (``encode_entry``), which the
sender checks as it checks a stored entry (fingerprint, key, tokens, dtype, digest).

An encoder keys its own cache by what it received (pixels, context, modality), never by the key
the sender claims, so no client can place an embedding under another image's name.
"""

from __future__ import annotations

import base64
import logging
import struct
import time
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np
import torch
from PIL import Image

from sglang.srt.core.mm_item import MultimodalItem
from sglang.srt.mem_cache.embedding_store import InvalidEntry, decode_entry, encode_entry
from sglang.srt.mem_cache.mm_embedding_cache import CachedEmbedding
from sglang.srt.models.adapters.base import context_key
from sglang.srt.multimodal.image_io import MAX_IMAGE_PIXELS, content_hash, load_image

logger = logging.getLogger(__name__)

_LENGTH = struct.Struct("<Q")
MAX_FRAMES = 1024


class EncodeRequestError(ValueError):
    """An /encode request that cannot be served (the reply is a 400 with this message)."""


# The wire: items out, entries back ----------------------------------------------------------
def item_to_json(item: MultimodalItem) -> dict[str, Any]:
    """One item of an /encode request."""
    out: dict[str, Any] = {
        "key": f"{item.hash:016x}",
        "modality": item.modality,
        "num_tokens": item.num_tokens,
        "context": {k: np.asarray(v).tolist() for k, v in item.context.items()},
    }
    source = item.source
    if isinstance(source, (bytes, bytearray)):
        out["encoded"] = base64.b64encode(source).decode()
        return out
    pixels = np.asarray(source.convert("RGB") if isinstance(source, Image.Image) else source)
    if pixels.dtype != np.uint8:
        raise TypeError(f"pixels travel as uint8, not {pixels.dtype}")
    out["pixels"] = {
        "shape": list(pixels.shape),
        "data": base64.b64encode(np.ascontiguousarray(pixels).tobytes()).decode(),
    }
    return out


@dataclass
class EncodeItem:
    """An item as an encoder received it: ``item`` is keyed by its content; ``reply_key`` is
    the key the sender asked for (the reply's entry carries it)."""

    item: MultimodalItem
    reply_key: int


def item_from_json(raw: Any) -> EncodeItem:
    """An /encode item, validated; raises ``EncodeRequestError``."""
    try:
        reply_key = int(raw["key"], 16)
        modality = raw["modality"]
        num_tokens = int(raw["num_tokens"])
        context = dict(raw.get("context") or {})
        encoded, pixels = raw.get("encoded"), raw.get("pixels")
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise EncodeRequestError(f"malformed item: {e}") from None
    if modality not in ("image", "video") or not 0 < num_tokens <= 1 << 20:
        raise EncodeRequestError("an item is an image or a video with a positive token count")
    if not 0 <= reply_key < 1 << 64:
        raise EncodeRequestError("an item key is 64 bits")
    if (encoded is None) == (pixels is None):
        raise EncodeRequestError("an item carries either encoded bytes or pixels")
    if encoded is not None:
        if modality != "image":
            raise EncodeRequestError("encoded bytes are for images")
        data = _b64(encoded)
        source: Any = load_image(data, allowed_local_dir=None).source
        identity = b"encoded" + data
    else:
        source, identity = _pixels(pixels, modality)
    key = content_hash(modality.encode(), identity, context_key(context))
    item = MultimodalItem(key, [(0, num_tokens)], source=source, context=context, modality=modality)
    return EncodeItem(item, reply_key)


def _b64(text: Any) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (ValueError, TypeError) as e:
        raise EncodeRequestError(f"bad base64: {e}") from None


def _pixels(raw: Any, modality: str) -> tuple[Any, bytes]:
    try:
        shape = [int(d) for d in raw["shape"]]
        data = _b64(raw["data"])
    except (KeyError, TypeError, ValueError) as e:
        raise EncodeRequestError(f"malformed pixels: {e}") from None
    frames = modality == "video"
    if len(shape) != 3 + frames or shape[-1] != 3 or min(shape) <= 0:
        raise EncodeRequestError(f"pixels of shape {shape}: expected {'(N, ' * frames}(H, W, 3)")
    if shape[-3] * shape[-2] > MAX_IMAGE_PIXELS or (frames and shape[0] > MAX_FRAMES):
        raise EncodeRequestError(f"pixels of shape {shape} exceed the limits")
    if len(data) != int(np.prod(shape)):
        raise EncodeRequestError(f"{len(data)} pixel bytes for shape {shape}")
    array = np.frombuffer(data, dtype=np.uint8).reshape(shape)
    source = array.copy() if frames else Image.fromarray(array, "RGB")
    return source, struct.pack(f"<{len(shape)}Q", *shape) + data


def pack_reply(entries: list[bytes]) -> bytes:
    return b"".join(_LENGTH.pack(len(e)) + e for e in entries)


def unpack_reply(data: bytes, count: int) -> list[bytes]:
    out, offset = [], 0
    for _ in range(count):
        if offset + _LENGTH.size > len(data):
            raise InvalidEntry("reply truncated")
        (n,) = _LENGTH.unpack_from(data, offset)
        offset += _LENGTH.size
        if offset + n > len(data):
            raise InvalidEntry("reply truncated")
        out.append(data[offset : offset + n])
        offset += n
    if offset != len(data):
        raise InvalidEntry("reply has trailing bytes")
    return out


def reply_entries(
    received: list[EncodeItem], entries: dict[int, CachedEmbedding], fingerprint: str
) -> bytes:
    """The /encode reply: each received item's embedding under the key its sender gave."""
    return pack_reply(
        [encode_entry(entries[r.item.hash], fingerprint, r.reply_key) for r in received]
    )


# The sender ---------------------------------------------------------------------------------
@dataclass
class RemoteEncoderStats:
    remote_calls: int = 0
    remote_items: int = 0
    remote_seconds: float = 0.0
    remote_failures: int = 0  # calls that failed or timed out: their items encoded locally
    remote_rejected: int = 0  # entries that failed the checks on arrival
    remote_skipped: int = 0  # batches encoded locally while every encoder was marked down


class RemoteEncoders:
    """Sends items to encoder-only workers, splitting each batch across them (in turn, by token
    count) and waiting at most ``timeout_s`` for every part; what does not arrive in time or
    fails its checks is left to the caller to encode locally. An encoder whose call failed is
    not tried again for ``retry_after_s``."""

    def __init__(
        self,
        urls: list[str],
        fingerprint: str,
        timeout_s: float,
        api_key: str | None = None,
        retry_after_s: float = 10.0,
    ) -> None:
        self.urls = [u.rstrip("/") for u in urls]
        self.fingerprint = fingerprint
        self.timeout_s = timeout_s
        self.retry_after_s = retry_after_s
        self._down_until = dict.fromkeys(self.urls, 0.0)
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = httpx.Client(timeout=timeout_s, headers=headers, trust_env=False)
        self.pool = ThreadPoolExecutor(len(self.urls), thread_name_prefix="encoder-client")
        self.stats = RemoteEncoderStats()
        self._next = 0

    def encode(self, items: list[MultimodalItem], dtype: torch.dtype) -> dict[int, CachedEmbedding]:
        """The embeddings of ``items`` that came back valid within the timeout."""
        if not items:
            return {}
        now = time.monotonic()
        live = [url for url in self.urls if self._down_until[url] <= now]
        if not live:
            self.stats.remote_skipped += 1
            return {}
        start = time.perf_counter()
        futures = [
            (self.pool.submit(self._call, url, part), url, part)
            for url, part in self._split(items, live)
        ]
        done, _ = wait([f for f, _, _ in futures], timeout=self.timeout_s)
        found: dict[int, CachedEmbedding] = {}
        for future, url, part in futures:
            if future not in done or future.exception() is not None:
                reason = "timed out" if future not in done else repr(future.exception())
                self.stats.remote_failures += 1
                self._down_until[url] = time.monotonic() + self.retry_after_s
                logger.warning(
                    "encoder %s %s for %d items: encoding them locally; next try in %.0f s",
                    url,
                    reason,
                    len(part),
                    self.retry_after_s,
                )
                continue
            found.update(self._check(part, future.result(), dtype, url))
        self.stats.remote_calls += len(futures)
        self.stats.remote_items += len(found)
        self.stats.remote_seconds += time.perf_counter() - start
        return found

    def _split(
        self, items: list[MultimodalItem], urls: list[str]
    ) -> list[tuple[str, list[MultimodalItem]]]:
        """Items spread over ``urls``, the largest first to the least loaded one; the encoder
        that starts the round moves on each call."""
        n = len(urls)
        loads = [0] * n
        parts: list[list[MultimodalItem]] = [[] for _ in range(n)]
        order = [(self._next + i) % n for i in range(n)]
        self._next += 1
        for item in sorted(items, key=lambda it: -it.num_tokens):
            target = min(order, key=lambda i: loads[i])
            parts[target].append(item)
            loads[target] += item.num_tokens
        return [(urls[i], parts[i]) for i in order if parts[i]]

    def _call(self, url: str, part: list[MultimodalItem]) -> bytes:
        body = {"fingerprint": self.fingerprint, "items": [item_to_json(it) for it in part]}
        resp = self.client.post(f"{url}/encode", json=body)
        if resp.status_code != 200:
            raise RuntimeError(f"HTTP {resp.status_code}: {resp.text[:200]}")
        return resp.content

    def _check(
        self, part: list[MultimodalItem], reply: bytes, dtype: torch.dtype, url: str
    ) -> dict[int, CachedEmbedding]:
        try:
            blobs = unpack_reply(reply, len(part))
        except InvalidEntry as e:
            logger.warning("encoder %s sent an unreadable reply (%s)", url, e)
            self.stats.remote_rejected += len(part)
            return {}
        found = {}
        for item, blob in zip(part, blobs):
            try:
                found[item.hash] = decode_entry(
                    blob, self.fingerprint, item.hash, item.num_tokens, dtype
                )
            except InvalidEntry as e:
                logger.warning("encoder %s: entry rejected (%s)", url, e)
                self.stats.remote_rejected += 1
        return found

    def as_dict(self) -> dict[str, Any]:
        return {"encoder_urls": self.urls, **vars(self.stats)}
