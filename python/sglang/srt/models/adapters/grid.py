"""Families whose vision tower cuts an image into a patch grid merged 2x2 (Qwen-VL, GLM-4.1V,
ERNIE, PaddleOCR-VL, HunYuan-VL and Qwen's omni thinkers): size rules from ``smart_resize``,
videos as frame-group grids, M-RoPE inputs.
"""

from __future__ import annotations

import importlib
from typing import Any

import numpy as np
import torch

from sglang.srt.models.adapters.base import Layout, ModelAdapter


def _grid_settings(image_processor: Any, images_kwargs: dict[str, Any]) -> tuple[dict, int, int]:
    """(size bounds, patch size, merge size) of a Qwen-style grid processor."""
    size = images_kwargs.get("size") or image_processor.size
    patch = images_kwargs.get("patch_size") or image_processor.patch_size
    merge = images_kwargs.get("merge_size") or image_processor.merge_size
    return size, patch, merge


def _grid_layout(resized: tuple[int, int], patch: int) -> Layout:
    return {"image_grid_thw": np.array([[1, resized[0] // patch, resized[1] // patch]])}


def _smart_resize_layout(
    module: str, processor: Any, images_kwargs: dict[str, Any], width: int, height: int
) -> Layout:
    """``image_grid_thw`` by the ``smart_resize`` of the family's PIL image-processor module
    ``module`` (Qwen's rule, which several families copy: sides multiples of patch x merge,
    pixels within the processor's ``size`` bounds)."""
    smart_resize = importlib.import_module(module).smart_resize
    size, patch, merge = _grid_settings(processor.image_processor, images_kwargs)
    resized = smart_resize(
        height,
        width,
        factor=patch * merge,
        min_pixels=size["shortest_edge"],
        max_pixels=size["longest_edge"],
    )
    return _grid_layout(resized, patch)


_VIDEO_TYPES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe", "qwen3_5", "qwen3_5_moe")


class QwenVLAdapter(ModelAdapter):
    """Qwen2-VL / Qwen2.5-VL / Qwen3-VL (dense and MoE): ``image_grid_thw`` from Qwen's
    ``smart_resize`` (M-RoPE and deepstack features come with the generic adapter)."""

    def layout_from_size(
        self, processor: Any, images_kwargs: dict[str, Any], width: int, height: int
    ) -> Layout | None:
        return _smart_resize_layout(
            "transformers.models.qwen2_vl.image_processing_pil_qwen2_vl",
            processor,
            images_kwargs,
            width,
            height,
        )

    # Qwen's vision towers attend within a frame group only (``cu_seqlens`` and Qwen2.5-VL's
    # windows are built per group of ``temporal_patch_size`` frames).
    separable_video_groups = True

    def video_layout(self, video: Any, settings: Any) -> Layout:
        """``video_grid_thw``; Qwen2.5-VL's ``second_per_grid_ts`` (frame group length in
        seconds, for M-RoPE); Qwen3-VL's ``timestamps`` (seconds of each frame group, written
        into the prompt)."""
        if self.config.model_type not in _VIDEO_TYPES:
            raise ValueError(f"videos are not supported for {self.config.model_type} yet")
        frames, height, width = video.frames.shape[:3]
        temporal, patch = settings.temporal_patch_size, settings.patch_size
        layout: Layout = {
            "video_grid_thw": np.array([[-(-frames // temporal), height // patch, width // patch]])
        }
        if self.config.model_type.startswith("qwen3"):
            times = frame_timestamps(video.indices, video.native_fps, temporal)
            layout["timestamps"] = np.array(times)
        else:
            layout["second_per_grid_ts"] = np.float64(temporal / video.sampled_fps)
        return layout

    def video_group_rows(self, layout: Layout, settings: Any) -> int:
        _, grid_h, grid_w = np.asarray(layout["video_grid_thw"]).reshape(-1)
        return int(grid_h * grid_w) // settings.merge_size**2

    def video_replacement(self, processor: Any, layout: Layout, settings: Any) -> str:
        """HF's text for one video: its pads, or for Qwen3-VL each frame group's pads wrapped
        in vision start / end after its ``<t seconds>``."""
        rows = self.video_group_rows(layout, settings)
        if "timestamps" not in layout:
            return processor.video_token * rows * int(layout["video_grid_thw"][0][0])
        group = processor.vision_start_token + processor.video_token * rows
        group += processor.vision_end_token
        return "".join(f"<{t:.1f} seconds>" + group for t in layout["timestamps"])


class Glm4vAdapter(ModelAdapter):
    """GLM-4.1V: ``image_grid_thw`` from GLM's own ``smart_resize`` (M-RoPE is generic).

    Videos: each frame group (two frames) is written as an image, ``<|begin_of_image|>``, its
    ``<|image|>`` rows, ``<|end_of_image|>`` and its whole second, between
    ``<|begin_of_video|>`` and ``<|end_of_video|>``; image tokens inside those are video rows
    (HF's ``create_mm_token_type_ids``) and ``get_rope_index`` gives each group its own grid.
    Frame groups are separable: ``get_video_features`` hands the tower one ``(1, h, w)`` grid
    per group, and the tower's attention (``cu_seqlens`` per grid), rotary and interpolated
    position embeddings (per grid) and its downsample / merger (per 2x2 block) never mix two
    grids."""

    separable_video_groups = True

    def layout_from_size(
        self, processor: Any, images_kwargs: dict[str, Any], width: int, height: int
    ) -> Layout | None:
        from transformers.models.glm4v.image_processing_pil_glm4v import smart_resize

        image_processor = processor.image_processor
        size, patch, merge = _grid_settings(image_processor, images_kwargs)
        temporal = images_kwargs.get("temporal_patch_size") or image_processor.temporal_patch_size
        resized = smart_resize(
            num_frames=temporal,
            height=height,
            width=width,
            temporal_factor=temporal,
            factor=patch * merge,
            min_pixels=size["shortest_edge"],
            max_pixels=size["longest_edge"],
        )
        return _grid_layout(resized, patch)

    @property
    def video_placeholder_id(self) -> int | None:
        return self.image_token_id

    def mm_token_types(self, ids: np.ndarray) -> np.ndarray:
        """Image tokens between a video's start and end tokens are video rows (a model of this
        layout without video tokens, Cosmos3 Edge, has image rows only)."""
        start = getattr(self.config, "video_start_token_id", None)
        end = getattr(self.config, "video_end_token_id", None)
        if start is None or end is None:
            return super().mm_token_types(ids)
        starts = np.cumsum(ids == start)
        ends = np.cumsum(ids == end)
        image = ids == self.image_token_id
        return np.where(image, np.where(starts > ends, 2, 1), 0).astype(np.int64)

    def video_layout(self, video: Any, settings: Any) -> Layout:
        """``video_grid_thw`` and ``timestamps``: the seconds of every kept frame (the prompt
        writes each group's first, truncated)."""
        frames, height, width = video.frames.shape[:3]
        temporal, patch = settings.temporal_patch_size, settings.patch_size
        indices = video.indices if video.indices is not None else np.arange(frames)
        return {
            "video_grid_thw": np.array([[-(-frames // temporal), height // patch, width // patch]]),
            "timestamps": np.asarray(indices, dtype=np.float64) / video.native_fps,
        }

    def video_group_rows(self, layout: Layout, settings: Any) -> int:
        _, grid_h, grid_w = np.asarray(layout["video_grid_thw"]).reshape(-1)
        return int(grid_h * grid_w) // settings.merge_size**2

    def video_inputs(self, layout: Layout) -> dict[str, Any]:
        from transformers.video_utils import VideoMetadata

        seconds = [float(t) for t in layout["timestamps"]]
        metadata = VideoMetadata(total_num_frames=len(seconds), fps=1.0, frames_indices=seconds)
        return {"video_grid_thw": layout["video_grid_thw"], "video_metadata": [metadata]}


class PaddleOcrVlAdapter(ModelAdapter):
    """PaddleOCR-VL: ``image_grid_thw`` from its own ``smart_resize`` (no temporal factor;
    M-RoPE is generic)."""

    def layout_from_size(
        self, processor: Any, images_kwargs: dict[str, Any], width: int, height: int
    ) -> Layout | None:
        return _smart_resize_layout(
            "transformers.models.paddleocr_vl.image_processing_pil_paddleocr_vl",
            processor,
            images_kwargs,
            width,
            height,
        )


class HunYuanVlAdapter(ModelAdapter):
    """HunYuan-VL: ``image_grid_thw`` from its own ``smart_resize`` (factor patch x merge; the
    replacement adds a newline token per merged row and two wrapper tokens, all image tokens);
    its XD-RoPE positions (4 axes) come from the generic ``get_rope_index``."""

    def layout_from_size(
        self, processor: Any, images_kwargs: dict[str, Any], width: int, height: int
    ) -> Layout | None:
        return _smart_resize_layout(
            "transformers.models.hunyuan_vl.image_processing_pil_hunyuan_vl",
            processor,
            images_kwargs,
            width,
            height,
        )


class HyperClovaXVisionAdapter(QwenVLAdapter):
    """HyperCLOVA X SEED vision: Qwen's grid (plain positions: no ``get_rope_index``); its LM's
    ``logits_scaling`` is a MuP multiplier (Granite's is a divisor), and HF's VLM head applies
    it, so the engine multiplies too."""

    def scale_logits(self, logits: torch.Tensor) -> torch.Tensor:
        scaling = getattr(self.text_config, "logits_scaling", None)
        return logits * scaling if scaling and scaling != 1 else logits


class Ernie45VlMoeAdapter(ModelAdapter):
    """ERNIE-4.5-VL: ``image_grid_thw`` from its own ``smart_resize`` (M-RoPE is generic); its
    MoE layers route each token by modality (``moe_mm_token_type_ids``: image tokens and their
    start / end tokens to the vision experts, video ones to theirs), computed from the step's
    token ids as its processor computes them."""

    def layout_from_size(
        self, processor: Any, images_kwargs: dict[str, Any], width: int, height: int
    ) -> Layout | None:
        return _smart_resize_layout(
            "transformers.models.ernie4_5_vl_moe.image_processing_pil_ernie4_5_vl_moe",
            processor,
            images_kwargs,
            width,
            height,
        )

    def token_lm_kwargs(self, input_ids: torch.Tensor) -> dict[str, Any]:
        config = self.config
        types = torch.zeros_like(input_ids)
        for kind, value in (("image", 1), ("video", 2)):
            ids = [getattr(config, f"{kind}{part}_token_id") for part in ("", "_start", "_end")]
            types[torch.isin(input_ids, torch.tensor(ids, device=input_ids.device))] = value
        return {"moe_mm_token_type_ids": types[None]}


class QwenOmniThinkerAdapter(QwenVLAdapter):
    """Qwen2.5-Omni's thinker, images only: Qwen's grid size rule; its ``get_rope_index`` takes
    the image grids alone (no token types; audio and video arguments left out)."""

    def mrope(self, input_ids: list[int], layouts: list[Layout]) -> tuple[torch.Tensor, int]:
        ids = torch.tensor([input_ids])
        grids = [torch.as_tensor(layout["image_grid_thw"]) for layout in layouts]
        positions, delta = self.inner.get_rope_index(
            ids,
            image_grid_thw=torch.cat(grids) if grids else None,
            attention_mask=torch.ones_like(ids),  # a prompt without images reads it
        )
        return positions[:, 0], int(delta.reshape(-1)[0])


def frame_timestamps(indices: np.ndarray, native_fps: float, temporal: int) -> list[float]:
    """Qwen3-VL's time of each frame group: the mean time of its first and last frame (the last
    index repeated up to whole groups)."""
    times = [int(i) / native_fps for i in indices]
    times += [times[-1]] * (-len(times) % temporal)
    return [(times[i] + times[i + temporal - 1]) / 2 for i in range(0, len(times), temporal)]
