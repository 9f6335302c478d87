"""One multimodal item per image or video: identity, placeholder spans and raw features."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

# Placeholder ids in radix keys are replaced by values in [PAD_BASE, PAD_BASE + PAD_RANGE): far
# above any vocabulary, so an image key never equals a text token, and 61 bits of the image's
# content hash, so that keys shared across a fleet (stored KV pages) do not collide.
PAD_BASE = 1 << 62
PAD_RANGE = 1 << 61
# A prefix-LM prompt's first key entry: a value between the vocabulary and the image pads derived
# from the whole prompt, so that its KV (which every prompt token computed attending to all of
# them) is matched only by the same prompt.
PROMPT_KEY_BASE = 1 << 32
PROMPT_KEY_RANGE = 1 << 60


@dataclass
class MultimodalItem:
    """An image of a request.

    ``hash`` identifies the raw image and the preprocessing settings. ``spans`` are the
    [start, end) ranges of its placeholder tokens in the request's input ids (one range for most
    models; several when separators are interleaved). ``layout`` is what expansion and positions
    need (e.g. Qwen's ``image_grid_thw``), known without touching pixels. ``source`` is the image
    itself (PIL image or encoded bytes). ``features`` holds what the vision encoder takes, as
    numpy arrays or host tensors; it stays None until a cache miss needs it, so an image whose
    embedding is cached is never preprocessed. ``context`` is what the image takes from the
    rest of its prompt (the adapter's ``item_context``; empty for most families): part of
    ``hash`` and ``layout``, and the preprocessing and encoding of the image follow it.

    A video is an item of ``modality`` "video" whose ``source`` is its resized frames;
    ``group_rows`` is the embedding rows of one frame group (0 for images). Where the vision
    tower encodes frame groups independently, the embedder works on its ``frame_groups``.
    """

    hash: int
    spans: list[tuple[int, int]]
    layout: dict[str, Any] = field(default_factory=dict)
    source: Any = None
    features: dict[str, Any] | None = None
    context: dict[str, Any] = field(default_factory=dict)
    modality: str = "image"
    group_rows: int = 0
    # A video's frame-group items, made once where the embedder works on them (scheduler side).
    groups: list[MultimodalItem] | None = field(default=None, repr=False, compare=False)

    @property
    def num_tokens(self) -> int:
        return sum(end - start for start, end in self.spans)

    @property
    def start(self) -> int:
        return self.spans[0][0]

    @property
    def end(self) -> int:
        return self.spans[-1][1]

    @property
    def pad_value(self) -> int:
        return PAD_BASE + self.hash % PAD_RANGE

    def overlaps(self, lo: int, hi: int) -> bool:
        return any(start < hi and lo < end for start, end in self.spans)

    def token_offsets(self, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
        """For the part of this item inside [lo, hi): (positions in the sequence, rows of its
        embedding)."""
        positions, rows, row = [], [], 0
        for start, end in self.spans:
            a, b = max(start, lo), min(end, hi)
            if a < b:
                positions.append(np.arange(a, b))
                rows.append(np.arange(row + a - start, row + b - start))
            row += end - start
        if not positions:
            empty = np.empty(0, dtype=np.int64)
            return empty, empty
        return np.concatenate(positions), np.concatenate(rows)


def sub_spans(spans: list[tuple[int, int]], lo: int, hi: int) -> list[tuple[int, int]]:
    """The sequence ranges of rows [lo, hi) of an item with ``spans``."""
    out, row = [], 0
    for start, end in spans:
        a, b = max(lo - row, 0), min(hi - row, end - start)
        if a < b:
            out.append((start + a, start + b))
        row += end - start
    return out


def radix_key(
    input_ids: list[int],
    items: list[MultimodalItem],
    whole_prompt: bool = False,
    salt: str | None = None,
) -> list[int]:
    """The prompt's radix-cache key: image tokens become their image's pad value; with
    ``whole_prompt`` (a prefix-LM) the first entry stands for the whole key; with a ``salt``
    the first entry also stands for the salt, so keys of two salts share no prefix."""
    key = list(input_ids)
    for item in items:
        for start, end in item.spans:
            key[start:end] = [item.pad_value] * (end - start)
    if (whole_prompt or salt is not None) and key:
        digest = hashlib.blake2b(digest_size=8)
        digest.update(np.asarray(key if whole_prompt else key[:1], dtype=np.int64).tobytes())
        if salt is not None:
            digest.update(b"salt:" + salt.encode())
        key[0] = PROMPT_KEY_BASE + int.from_bytes(digest.digest(), "little") % PROMPT_KEY_RANGE
    return key


def spans_of(positions: np.ndarray) -> list[tuple[int, int]]:
    """Group sorted token positions into contiguous [start, end) ranges."""
    if len(positions) == 0:
        return []
    breaks = np.nonzero(np.diff(positions) != 1)[0] + 1
    return [(int(run[0]), int(run[-1]) + 1) for run in np.split(positions, breaks)]


def feature_nbytes(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, np.ndarray):
        return value.nbytes
    return 0
