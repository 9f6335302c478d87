"""Qwen-VL image preprocessing, bit-identical to the HF PIL processor and several times faster.

HF's PIL path for one RGB image: numpy -> PIL -> resize -> numpy, then ``astype(float64) *
rescale_factor -> float32``, then ``(x - mean) / std`` in float32, then a patch transpose and a
temporal copy. Every pixel value goes through the same element-wise arithmetic, and a channel has
only 256 values, so the arithmetic is done once per (channel, value) with the same numpy
operations into a lookup table, and lookups over the uint8 patches write the final layout:
identical bits (``test/test_fast_preprocess.py`` compares on random images of many sizes), no
float intermediates, and the resize runs on the PIL image directly.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import numpy as np
from PIL import Image

FAST_PROCESSORS = ("Qwen2VLImageProcessorPil",)


def supports(image_processor: Any, images: Sequence[Image.Image]) -> bool:
    """True when ``preprocess`` reproduces this processor exactly on these images."""
    if type(image_processor).__name__ not in FAST_PROCESSORS:
        return False
    p = image_processor
    return (
        bool(p.do_resize and p.do_convert_rgb)
        and getattr(p, "temporal_patch_size", 0) >= 1
        and all(image.mode == "RGB" for image in images)
    )


def preprocess(image_processor: Any, images: Sequence[Image.Image]) -> dict[str, np.ndarray]:
    """``{"pixel_values", "image_grid_thw"}`` as ``image_processor(images=...,
    return_tensors="np")`` returns them, for RGB images."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

    p = image_processor
    patch, merge, temporal = p.patch_size, p.merge_size, p.temporal_patch_size
    table = _value_table(
        p.do_rescale,
        float(p.rescale_factor),
        p.do_normalize,
        tuple(_per_channel(p.image_mean)),
        tuple(_per_channel(p.image_std)),
    )
    patches, grids = [], []
    for image in images:
        if image.mode != "RGB":
            raise ValueError(f"expected an RGB image, got mode {image.mode}")
        height, width = smart_resize(
            image.height,
            image.width,
            factor=patch * merge,
            min_pixels=p.size["shortest_edge"],
            max_pixels=p.size["longest_edge"],
        )
        resized = image.resize((width, height), resample=p.resample)
        patches.append(_patchify(np.asarray(resized), table, patch, merge, temporal))
        grids.append([1, height // patch, width // patch])
    return {
        "pixel_values": np.concatenate(patches) if len(patches) > 1 else patches[0],
        "image_grid_thw": np.array(grids, dtype=np.int64),
    }


def _per_channel(value: Any) -> list[float]:
    return list(value) if isinstance(value, (list, tuple)) else [value] * 3


@functools.cache
def _value_table(
    do_rescale: bool,
    factor: float,
    do_normalize: bool,
    mean: tuple[float, ...],
    std: tuple[float, ...],
) -> np.ndarray:
    """(3 * 256,) float32: entry c * 256 + v is what HF's rescale + normalize make of value v in
    channel c, computed with HF's own operations and dtypes."""
    image = np.broadcast_to(np.arange(256, dtype=np.uint8), (3, 1, 256)).copy()  # CHW uint8
    if do_rescale:
        image = (image.astype(np.float64) * factor).astype(np.float32)
    if do_normalize:
        if not np.issubdtype(image.dtype, np.floating):
            image = image.astype(np.float32)
        m, s = np.array(mean, dtype=image.dtype), np.array(std, dtype=image.dtype)
        image = ((image.T - m) / s).T
    return np.ascontiguousarray(image, dtype=np.float32).reshape(-1)


def _patchify(
    pixels: np.ndarray, table: np.ndarray, patch: int, merge: int, temporal: int
) -> np.ndarray:
    """HWC uint8 -> (grid_h * grid_w, C * temporal * patch * patch) float32, HF's patch order
    (merge blocks row-major, patches in a block row-major, then C, T, ph, pw)."""
    height, width, channels = pixels.shape
    gh, gw = height // patch, width // patch
    blocks = pixels.reshape(gh // merge, merge, patch, gw // merge, merge, patch, channels)
    # (gh/m, gw/m, mh, mw, C, ph, pw), still uint8: the transpose moves 1 byte per value.
    blocks = np.ascontiguousarray(blocks.transpose(0, 3, 1, 4, 6, 2, 5))
    blocks = blocks.reshape(gh * gw, channels, patch, patch)
    out = np.empty((gh * gw, channels, temporal, patch, patch), dtype=np.float32)
    lut = table.reshape(channels, 256)
    for c in range(channels):
        values = lut[c][blocks[:, c]]
        for t in range(temporal):
            out[:, c, t] = values
    return out.reshape(gh * gw, channels * temporal * patch * patch)
