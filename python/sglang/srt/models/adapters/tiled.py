"""Families that cut an image into fixed-size tiles or give every image a fixed count of
tokens (InternVL, GOT-OCR2, MiniCPM-V 4.6/4.7).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from sglang.srt.mem_cache.mm_embedding_cache import CachedEmbedding
from sglang.srt.models.adapters.base import (
    Layout,
    ModelAdapter,
    PixelShape,
    _pooled,
    layout_inputs,
    split_rows,
)


class TiledAdapter(ModelAdapter):
    """InternVL, Aya Vision (GotOCR2 tiling): the replacement reads only the tile count, which
    the image processor computes from the size (``get_number_of_image_patches``)."""

    def layout_from_size(
        self, processor: Any, images_kwargs: dict[str, Any], width: int, height: int
    ) -> Layout | None:
        tiles = processor.image_processor.get_number_of_image_patches(height, width, images_kwargs)
        return {"num_patches": np.array([tiles])}


class InternVLAdapter(TiledAdapter):
    """InternVL: images as GotOCR2 tiles (``TiledAdapter``); a video's frames are tiles too,
    written ``Frame{i}: <img>`` + ``image_seq_length`` image tokens + ``</img>`` one per line
    (HF's ``replace_video_token``), and encoded by ``get_image_features``.

    Frames are separable (a frame group is one frame): the tower attends within a tile, and
    the pixel shuffle and projector work on one tile's own features."""

    separable_video_groups = True

    @property
    def video_placeholder_id(self) -> int | None:
        return self.image_token_id

    def video_layout(self, video: Any, settings: Any) -> Layout:
        frames, height, width = video.frames.shape[:3]
        return {"pixel_values_videos": PixelShape((1, frames, 3, height, width))}

    def video_group_rows(self, layout: Layout, settings: Any) -> int:
        vision = self.config.vision_config
        side = [size // patch for size, patch in zip(vision.image_size, vision.patch_size)]
        return int(side[0] * side[1] * self.config.downsample_ratio**2)

    def encode_videos(
        self, features: list[dict[str, Any]], rows: Sequence[int]
    ) -> list[CachedEmbedding]:
        frames = torch.cat([f["pixel_values_videos"][0] for f in features])
        out = self.image_features_fn(pixel_values=frames)
        return [CachedEmbedding(e, []) for e in split_rows(out.pooler_output, rows)]


class FixedCountAdapter(ModelAdapter):
    """DeepSeek-VL (and -Hybrid): every image is resized to one square, so the replacement is
    the same ``num_image_tokens`` run whatever the size."""

    def layout_from_size(
        self, processor: Any, images_kwargs: dict[str, Any], width: int, height: int
    ) -> Layout | None:
        return {}


class GotOcr2Adapter(TiledAdapter):
    """GOT-OCR 2.0: the tile count is a size rule as for InternVL, but the processor's
    replacement also reads the page bookkeeping its ``_process_images`` passes (pages per sample,
    their cumulative indices and ``num_image_tokens`` per tile); here for one image, one page."""

    def replacement(self, processor: Any, layout: Layout, images_kwargs: dict[str, Any]) -> str:
        return processor.replace_image_token(
            layout_inputs(layout),
            0,
            num_pages_per_batch=[1],
            patch_indices=np.array([1]),
            num_image_tokens=images_kwargs.get("num_image_tokens", processor.num_image_tokens),
        )


class MiniCpmV46Adapter(ModelAdapter):
    """MiniCPM-V 4.6: its processor numbers each image of a prompt (``<image_id>N</image_id>``
    before the image's replacement, counted per prompt), written into the prompt here; the
    replacement reads the token divisor its ``_process_images`` passes (16x or 4x downsampling).
    The tower takes an image's views packed along the pixel axis (NaViT), so several images'
    pixels are concatenated on that axis, their view sizes one after the other."""

    def format_prompt(self, processor: Any, prompt: str) -> str:
        if not processor.default_use_image_id:
            return prompt
        image = processor.image_token
        parts = prompt.split(image)
        start, end = processor.image_id_start_token, processor.image_id_end_token
        return parts[0] + "".join(
            f"{start}{i}{end}{image}{part}" for i, part in enumerate(parts[1:])
        )

    def replacement(self, processor: Any, layout: Layout, images_kwargs: dict[str, Any]) -> str:
        mode = images_kwargs.get("downsample_mode") or processor.image_processor.downsample_mode
        return processor.replace_image_token(
            layout_inputs(layout), 0, image_token_divisor=4 if mode == "4x" else 16
        )

    def encode(self, features: list[dict[str, Any]], rows: Sequence[int]) -> list[CachedEmbedding]:
        fn = self.image_features_fn
        pixels = torch.cat([f["pixel_values"] for f in features], dim=-1)
        sizes = torch.cat([torch.as_tensor(f["target_sizes"]) for f in features])
        out = fn(pixel_values=pixels, target_sizes=sizes.to(pixels.device))
        return [CachedEmbedding(e, []) for e in split_rows(_pooled(out), rows)]


class MiniCpmV47Adapter(MiniCpmV46Adapter):
    """MiniCPM-V 4.7: MiniCPM-V 4.6's layout with canvas M-RoPE, whose ``get_rope_index`` reads
    the images' view sizes (``target_sizes``) rather than a patch grid."""

    def mrope(self, input_ids: list[int], layouts: list[Layout]) -> tuple[torch.Tensor, int]:
        ids = torch.tensor([input_ids])
        kwargs: dict[str, Any] = {}
        if layouts:
            sizes = [torch.as_tensor(np.asarray(layout["target_sizes"])) for layout in layouts]
            kwargs["target_sizes"] = torch.cat(sizes)
        mm_types = (ids == self.image_token_id).int()
        positions, delta = self.inner.get_rope_index(ids, mm_token_type_ids=mm_types, **kwargs)
        return positions[:, 0], int(delta.reshape(-1)[0])
