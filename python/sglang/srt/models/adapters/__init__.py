"""Model adapters: the generic HF-driven VLM adapter, the families' overrides, and the check
that tells at startup whether a model can be served.

Where a family really differs from the generic adapter, and why, lives in one module per kind of
family (``grid``, ``llava``, ``gemma``, ``tiled``). Most overrides are *size rules*: the layout
of an image computed from its size alone, so that the placeholder text is known without
preprocessing (an image whose embedding is cached is then never preprocessed, not even the first
time its size is seen)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import nn

from sglang.srt.models.adapters.base import ModelAdapter, TextAdapter
from sglang.srt.models.adapters.gemma import (
    Gemma3Adapter,
    Gemma4Adapter,
    PaliGemmaAdapter,
    ShieldGemma2Adapter,
)
from sglang.srt.models.adapters.grid import (
    Ernie45VlMoeAdapter,
    Glm4vAdapter,
    HunYuanVlAdapter,
    HyperClovaXVisionAdapter,
    PaddleOcrVlAdapter,
    QwenOmniThinkerAdapter,
    QwenVLAdapter,
)
from sglang.srt.models.adapters.llava import (
    AriaAdapter,
    Granite4VisionAdapter,
    GraniteDoclingAdapter,
    Idefics2Adapter,
    LightOnOcrAdapter,
    LlavaAdapter,
    LlavaOnevisionAdapter,
    Ovis2Adapter,
    PixtralAdapter,
    VideoLlavaAdapter,
)
from sglang.srt.models.adapters.tiled import (
    FixedCountAdapter,
    GotOcr2Adapter,
    InternVLAdapter,
    MiniCpmV46Adapter,
    MiniCpmV47Adapter,
    TiledAdapter,
)

# model_type -> adapter: the families tested at parity with HF (tiny builders in
# sglang_dev.tiny_models). ModelAdapter itself means the generic path needs no override.
FAMILY_ADAPTERS: dict[str, type[ModelAdapter]] = {
    "qwen2_vl": QwenVLAdapter,
    "qwen2_5_vl": QwenVLAdapter,
    "qwen3_vl": QwenVLAdapter,
    "llava": LlavaAdapter,
    "gemma3": Gemma3Adapter,
    "internvl": InternVLAdapter,
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
    "ernie4_5_vl_moe": Ernie45VlMoeAdapter,
    "minicpmv4_6": MiniCpmV46Adapter,  # Qwen3.5 LM: linear-attention state (linear_attention.py)
    "minicpmv4_7": MiniCpmV47Adapter,
    "qwen2_5_omni_thinker": QwenOmniThinkerAdapter,  # images only; the audio tower is unused
    "qwen3_omni_moe_thinker": QwenOmniThinkerAdapter,  # images only; deepstack is generic
}


# Families transformers has but this engine cannot serve yet, and what they would need.
_TORCHVISION = "its image processor exists only for torchvision, which the engine does not use"
KNOWN_GAPS: dict[str, str] = {
    "gemma3n": "its vision tower is a timm model (MobileNetV5) and timm is not installed; its "
    "audio tower is not wired into the engine",
    # Encoder-decoder models: the engine serves decoder-only language models.
    "florence2": "an encoder-decoder (BART-style): the answer is decoded with cross-attention "
    "to the encoded image and prompt",
    "pix2struct": "an encoder-decoder: the image patches are the encoder's input, the text "
    "decoder cross-attends to them",
    "udop": "an encoder-decoder (T5 with a layout-aware encoder over text, boxes and image)",
    "t5gemma2": "an encoder-decoder (T5Gemma 2): the decoder cross-attends to the encoder",
    "pp_formulanet": "an encoder-decoder (image encoder, text decoder with cross-attention); "
    + _TORCHVISION,
    "vision-encoder-decoder": "a vision encoder joined to a text decoder by cross-attention "
    "(TrOCR, Donut, Nougat)",
    # Language models that read images through cross-attention layers, not prompt tokens.
    "mllama": "cross-attention layers read the image features; the KV pool holds only the "
    "prompt's self-attention KV",
    "idefics": "gated cross-attention layers read the image features (Flamingo design)",
    "evolla": "a protein-text model: protein features enter through cross-attention layers",
    "blip": "a BERT-style text decoder that reads the image through cross-attention",
    # BLIP-style Q-Former families and models whose prompt has no image placeholder.
    "blip-2": "its processor puts a single image's query tokens before BOS, with no placeholder "
    "in the prompt: several images per prompt have no layout (and Flan-T5 checkpoints are "
    "encoder-decoders)",
    "instructblip": "the Q-Former reads the prompt's instruction (qformer_input_ids), so an "
    "image's embedding depends on its prompt's text, not on the image alone",
    "instructblipvideo": "the Q-Former reads the prompt's instruction (qformer_input_ids), so an "
    "image's embedding depends on its prompt's text; " + _TORCHVISION,
    "fuyu": "its processor puts a single image's patch rows (and BOS) before the prompt, with "
    "no placeholder in the prompt, and rewrites box coordinates in the text",
    "git": "the model concatenates one image's features in front of the prompt itself (no "
    "placeholder tokens), image tokens attending to each other both ways",
    "kosmos-2": "its processor puts a single image's 64 query tokens (distinct ids) at the start "
    "of the prompt, with no placeholder in the text, for image_embeds_position_mask",
    "kosmos-2.5": "its processor puts a single image's 2048 tokens at the start of the prompt, "
    "with no placeholder in the text, for image_embeds_position_mask",
    "pp_chart2table": "its processor expands no placeholder (no replace_image_token: prompts "
    "carry each image's <imgpad> run already); the GOT-OCR 2.0 model is served as got_ocr2",
    # Image generators, diffusion and action heads.
    "chameleon": "images are VQ-VAE codes read as text tokens (an image generator too); its "
    "config has a vq_config and no vision_config, by which the engine tells a VLM",
    "emu3": "images are VQGAN codes read as text tokens (an image and video generator too); its "
    "config has a vq_config and no vision_config, by which the engine tells a VLM",
    "diffusion_gemma": "a block-diffusion model (an encoder and a denoising decoder over a "
    "canvas of tokens), not autoregressive decoding",
    "pi0": "a robot policy (PaliGemma with a flow-matching action expert) that outputs actions, "
    "not text; " + _TORCHVISION,
    # Audio and omni models: audio towers are not wired into the engine.
    "gemma4_unified": "audio towers are not wired into the engine; " + _TORCHVISION,
    "muse_spark": "audio towers are not wired into the engine; its image processor (MuseGlimmer's) "
    "exists only for torchvision",
    "dots3_note": "audio towers are not wired into the engine, and its DeepSeek-V3.2 LM's sparse "
    "attention indexer keeps a key cache of its own",
    # Language models whose layers keep state or caches the engine does not pool.
    "mistral_large4": "its LM's DeepSeek sparse attention (DSA indexer) keeps a key cache of its "
    "own and MLA keys and values of different head sizes",
    "glm5_next": "its LM mixes hyper-connections, convolution state and a DSA sparse-attention "
    "indexer with a key cache of its own",
    "qwen4_exp": "its LM's sparse-attention (QSA) indexer keeps a key cache of its own "
    "(update_indexer), beside n-gram and per-layer embeddings on Qwen3.5's linear attention",
    "mistral4": "a causal LM (MoE with MLA attention) listed for image-text-to-text; no vision "
    "tower to serve",
    # Image processors that exist only for torchvision (the engine composes processors without
    # it), or vision towers from timm.
    "cohere2_vision": _TORCHVISION,
    "step3p7": _TORCHVISION + "; its LM mixes per-layer head counts and sliding windows",
    "lfm2_vl": _TORCHVISION + " (LFM3-VL, with Qwen's image processor, is served)",
    "minicpm_ocr": _TORCHVISION,
    "nemotron_h_omni": _TORCHVISION + "; its LM's Mamba-2 layers and audio tower are not wired "
    "into the engine",
    "llama4": _TORCHVISION + "; its LM's chunked local attention is not supported",
    "kimi_k25": _TORCHVISION,
    "molmo2": _TORCHVISION,
    "muse_glimmer": _TORCHVISION,
    "minimax_m3_vl": _TORCHVISION,
    "unlimited_ocr": _TORCHVISION,
    "inkling2": _TORCHVISION,
    "inkling_mm_model": _TORCHVISION,
    "perception_lm": _TORCHVISION + ", and its vision tower is a timm model",
    "fast_vlm": "its vision tower is a timm model (FastViT-HD) and timm is not installed",
}


class UnsupportedModelError(ValueError):
    """A model this engine cannot serve; the message is one line meant for the user."""


def supported_families() -> list[str]:
    return sorted(FAMILY_ADAPTERS)


def get_adapter(model: nn.Module | None, config: Any) -> ModelAdapter:
    _check_quantized_format(config)
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


def load_vlm(model_path: str, config: Any, load_config: Any = None, **kwargs: Any) -> nn.Module:
    """The image-text-to-text model at ``model_path`` (``from_pretrained`` keyword arguments
    passed on): AutoModelForImageTextToText's class, or the inner model of the class the
    family's checkpoints are stored for (``checkpoint_class``). ``load_config``: a config to
    build the model from instead of the folder's (same family)."""
    import transformers

    if load_config is not None:
        kwargs["config"] = load_config

    wrapper = getattr(FAMILY_ADAPTERS.get(config.model_type), "checkpoint_class", None)
    if wrapper is None:
        return transformers.AutoModelForImageTextToText.from_pretrained(model_path, **kwargs)
    model = getattr(transformers, wrapper).from_pretrained(model_path, **kwargs).model
    # A classifier loads no generation config; the checkpoint's is the inner model's.
    if (Path(model_path) / "generation_config.json").is_file():
        model.generation_config = transformers.GenerationConfig.from_pretrained(model_path)
    return model


def _check_quantized_format(config: Any) -> None:
    """A checkpoint stored quantized (config.json ``quantization_config``) in a format or with
    options the engine cannot load (``layers/quantization/checkpoint_formats.py``) is refused
    before its weights load."""
    from sglang.srt.layers.quantization.checkpoint_formats import (
        UnsupportedQuantizedCheckpoint,
        read_format,
    )

    try:
        read_format(config)
    except UnsupportedQuantizedCheckpoint as exc:
        raise UnsupportedModelError(str(exc)) from None


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
