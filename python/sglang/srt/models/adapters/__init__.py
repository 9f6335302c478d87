"""Model adapters: the generic HF-driven VLM adapter, the families' overrides, and the check
that tells at startup whether a model can be served."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import nn

from sglang.srt.models.adapters.base import ModelAdapter, TextAdapter
from sglang.srt.models.adapters.families import (
    AriaAdapter,
    FixedCountAdapter,
    Gemma3Adapter,
    Gemma4Adapter,
    Glm4vAdapter,
    GotOcr2Adapter,
    Granite4VisionAdapter,
    GraniteDoclingAdapter,
    HunYuanVlAdapter,
    HyperClovaXVisionAdapter,
    Idefics2Adapter,
    LightOnOcrAdapter,
    LlavaAdapter,
    LlavaOnevisionAdapter,
    Ovis2Adapter,
    PaddleOcrVlAdapter,
    PaliGemmaAdapter,
    PixtralAdapter,
    QwenVLAdapter,
    ShieldGemma2Adapter,
    TiledAdapter,
    VideoLlavaAdapter,
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
    "llava_onevision": LlavaOnevisionAdapter,
    "mistral3": PixtralAdapter,
    "idefics3": ModelAdapter,
    "smolvlm": ModelAdapter,
    "qwen3_vl_moe": QwenVLAdapter,
    "qwen3_5": QwenVLAdapter,  # no deepstack; linear-attention state: linear_attention.py
    "qwen3_5_moe": QwenVLAdapter,
    "glm4v": Glm4vAdapter,
    "deepseek_vl": FixedCountAdapter,
    "deepseek_vl_hybrid": FixedCountAdapter,
    "deepseek_ocr2": ModelAdapter,
    "aya_vision": TiledAdapter,
    "granite4_vision": Granite4VisionAdapter,
    "ovis2": Ovis2Adapter,
    "gemma4": Gemma4Adapter,  # per-layer KV shapes and shared KV: mem_cache/kv_layout.py
    "paligemma": PaliGemmaAdapter,
    "shieldgemma2": ShieldGemma2Adapter,
    "vipllava": LlavaAdapter,
    "lighton_ocr": LightOnOcrAdapter,
    "got_ocr2": GotOcr2Adapter,
    "idefics2": Idefics2Adapter,
    "granite_docling": GraniteDoclingAdapter,
    "glm46v": Glm4vAdapter,  # GLM-4.6V: the GLM-4.1V model and resize rule
    "glmga": Glm4vAdapter,  # GLM-4.6V under another model_type
    "glm4v_moe": Glm4vAdapter,  # GLM-4.5V: an MoE LM
    "glm_ocr": Glm4vAdapter,
    "qianfan_ocr": TiledAdapter,  # InternVL's layout behind an <image> placeholder
    "video_llava": VideoLlavaAdapter,  # images only
    "llava_next_video": ModelAdapter,  # images only (LLaVA-NeXT's)
    "paddleocr_vl": PaddleOcrVlAdapter,
    "aria": AriaAdapter,
    "exaone4_5": QwenVLAdapter,  # Qwen's grid size rule; plain positions (no get_rope_index)
    "hunyuan_vl": HunYuanVlAdapter,
    "lfm3_vl": QwenVLAdapter,  # Qwen's grid, plain positions; short-conv state: linear_attention.py
    "cosmos3_omni": QwenVLAdapter,  # Cosmos3 Reasoner: Qwen3-VL
    "cohere_compass": QwenVLAdapter,  # Qwen3-VL with a Cohere2 LM
    "cosmos3_edge": Glm4vAdapter,  # GLM's resize rule (temporal patch 1); M-RoPE
    "janus": FixedCountAdapter,  # text generation; the image-generation head is unused
    "video_llama_3": QwenVLAdapter,  # Qwen's grid (merge size 1 for images); plain positions
    "hyperclovax_vision_v2": HyperClovaXVisionAdapter,
}


# Families transformers has but this engine cannot serve yet, and what they would need.
KNOWN_GAPS: dict[str, str] = {
    "gemma3n": "per-layer inputs and audio towers are not wired into the engine",
}


class UnsupportedModelError(ValueError):
    """A model this engine cannot serve; the message is one line meant for the user."""


def supported_families() -> list[str]:
    return sorted(FAMILY_ADAPTERS)


def get_adapter(model: nn.Module | None, config: Any) -> ModelAdapter:
    _check_not_prequantized(config)
    if not hasattr(config, "vision_config"):
        return TextAdapter(model, config)
    cls = FAMILY_ADAPTERS.get(config.model_type)
    if cls is None:
        missing = KNOWN_GAPS.get(
            config.model_type, "no adapter for this family (its image layout is untested)"
        )
        raise UnsupportedModelError(
            f"cannot serve model type {config.model_type!r}: {missing}; supported VLM families: "
            f"{', '.join(supported_families())} (and text-only causal LMs)"
        )
    try:
        return cls(model, config)
    except ValueError as exc:
        message = f"cannot serve model type {config.model_type!r}: {exc}"
        raise UnsupportedModelError(message) from None


def load_vlm(model_path: str, config: Any, **kwargs: Any) -> nn.Module:
    """The image-text-to-text model at ``model_path`` (``from_pretrained`` keyword arguments
    passed on): AutoModelForImageTextToText's class, or the inner model of the class the
    family's checkpoints are stored for (``checkpoint_class``)."""
    import transformers

    wrapper = getattr(FAMILY_ADAPTERS.get(config.model_type), "checkpoint_class", None)
    if wrapper is None:
        return transformers.AutoModelForImageTextToText.from_pretrained(model_path, **kwargs)
    model = getattr(transformers, wrapper).from_pretrained(model_path, **kwargs).model
    # A classifier loads no generation config; the checkpoint's is the inner model's.
    if (Path(model_path) / "generation_config.json").is_file():
        model.generation_config = transformers.GenerationConfig.from_pretrained(model_path)
    return model


def _check_not_prequantized(config: Any) -> None:
    """Checkpoints stored quantized (config.json ``quantization_config``: AWQ, GPTQ,
    compressed-tensors, ...) load through transformers' quantizers, which need packages and
    kernels this engine does not have on CPU; refused before their weights load."""
    quant = getattr(config, "quantization_config", None)
    if quant is None:
        return
    get = quant.get if isinstance(quant, dict) else lambda key: getattr(quant, key, None)
    method = get("quant_method") or get("format") or "unknown"
    raise UnsupportedModelError(
        f"cannot serve a checkpoint stored quantized ({method}, config.json "
        "quantization_config): load its unquantized weights and quantize them at start-up "
        "with --torchao-config int8wo or int4wo-<group>"
    )


def check_model(model_path: str, trust_remote_code: bool = False) -> None:
    """Raise ``UnsupportedModelError`` (one line) when the model at ``model_path`` cannot be
    served; reads only its config."""
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(model_path, trust_remote_code=trust_remote_code)
    except (OSError, ValueError, KeyError) as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        message = f"cannot read a model config at {model_path}: {reason}"
        raise UnsupportedModelError(message) from None
    get_adapter(None, config)


__all__ = [
    "FAMILY_ADAPTERS",
    "ModelAdapter",
    "TextAdapter",
    "UnsupportedModelError",
    "check_model",
    "get_adapter",
    "load_vlm",
    "supported_families",
]
