"""Qwen3-VL and Qwen3-VL-MoE: 16-px patches, deepstack features, interleaved M-RoPE."""

from __future__ import annotations

from typing import Any

from sglang_dev.tiny_models.common import (
    QWEN3_ROPE,
    QWEN3_VISION,
    QWEN_IMAGE,
    QWEN_ROLES,
    QWEN_SPECIALS,
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


def recipe_qwen3_vl(tok: Any, vocab: int) -> Recipe:
    from transformers import Qwen3VLConfig

    rope = QWEN3_ROPE
    config = Qwen3VLConfig(
        text_config=qwen_text(tok, vocab, head_dim=32, rope_parameters=rope),
        vision_config=QWEN3_VISION,
        **qwen_ids(tok),
    )
    pre = qwen_preprocessor(16, "Qwen3VLProcessor", "Qwen2VLImageProcessorFast", legacy=False)
    video = qwen_video_preprocessor(16, "Qwen3VLVideoProcessor")
    return Recipe(config, "AutoModelForImageTextToText", qwen_generation(tok), pre, None, video)


# "small": the vision tower's overrides (the text's are the builder's SMALL_TEXT)
_SMALL_VISION = {
    "depth": 4,
    "hidden_size": 384,
    "num_heads": 6,
    "intermediate_size": 1024,
    "out_hidden_size": 256,
    "deepstack_visual_indexes": [1, 3],
}


# Qwen3-VL-MoE (Qwen3-VL-30B-A3B): the Qwen3-VL layout and deepstack with an MoE LM ------------
def _recipe_qwen3_vl_moe(tok: Any, vocab: int) -> Recipe:
    from transformers import Qwen3VLMoeConfig

    rope = QWEN3_ROPE
    text = qwen_text(
        tok,
        vocab,
        head_dim=32,
        rope_parameters=rope,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=64,
        decoder_sparse_step=1,
    )
    config = Qwen3VLMoeConfig(
        text_config=text,
        vision_config=QWEN3_VISION,
        **qwen_ids(tok),
    )
    pre = qwen_preprocessor(16, "Qwen3VLProcessor", "Qwen2VLImageProcessorFast", legacy=False)
    return Recipe(config, "AutoModelForImageTextToText", qwen_generation(tok), pre)


FAMILY_SPECS = (
    Family(
        "qwen3_vl",
        TokSpec((), QWEN_SPECIALS, QWEN_ROLES, qwen_template(None)),
        recipe_qwen3_vl,
        QWEN_IMAGE,
        "<|image_pad|>",
        video=True,
        small_vision=_SMALL_VISION,
        base=True,
    ),
    Family(
        "qwen3_vl_moe",
        TokSpec((), QWEN_SPECIALS, QWEN_ROLES, qwen_template(None)),
        _recipe_qwen3_vl_moe,
        "<|vision_start|><|image_pad|><|vision_end|>",
        "<|image_pad|>",
    ),
)
