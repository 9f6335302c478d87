"""Qwen2-VL (Qwen/Qwen2-VL-*-Instruct): a ViT over 14-px patches merged 2 x 2, M-RoPE, ChatML;
Qwen2.5-VL (Qwen/Qwen2.5-VL-*-Instruct): the same with windowed vision blocks, the tests'
default model."""

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


def _recipe_qwen2_5_vl(tok: Any, vocab: int) -> Recipe:
    from transformers import Qwen2_5_VLConfig

    rope = {"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [4, 6, 6]}
    config = Qwen2_5_VLConfig(
        text_config=qwen_text(tok, vocab, rope_parameters=rope),
        vision_config=dict(
            QWEN_VISION,
            hidden_size=64,
            intermediate_size=128,
            out_hidden_size=128,
            patch_size=14,
            window_size=56,  # 2x2 merged patches per window: several windows per image
            fullatt_block_indexes=[1],  # block 0 windowed, block 1 full attention
            tokens_per_second=2,
        ),
        **qwen_ids(tok),
    )
    pre = qwen_preprocessor(14, "Qwen2_5_VLProcessor", "Qwen2VLImageProcessor", legacy=True)
    video = qwen_video_preprocessor(14, "Qwen2VLVideoProcessor")
    return Recipe(config, "AutoModelForImageTextToText", qwen_generation(tok), pre, None, video)


# "small": the vision tower's overrides (the text's are the builder's SMALL_TEXT)
_SMALL_VISION_QWEN2_VL = {
    "depth": 4,
    "embed_dim": 384,
    "num_heads": 6,
    "mlp_ratio": 4,
    "hidden_size": 256,
}
_SMALL_VISION_QWEN2_5_VL = {
    "depth": 4,
    "hidden_size": 384,
    "num_heads": 6,
    "intermediate_size": 1024,
    "out_hidden_size": 256,
    "window_size": 112,
    "fullatt_block_indexes": [1, 3],
}

_TOKENS = TokSpec((), QWEN_SPECIALS, QWEN_ROLES, qwen_template(QWEN_SYSTEM))

FAMILY_SPECS = (
    Family(
        "qwen2_vl",
        _TOKENS,
        _recipe_qwen2_vl,
        QWEN_IMAGE,
        "<|image_pad|>",
        video=True,
        small_vision=_SMALL_VISION_QWEN2_VL,
        base=True,
    ),
    Family(
        "qwen2_5_vl",
        _TOKENS,
        _recipe_qwen2_5_vl,
        QWEN_IMAGE,
        "<|image_pad|>",
        video=True,
        small_vision=_SMALL_VISION_QWEN2_5_VL,
        base=True,
    ),
)
