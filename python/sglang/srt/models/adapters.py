"""What differs between model families, kept to data and small functions.

An adapter never reimplements a forward pass: it says how to split the processor output into
per-image features, how to run the HF vision encoder on a batch of them, and how positions are
computed. The language model itself always runs as HF wrote it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

from sglang.srt.mem_cache.mm_embedding_cache import CachedEmbedding


class ModelAdapter:
    uses_mrope = False
    bidirectional_images = False
    feature_keys: tuple[str, ...] = ("pixel_values",)

    def __init__(self, model: nn.Module, config: Any) -> None:
        self.model = model
        self.config = config
        self.text_config = config.get_text_config()
        self.image_token_id: int | None = getattr(config, "image_token_id", None)
        if self.image_token_id is None:
            self.image_token_id = getattr(config, "image_token_index", None)

    # Language model -------------------------------------------------------------------------
    @property
    def language_model(self) -> nn.Module:
        inner = self.model.model
        return getattr(inner, "language_model", inner)

    def lm_kwargs(self, image_positions: torch.Tensor, extras: list[torch.Tensor]) -> dict:
        """Extra language-model inputs for the image tokens of a step (empty for most models)."""
        return {}

    # Vision encoder -------------------------------------------------------------------------
    # Image layout: what placeholder expansion and positions need, known without pixels -------
    def layout(self, image_processor: Any, width: int, height: int) -> dict[str, Any] | None:
        """The layout of a ``width`` x ``height`` image, or None when only preprocessing can
        tell (the image is then preprocessed eagerly)."""
        return None

    def layout_of(self, features: dict[str, Any]) -> dict[str, Any]:
        """The layout of an image from its preprocessed features."""
        return {}

    def replacement(self, hf_processor: Any, layout: dict[str, Any]) -> str:
        """The text that replaces one image placeholder (HF's own expansion)."""
        return hf_processor.replace_image_token(layout, 0)

    def split_features(self, processed: dict[str, Any], num_images: int) -> list[dict[str, Any]]:
        pixel_values = processed["pixel_values"]
        return [{"pixel_values": pixel_values[i : i + 1]} for i in range(num_images)]

    def num_tokens(self, layout: dict[str, Any]) -> int | None:
        """Placeholder count of one image, when known from its layout."""
        return None

    def encode(self, items: list[dict[str, Any]]) -> list[CachedEmbedding]:
        pixel_values = torch.cat([f["pixel_values"] for f in items])
        out = self.model.model.get_image_features(
            pixel_values=pixel_values, **self.encoder_kwargs()
        )
        return [CachedEmbedding(e.reshape(-1, e.shape[-1])) for e in _per_image(out, len(items))]

    def encoder_kwargs(self) -> dict[str, Any]:
        return {}

    def mrope(
        self, input_ids: list[int], layouts: list[dict[str, Any]]
    ) -> tuple[torch.Tensor, int]:
        raise NotImplementedError


class TextAdapter(ModelAdapter):
    pass


class LlavaAdapter(ModelAdapter):
    def layout(self, image_processor: Any, width: int, height: int) -> dict[str, Any] | None:
        if not image_processor.do_center_crop:
            return None
        crop = image_processor.crop_size
        return {"pixel_shape": (int(crop["height"]), int(crop["width"]))}

    def layout_of(self, features: dict[str, Any]) -> dict[str, Any]:
        return {"pixel_shape": tuple(int(d) for d in features["pixel_values"].shape[-2:])}

    def replacement(self, hf_processor: Any, layout: dict[str, Any]) -> str:
        shaped = np.empty((3, *layout["pixel_shape"]), dtype=np.float32)
        return hf_processor.replace_image_token({"pixel_values": [shaped]}, 0)

    def num_tokens(self, layout: dict[str, Any]) -> int | None:
        patch = self.config.vision_config.patch_size
        height, width = layout["pixel_shape"]
        tokens = (height // patch) * (width // patch)
        return tokens + int(self.config.vision_feature_select_strategy == "full")

    def encoder_kwargs(self) -> dict[str, Any]:
        return {
            "vision_feature_layer": self.config.vision_feature_layer,
            "vision_feature_select_strategy": self.config.vision_feature_select_strategy,
        }


class Gemma3Adapter(ModelAdapter):
    bidirectional_images = True

    def layout(self, image_processor: Any, width: int, height: int) -> dict[str, Any] | None:
        return None if image_processor.do_pan_and_scan else {"num_crops": [0]}

    def layout_of(self, features: dict[str, Any]) -> dict[str, Any]:
        crops = [int(c) for c in np.asarray(features.get("num_crops", [0])).reshape(-1)]
        if any(crops):
            raise ValueError("Gemma3 pan-and-scan crops are not supported")
        return {"num_crops": crops}

    def num_tokens(self, layout: dict[str, Any]) -> int | None:
        return self.config.mm_tokens_per_image


class QwenVLAdapter(ModelAdapter):
    uses_mrope = True
    feature_keys = ("pixel_values", "image_grid_thw")

    @property
    def merge_size(self) -> int:
        return self.config.vision_config.spatial_merge_size

    def split_features(self, processed: dict[str, Any], num_images: int) -> list[dict[str, Any]]:
        grids = processed["image_grid_thw"]
        rows = [int(np.prod(g)) for g in _as_numpy(grids)]
        bounds = np.cumsum([0, *rows])
        return [
            {
                "pixel_values": processed["pixel_values"][bounds[i] : bounds[i + 1]],
                "image_grid_thw": grids[i : i + 1],
            }
            for i in range(num_images)
        ]

    def layout(self, image_processor: Any, width: int, height: int) -> dict[str, Any] | None:
        patch = image_processor.patch_size
        resized_h, resized_w = smart_resize(
            height,
            width,
            patch * image_processor.merge_size,
            min_pixels=image_processor.size["shortest_edge"],
            max_pixels=image_processor.size["longest_edge"],
        )
        return {"image_grid_thw": np.array([[1, resized_h // patch, resized_w // patch]])}

    def layout_of(self, features: dict[str, Any]) -> dict[str, Any]:
        return {"image_grid_thw": _as_numpy(features["image_grid_thw"]).reshape(1, 3)}

    def num_tokens(self, layout: dict[str, Any]) -> int | None:
        return int(np.prod(_as_numpy(layout["image_grid_thw"]))) // self.merge_size**2

    def encode(self, items: list[dict[str, Any]]) -> list[CachedEmbedding]:
        out = self.model.model.get_image_features(
            pixel_values=torch.cat([f["pixel_values"] for f in items]),
            image_grid_thw=torch.cat([f["image_grid_thw"] for f in items]),
        )
        embeds = _per_image(out, len(items))
        deepstack = getattr(out, "deepstack_features", None) or []
        return [
            CachedEmbedding(embeds[i], [layer[i] for layer in deepstack]) for i in range(len(items))
        ]

    def mrope(
        self, input_ids: list[int], layouts: list[dict[str, Any]]
    ) -> tuple[torch.Tensor, int]:
        ids = torch.tensor([input_ids])
        grids = None
        if layouts:
            grids = torch.cat([torch.as_tensor(lay["image_grid_thw"]) for lay in layouts])
        positions, delta = self.model.model.get_rope_index(
            ids, mm_token_type_ids=(ids == self.image_token_id).int(), image_grid_thw=grids
        )
        return positions[:, 0], int(delta.reshape(-1)[0])

    def lm_kwargs(self, image_positions: torch.Tensor, extras: list[torch.Tensor]) -> dict:
        if not extras:
            return {}
        return {"visual_pos_masks": image_positions, "deepstack_visual_embeds": extras}


_ADAPTERS: dict[str, type[ModelAdapter]] = {
    "qwen2_vl": QwenVLAdapter,
    "qwen2_5_vl": QwenVLAdapter,
    "qwen3_vl": QwenVLAdapter,
    "qwen3_5": QwenVLAdapter,  # no deepstack; its linear-attention state: model_executor/hybrid
    "qwen3_5_moe": QwenVLAdapter,
    "llava": LlavaAdapter,
    "gemma3": Gemma3Adapter,
}


def get_adapter(model: nn.Module, config: Any) -> ModelAdapter:
    if not hasattr(config, "vision_config"):
        return TextAdapter(model, config)
    if config.model_type not in _ADAPTERS:
        raise ValueError(
            f"model type {config.model_type!r} is not supported; "
            f"supported VLMs: {sorted(_ADAPTERS)}"
        )
    return _ADAPTERS[config.model_type](model, config)


def _per_image(out: Any, n: int) -> list[torch.Tensor]:
    embeds = getattr(out, "pooler_output", out)
    if isinstance(embeds, torch.Tensor) and embeds.ndim == 2:
        embeds = embeds.chunk(n) if n > 1 else [embeds]
    return [e.reshape(-1, e.shape[-1]) for e in embeds]


def _as_numpy(value: Any) -> np.ndarray:
    return value.numpy() if isinstance(value, torch.Tensor) else np.asarray(value)
