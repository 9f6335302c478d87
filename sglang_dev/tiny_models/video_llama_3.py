"""VideoLLaMA3 (images): a NaViT-style SigLIP tower at native resolution, a Qwen2 LM."""

from __future__ import annotations

from typing import Any

from sglang_dev.tiny_models.common import (
    QWEN_ROLES,
    QWEN_SPECIALS,
    SMALL_VIT,
    Family,
    Recipe,
    TokSpec,
    chatml_template,
    qwen_generation,
    qwen_text,
)


# VideoLLaMA3 (lkhl/VideoLLaMA3-2B-Image-HF): a NaViT-style SigLIP tower at native resolution
# (Qwen's smart_resize, no merge for images), a Qwen2 LM with plain positions ---------------------
def _recipe_video_llama_3(tok: Any, vocab: int) -> Recipe:
    from transformers import VideoLlama3Config

    vision = dict(SMALL_VIT, patch_size=14)
    config = VideoLlama3Config(
        text_config=dict(qwen_text(tok, vocab), model_type="qwen2"),
        vision_config=vision,
        image_token_id=tok.convert_tokens_to_ids("<|image_pad|>"),
        video_token_id=tok.convert_tokens_to_ids("<|video_pad|>"),
    )
    pre = {
        "do_convert_rgb": True,
        "do_normalize": True,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": [0.5] * 3,
        "image_processor_type": "VideoLlama3ImageProcessor",
        "image_std": [0.5] * 3,
        "merge_size": 1,
        "patch_size": 14,
        "processor_class": "VideoLlama3Processor",
        "resample": 3,
        "rescale_factor": 1 / 255,
        "size": {"shortest_edge": 28 * 28, "longest_edge": 56 * 56},
        "temporal_patch_size": 1,
    }
    return Recipe(config, "AutoModelForImageTextToText", qwen_generation(tok), pre)


FAMILY_SPECS = (
    Family(
        "video_llama_3",
        TokSpec((), QWEN_SPECIALS, QWEN_ROLES, chatml_template("<|image_pad|>\\n", None)),
        _recipe_video_llama_3,
        "<|image_pad|>",
        "<|image_pad|>",
    ),
)
