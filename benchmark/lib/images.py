"""Benchmark images: deterministic JPEGs, their data URLs and chat parts, `WxH` parsing."""

from __future__ import annotations

import base64
import io
from typing import Any

import numpy as np
from PIL import Image


def make_jpeg(image_id: int, width: int, height: int, quality: int = 85) -> bytes:
    """A deterministic JPEG: uniform noise from a generator seeded with the image id."""
    pixels = np.random.default_rng(image_id).integers(0, 256, (height, width, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="JPEG", quality=quality)
    return buf.getvalue()


def data_url(jpeg: bytes) -> str:
    return "data:image/jpeg;base64," + base64.b64encode(jpeg).decode()


def image_part(jpeg: bytes) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": data_url(jpeg)}}


def parse_resolution(text: str) -> tuple[int, int]:
    w, h = text.lower().split("x")
    return int(w), int(h)
