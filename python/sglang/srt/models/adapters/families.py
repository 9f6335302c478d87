"""Where a family really differs from the generic adapter, and why.

Most overrides are *size rules*: the layout of an image computed from its size alone, so that
the placeholder text is known without preprocessing (an image whose embedding is cached is then
never preprocessed, not even the first time its size is seen).
"""

from __future__ import annotations

import importlib
import math
import re
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
    accepted_kwargs,
    batch_features,
    layout_inputs,
    split_rows,
)


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
            from sglang.srt.multimodal.video_preprocess import frame_timestamps

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


class LlavaAdapter(ModelAdapter):
    """LLaVA 1.5: every image becomes the processor's center crop (the replacement reads only
    the pixel shape)."""

    def layout_from_size(
        self, processor: Any, images_kwargs: dict[str, Any], width: int, height: int
    ) -> Layout | None:
        image_processor = processor.image_processor
        if not images_kwargs.get("do_center_crop", image_processor.do_center_crop):
            return None
        crop = images_kwargs.get("crop_size") or image_processor.crop_size
        return {"pixel_values": PixelShape((1, 3, int(crop["height"]), int(crop["width"])))}


class Gemma3Adapter(ModelAdapter):
    """Gemma3: image tokens attend bidirectionally, so a chunk never splits an image; without
    pan-and-scan every image is one fixed-size crop."""

    bidirectional = "images"

    def layout_from_size(
        self, processor: Any, images_kwargs: dict[str, Any], width: int, height: int
    ) -> Layout | None:
        if images_kwargs.get("do_pan_and_scan"):
            return None
        return {"num_crops": np.array([0])}


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


class PixtralAdapter(ModelAdapter):
    """Mistral3 (Pixtral tower): the replacement reads the resized size, which Pixtral's resize
    rule gives from the size (rows of ``[IMG]`` tokens broken by ``[IMG_BREAK]``)."""

    def layout_from_size(
        self, processor: Any, images_kwargs: dict[str, Any], width: int, height: int
    ) -> Layout | None:
        from transformers.models.pixtral.image_processing_pil_pixtral import (
            get_resize_output_image_size,
        )

        longest = (images_kwargs.get("size") or processor.image_processor.size)["longest_edge"]
        patch = processor.patch_size * processor.spatial_merge_size
        shape_only = np.broadcast_to(np.uint8(0), (height, width, 3))
        resized = get_resize_output_image_size(
            shape_only, size=(longest, longest), patch_size=(patch, patch)
        )
        return {"image_sizes": np.array([resized])}


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


class FixedCountAdapter(ModelAdapter):
    """DeepSeek-VL (and -Hybrid): every image is resized to one square, so the replacement is
    the same ``num_image_tokens`` run whatever the size."""

    def layout_from_size(
        self, processor: Any, images_kwargs: dict[str, Any], width: int, height: int
    ) -> Layout | None:
        return {}


class Granite4VisionAdapter(ModelAdapter):
    """Granite 4 Vision: image tokens enter the LM as zeros; the encoder's features are added
    at the image positions before given decoder layers (``deepstack_features`` as
    ``(llm_layer, per-image features)`` pairs, a later pair for a layer replacing an earlier one
    as HF's dict does). They are cached with the image as its extras, in layer order."""

    @property
    def injection_layers(self) -> list[int]:
        pairs = [layer for _, layer in self.config.deepstack_layer_map or []]
        return list(dict.fromkeys([*pairs, *self.config.spatial_target_layers]))

    def encode(self, features: list[dict[str, Any]], rows: Sequence[int]) -> list[CachedEmbedding]:
        fn = self.image_features_fn
        out = fn(**batch_features(features, accepted_kwargs(fn)))
        by_layer = {layer: split_rows(packed, rows) for layer, packed in out.deepstack_features}
        layers = self.injection_layers
        assert list(by_layer) == layers, (list(by_layer), layers)
        hidden = self.text_config.hidden_size
        return [
            CachedEmbedding(
                by_layer[layers[0]][i].new_zeros(n, hidden), [by_layer[k][i] for k in layers]
            )
            for i, n in enumerate(rows)
        ]

    def lm_kwargs(self, image_positions: torch.Tensor, extras: list[torch.Tensor]) -> dict:
        if not extras:
            return {}
        return {
            "vision_mask": image_positions.unsqueeze(-1),  # (1, T, 1), as HF's placeholder mask
            "deepstack_features": dict(zip(self.injection_layers, extras)),
        }


class Ovis2Adapter(ModelAdapter):
    """Ovis2: the indicator tokens around and between an image's tiles (``<IMG_START>``,
    ``<IMG_GRID>``, ...) take learned visual embeddings instead of their text embeddings. They
    do not depend on the image, so they are computed once and written over the prompt's text
    embeddings; the image rows themselves are generic."""

    def token_embedding_overrides(self) -> dict[int, torch.Tensor]:
        if not hasattr(self, "_overrides"):
            inner = self.inner
            count = inner.vision_tower.num_visual_indicator_tokens
            ids = torch.arange(inner.visual_vocab_size - count, inner.visual_vocab_size)
            with torch.no_grad():
                table = inner.visual_embeddings_table
                rows = table(ids.to(table.weight.device))
            self._overrides = dict(zip(inner.visual_indicator_token_ids, rows))
        return self._overrides


class LlavaOnevisionAdapter(ModelAdapter):
    """LLaVA-OneVision: a lone image is encoded with its anyres tiles, while in a prompt with
    several images each keeps only its padded base view (``batch_num_images`` in HF's
    processor and ``get_image_features``). The context is single vs several, written as HF's
    ``batch_num_images`` of 1 or 2: the processor and the encoder only test ``n == 1``, and
    an encoder call of k images of one context gets k entries (k x 2 tiling flags for k images
    of several: the flags past the k-th are never read).

    Videos: every frame becomes the tower's fixed-size view, and its features are pooled 2x2
    (bilinear) to ``ceil(side / 2)^2`` rows; the video ends with one learned newline row.
    Frames are separable (a frame group is one frame): ``get_video_features`` runs the SigLIP
    tower on the frames as a batch (attention within a frame), the projector per token and the
    pooling per frame (``interpolate`` over each frame's own map); the newline does not depend
    on the pixels, and is the last group's last row."""

    separable_video_groups = True

    def item_context(self, num_items: int) -> Layout:
        return {"batch_num_images": np.array([1 if num_items == 1 else 2])}

    def preprocess(
        self, processor: Any, image: Any, context: Layout, images_kwargs: dict[str, Any]
    ) -> tuple[dict[str, Any], str]:
        if int(context["batch_num_images"][0]) == 1:
            return super().preprocess(processor, image, context, images_kwargs)
        # The processor reads the count from the nesting of its input: the image is given
        # twice as one sample, and the second copy dropped.
        processed, replacements = processor._process_images([[image, image]], **images_kwargs)
        features = {
            "pixel_values": processed["pixel_values"][:1],
            "image_sizes": processed["image_sizes"][:1],
            "batch_num_images": np.array([2]),
        }
        return features, replacements[0]

    def video_layout(self, video: Any, settings: Any) -> Layout:
        frames, height, width = video.frames.shape[:3]
        return {"pixel_values_videos": PixelShape((1, frames, 3, height, width))}

    def video_group_rows(self, layout: Layout, settings: Any) -> int:
        vision = self.config.vision_config
        return math.ceil(vision.image_size // vision.patch_size / 2) ** 2

    def video_rows(self, layout: Layout, settings: Any) -> int:
        return super().video_rows(layout, settings) + 1  # the newline

    @property
    def video_features_fn(self) -> Any:
        return self.model.get_video_features  # the outer model fills the config's defaults

    def encode_videos(
        self, features: list[dict[str, Any]], rows: Sequence[int]
    ) -> list[CachedEmbedding]:
        """Every item's frames in one batch; an item asking for one row more than its frames
        give (a whole video, or its last frame group) ends with the newline."""
        frames = [f["pixel_values_videos"] for f in features]
        out = self.video_features_fn(pixel_values_videos=torch.cat(frames, dim=1))
        pooled = out.pooler_output[0]
        per_frame = self.video_group_rows({}, None)
        newline, start = pooled[-1:], 0
        entries = []
        for count, want in zip((f.shape[1] for f in frames), rows):
            part = pooled[start : start + count * per_frame]
            start += count * per_frame
            if want == part.shape[0] + 1:
                part = torch.cat([part, newline])
            entries.append(CachedEmbedding(part, []))
        return entries


class Gemma4Adapter(ModelAdapter):
    """Gemma 4: an image is resized, keeping its aspect, to the most patches the soft-token
    budget allows, so its token count is a size rule. Where the checkpoint says
    ``use_bidirectional_attention="vision"``, an image's tokens attend both ways in the
    sliding-window layers only (HF's ``create_masks_for_vision_model``). Per-layer KV shapes and
    shared KV come from ``KVLayout``; per-layer inputs from ``token_lm_kwargs``."""

    bidirectional_sliding_only = True
    pad_media_tokens = True

    def __init__(self, model: Any, config: Any) -> None:
        super().__init__(model, config)
        mode = getattr(self.text_config, "use_bidirectional_attention", None)
        if mode not in (None, "vision"):
            raise ValueError(f"Gemma 4 with use_bidirectional_attention={mode!r} is an encoder")
        self.bidirectional = "images" if mode == "vision" else None

    def layout_from_size(
        self, processor: Any, images_kwargs: dict[str, Any], width: int, height: int
    ) -> Layout | None:
        from transformers.models.gemma4.image_processing_pil_gemma4 import (
            get_aspect_ratio_preserving_size,
        )

        image_processor = processor.image_processor
        setting = {
            key: images_kwargs.get(key) or getattr(image_processor, key)
            for key in ("patch_size", "max_soft_tokens", "pooling_kernel_size")
        }
        if not images_kwargs.get("do_resize", image_processor.do_resize):
            return None
        pool = setting["pooling_kernel_size"]
        patch = setting["patch_size"]
        resized = get_aspect_ratio_preserving_size(
            height, width, patch, setting["max_soft_tokens"] * pool**2, pool
        )
        tokens = (resized[0] // patch) * (resized[1] // patch) // pool**2
        return {"num_soft_tokens_per_image": np.array([tokens])}


class PaliGemmaAdapter(FixedCountAdapter):
    """PaliGemma / PaliGemma 2: a prefix-LM. The processor lays a prompt out as its images,
    ``<bos>``, the text and a newline; that whole prefix attends both ways (HF's
    ``token_type_ids`` 0), the answer causally, so the prompt is prefilled in one piece and its
    KV serves only the same prompt again. Positions count from 1. Every image is resized to one
    square: a fixed ``image_seq_length`` tokens."""

    bidirectional = "prompt"
    window_bounds_spans = False
    position_offset = 1

    def format_prompt(self, processor: Any, prompt: str) -> str:
        bos = processor.tokenizer.bos_token
        image = processor.image_token
        cut = prompt.rfind(image) + len(image) if image in prompt else 0
        return prompt[:cut] + bos + prompt[cut:] + "\n"


class ShieldGemma2Adapter(Gemma3Adapter):
    """ShieldGemma 2: Gemma 3 under its own model_type, its checkpoints stored for
    ``ShieldGemma2ForImageClassification`` (the Gemma 3 model under ``model.``, the pre-5.0 key
    names), whose key renaming transformers 5 applies to every class loading a
    ``shieldgemma2`` config: AutoModelForImageTextToText would miss the language model's
    weights. The classifier is loaded and its Gemma 3 model served, for generation (its
    Yes / No probabilities are the logits of those two tokens)."""

    checkpoint_class = "ShieldGemma2ForImageClassification"


class LightOnOcrAdapter(ModelAdapter):
    """LightOnOCR: the Pixtral image processor's resize rule with its own patch size (the
    processor passes none, unlike Mistral3's), the replacement one run of image tokens per
    merged patch of the resized size."""

    def layout_from_size(
        self, processor: Any, images_kwargs: dict[str, Any], width: int, height: int
    ) -> Layout | None:
        from transformers.models.pixtral.image_processing_pil_pixtral import (
            get_resize_output_image_size,
        )

        image_processor = processor.image_processor
        if not images_kwargs.get("do_resize", image_processor.do_resize):
            return None
        longest = (images_kwargs.get("size") or image_processor.size)["longest_edge"]
        patch = images_kwargs.get("patch_size") or image_processor.patch_size
        if not isinstance(patch, int):
            patch = (patch["height"], patch["width"])
        shape_only = np.broadcast_to(np.uint8(0), (height, width, 3))
        resized = get_resize_output_image_size(
            shape_only, size=(longest, longest), patch_size=patch
        )
        return {"image_sizes": np.array([resized])}


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


class Idefics2Adapter(ModelAdapter):
    """Idefics2: its processor expands placeholders in its own ``__call__`` (no
    ``replace_image_token``): an image is ``<fake>`` + (``<image>`` x ``image_seq_len`` +
    ``<fake>``) per view, 5 views (4 crops and the image) when the image processor splits
    images, else 1; the count does not depend on the size. Its text edits are kept: two
    adjacent images share one ``<fake>`` between them and a word right after an image gets a
    space. The closing ``<fake>`` of an image run is written into the prompt with the
    placeholder (``format_prompt``), so the replacement leaves it out."""

    def format_prompt(self, processor: Any, prompt: str) -> str:
        image, fake = processor.image_token, processor.fake_image_token
        if image not in prompt:
            return prompt
        image_re = re.escape(image)
        prompt = re.sub(rf"{image_re}(?!{image_re})", image + fake, prompt)
        return re.sub(rf"{re.escape(fake)}(?=[^\s<])", f"{fake} ", prompt)

    def layout_from_size(
        self, processor: Any, images_kwargs: dict[str, Any], width: int, height: int
    ) -> Layout | None:
        return {}

    def replacement(self, processor: Any, layout: Layout, images_kwargs: dict[str, Any]) -> str:
        views = 5 if processor.image_processor.do_image_splitting else 1
        run = processor.image_token * processor.image_seq_len
        return processor.fake_image_token + (run + processor.fake_image_token) * (views - 1) + run

    def preprocess(
        self, processor: Any, image: Any, context: Layout, images_kwargs: dict[str, Any]
    ) -> tuple[dict[str, Any], str]:
        processed = processor.image_processor([[image]], **images_kwargs)
        return dict(processed), self.replacement(processor, {}, images_kwargs)


class GraniteDoclingAdapter(ModelAdapter):
    """Granite-Docling: the replacement reads the page's tile grid (``rows`` / ``cols``), which
    the image processor computes from the size (``get_tile_grid``), and whether the fine
    connector path was asked for (``tile_fine_mask``: four times the tokens per tile). DeepStack
    features and the Granite LM's logits scaling are generic."""

    def layout_from_size(
        self, processor: Any, images_kwargs: dict[str, Any], width: int, height: int
    ) -> Layout | None:
        image_processor = processor.image_processor
        rows, cols = image_processor.get_tile_grid(height, width, images_kwargs)
        layout: Layout = {"rows": np.array([[rows]]), "cols": np.array([[cols]])}
        if images_kwargs.get("fine_route", image_processor.fine_route):
            layout["tile_fine_mask"] = np.ones(1, dtype=bool)
        return layout


class VideoLlavaAdapter(LlavaAdapter):
    """Video-LLaVA (images only): LLaVA 1.5's center crop, but its image processor returns the
    pixels as ``pixel_values_images`` unless told otherwise (``return_legacy_image_output``,
    true by default); the layout carries the name the processor gives."""

    def layout_from_size(
        self, processor: Any, images_kwargs: dict[str, Any], width: int, height: int
    ) -> Layout | None:
        layout = super().layout_from_size(processor, images_kwargs, width, height)
        if layout is None or not images_kwargs.get("return_legacy_image_output", True):
            return layout
        return {"pixel_values_images": layout["pixel_values"]}


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


class AriaAdapter(ModelAdapter):
    """Aria: without ``split_image`` every image is one view padded to ``max_image_size``,
    so its token count is fixed (the processor's ``size_conversion`` of that size). With
    splitting the processor counts the crops of the whole call (``num_crops`` is the call's
    largest), so an image's layout comes from preprocessing it alone."""

    def layout_from_size(
        self, processor: Any, images_kwargs: dict[str, Any], width: int, height: int
    ) -> Layout | None:
        image_processor = processor.image_processor
        if images_kwargs.get("split_image", image_processor.split_image):
            return None
        side = images_kwargs.get("max_image_size") or image_processor.max_image_size
        return {"pixel_values": PixelShape((1, 3, side, side)), "num_crops": np.array(1)}


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
