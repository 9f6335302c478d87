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
    def split_features(self, processed: dict[str, Any], num_images: int) -> list[dict[str, Any]]:
        pixel_values = processed["pixel_values"]
        return [{"pixel_values": pixel_values[i : i + 1]} for i in range(num_images)]

    def num_tokens(self, features: dict[str, Any]) -> int | None:
        """Placeholder count of one image, when known from its features alone."""
        return None

    def encode(self, items: list[dict[str, Any]]) -> list[CachedEmbedding]:
        pixel_values = torch.cat([f["pixel_values"] for f in items])
        out = self.model.model.get_image_features(
            pixel_values=pixel_values, **self.encoder_kwargs()
        )
        return [CachedEmbedding(e.reshape(-1, e.shape[-1])) for e in _per_image(out, len(items))]

    def encoder_kwargs(self) -> dict[str, Any]:
        return {}

    def mrope(self, input_ids: list[int], items: list[dict[str, Any]]) -> tuple[torch.Tensor, int]:
        raise NotImplementedError


class TextAdapter(ModelAdapter):
    pass


class LlavaAdapter(ModelAdapter):
    def num_tokens(self, features: dict[str, Any]) -> int | None:
        vision = self.config.vision_config
        patches = (vision.image_size // vision.patch_size) ** 2
        return patches + int(self.config.vision_feature_select_strategy == "full")

    def encoder_kwargs(self) -> dict[str, Any]:
        return {
            "vision_feature_layer": self.config.vision_feature_layer,
            "vision_feature_select_strategy": self.config.vision_feature_select_strategy,
        }


class Gemma3Adapter(ModelAdapter):
    bidirectional_images = True

    def num_tokens(self, features: dict[str, Any]) -> int | None:
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

    def num_tokens(self, features: dict[str, Any]) -> int | None:
        return int(np.prod(_as_numpy(features["image_grid_thw"]))) // self.merge_size**2

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

    def mrope(self, input_ids: list[int], items: list[dict[str, Any]]) -> tuple[torch.Tensor, int]:
        ids = torch.tensor([input_ids])
        grids = torch.cat([torch.as_tensor(f["image_grid_thw"]) for f in items]) if items else None
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
