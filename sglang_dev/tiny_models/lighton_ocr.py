"""LightOnOCR: a Pixtral tower with 2 x 2 merged patches and a Qwen3 LM."""

from __future__ import annotations

from typing import Any

from sglang_dev.tiny_models.common import (
    CLIP_MEAN,
    CLIP_STD,
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

# LightOnOCR (lightonai/LightOnOCR-1B-1025): Pixtral tower, patches merged 2 x 2, Qwen3 LM; one
# run of <|image_pad|> per image (no row breaks), Qwen's chat template --------------------------
_LIGHTON_ROLES = {
    **QWEN_ROLES,
    "image_token": "<|image_pad|>",
    "image_break_token": "<|vision_pad|>",
    "image_end_token": "<|vision_end|>",
}


def _recipe_lighton_ocr(tok: Any, vocab: int) -> Recipe:
    from transformers import LightOnOcrConfig

    vision = dict(SMALL_VIT, model_type="pixtral", image_size=112, patch_size=14, head_dim=16)
    config = LightOnOcrConfig(
        text_config=qwen_text(tok, vocab, model_type="qwen3", head_dim=32, sliding_window=None),
        vision_config=vision,
        image_token_id=tok.convert_tokens_to_ids("<|image_pad|>"),
        spatial_merge_size=2,
    )
    pre = {
        "do_convert_rgb": True,
        "do_normalize": True,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": CLIP_MEAN,
        "image_processor_type": "PixtralImageProcessor",
        "image_std": CLIP_STD,
        "patch_size": 28,  # the merged patch: resized sizes are whole merged patches
        "processor_class": "LightOnOcrProcessor",
        "resample": 3,
        "rescale_factor": 1 / 255,
        "size": {"longest_edge": 112},
    }
    proc = {"patch_size": 14, "processor_class": "LightOnOcrProcessor", "spatial_merge_size": 2}
    return Recipe(config, "AutoModelForImageTextToText", qwen_generation(tok), pre, proc)


FAMILY_SPECS = (
    Family(
        "lighton_ocr",
        TokSpec((), QWEN_SPECIALS, _LIGHTON_ROLES, chatml_template("<|image_pad|>", None)),
        _recipe_lighton_ocr,
        "<|image_pad|>",
        "<|image_pad|>",
    ),
)
