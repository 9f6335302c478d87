"""Model adapters: the generic HF-driven VLM adapter, the families' overrides, and the check
that tells at startup whether a model can be served."""

from __future__ import annotations

from typing import Any

from torch import nn

from sglang.srt.models.adapters.base import ModelAdapter, TextAdapter
from sglang.srt.models.adapters.families import (
    FixedCountAdapter,
    Gemma3Adapter,
    Glm4vAdapter,
    LlavaAdapter,
    PixtralAdapter,
    QwenVLAdapter,
    TiledAdapter,
)

# model_type -> adapter: the families tested at parity with HF (tiny builders in
# sglang.testing.tiny_models). ModelAdapter itself means the generic path needs no override.
FAMILY_ADAPTERS: dict[str, type[ModelAdapter]] = {
    "qwen2_vl": QwenVLAdapter,
    "qwen2_5_vl": QwenVLAdapter,
    "qwen3_vl": QwenVLAdapter,
    "llava": LlavaAdapter,
    "gemma3": Gemma3Adapter,
    "internvl": TiledAdapter,
    "llava_next": ModelAdapter,  # Granite Vision 3.x too (a Granite LM inside)
    "llava_onevision": ModelAdapter,
    "mistral3": PixtralAdapter,
    "idefics3": ModelAdapter,
    "smolvlm": ModelAdapter,
    "qwen3_vl_moe": QwenVLAdapter,
    "glm4v": Glm4vAdapter,
    "deepseek_vl": FixedCountAdapter,
    "deepseek_vl_hybrid": FixedCountAdapter,
    "deepseek_ocr2": ModelAdapter,
    "aya_vision": TiledAdapter,
}


class UnsupportedModelError(ValueError):
    """A model this engine cannot serve; the message is one line meant for the user."""


def supported_families() -> list[str]:
    return sorted(FAMILY_ADAPTERS)


def get_adapter(model: nn.Module | None, config: Any) -> ModelAdapter:
    if not hasattr(config, "vision_config"):
        return TextAdapter(model, config)
    cls = FAMILY_ADAPTERS.get(config.model_type)
    if cls is None:
        raise UnsupportedModelError(
            f"model type {config.model_type!r} is not supported; "
            f"supported VLM families: {', '.join(supported_families())}"
        )
    return cls(model, config)


__all__ = [
    "FAMILY_ADAPTERS",
    "ModelAdapter",
    "TextAdapter",
    "UnsupportedModelError",
    "get_adapter",
    "supported_families",
]
