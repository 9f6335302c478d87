"""Qwen2-VL (Qwen/Qwen2-VL-*-Instruct): a ViT over 14-px patches merged 2 x 2, M-RoPE, ChatML."""

from __future__ import annotations

from typing import Any

from sglang_dev.tiny_models.common import (
    QWEN_IMAGE,
    QWEN_ROLES,
    QWEN_SPECIALS,
    QWEN_SYSTEM,
    QWEN_VISION,
    Family,
    Recipe,
    TokSpec,
    qwen_generation,
    qwen_ids,
    qwen_preprocessor,
    qwen_template,
    qwen_text,
    qwen_video_preprocessor,
)


def _recipe_qwen2_vl(tok: Any, vocab: int) -> Recipe:
    from transformers import Qwen2VLConfig

    rope = {"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [4, 6, 6]}
    config = Qwen2VLConfig(
        text_config=qwen_text(tok, vocab, rope_parameters=rope),
        vision_config=dict(QWEN_VISION, embed_dim=64, hidden_size=128, mlp_ratio=2, patch_size=14),
        **qwen_ids(tok),
    )
    pre = qwen_preprocessor(14, "Qwen2VLProcessor", "Qwen2VLImageProcessor", legacy=True)
    video = qwen_video_preprocessor(14, "Qwen2VLVideoProcessor")
    return Recipe(config, "AutoModelForImageTextToText", qwen_generation(tok), pre, None, video)


# "small": the vision tower's overrides (the text's are the builder's SMALL_TEXT)
_SMALL_VISION = {"depth": 4, "embed_dim": 384, "num_heads": 6, "mlp_ratio": 4, "hidden_size": 256}


FAMILY_SPECS = (
    Family(
        "qwen2_vl",
        TokSpec((), QWEN_SPECIALS, QWEN_ROLES, qwen_template(QWEN_SYSTEM)),
        _recipe_qwen2_vl,
        QWEN_IMAGE,
        "<|image_pad|>",
        video=True,
        small_vision=_SMALL_VISION,
        base=True,
    ),
)
