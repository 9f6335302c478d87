"""LLaVA-style families: a CLIP/SigLIP-like tower and a projector, one image placeholder
expanded to its rows (LLaVA, LLaVA-OneVision, Pixtral, Granite Vision, Ovis2, Aria,
Idefics2, Granite Docling, LightOnOCR, Video-LLaVA).
"""

from __future__ import annotations

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
    accepted_kwargs,
    batch_features,
    split_rows,
)


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
