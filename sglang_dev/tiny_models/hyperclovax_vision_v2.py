"""HyperCLOVA X SEED vision: a Qwen2.5-VL tower and a HyperCLOVA X LM."""

from __future__ import annotations

from typing import Any

from sglang_dev.tiny_models.common import (
    QWEN_ROLES,
    QWEN_SPECIALS,
    QWEN_VISION,
    Family,
    Recipe,
    TokSpec,
    qwen_generation,
    qwen_preprocessor,
    qwen_template,
    qwen_text,
)


# HyperCLOVA X SEED vision (naver-hyperclovax/HyperCLOVAX-SEED-Think-32B layout, transformers
# hyperclovax_vision_v2): a Qwen2.5-VL tower and Qwen's grid, plain positions, a HyperCLOVA X LM
# (MuP multipliers; its logits are multiplied by logits_scaling) ----------------------------------
def _recipe_hyperclovax_vision_v2(tok: Any, vocab: int) -> Recipe:
    from transformers import HyperCLOVAXVisionV2Config

    text = qwen_text(
        tok,
        vocab,
        model_type="hyperclovax",
        head_dim=32,
        embedding_multiplier=2.0,
        residual_multiplier=0.5,
        logits_scaling=0.5,
    )
    vision = dict(
        QWEN_VISION,
        hidden_size=64,
        intermediate_size=128,
        out_hidden_size=64,
        patch_size=14,
        window_size=56,
        fullatt_block_indexes=[1],
    )
    config = HyperCLOVAXVisionV2Config(
        text_config=text,
        vision_config=vision,
        image_token_id=tok.convert_tokens_to_ids("<|image_pad|>"),
        video_token_id=tok.convert_tokens_to_ids("<|video_pad|>"),
    )
    pre = qwen_preprocessor(
        14, "HyperCLOVAXVisionV2Processor", "Qwen2VLImageProcessor", legacy=False
    )
    return Recipe(config, "AutoModelForImageTextToText", qwen_generation(tok), pre)


FAMILY_SPECS = (
    Family(
        "hyperclovax_vision_v2",
        TokSpec((), QWEN_SPECIALS, QWEN_ROLES, qwen_template(None)),
        _recipe_hyperclovax_vision_v2,
        "<|vision_start|><|image_pad|><|vision_end|>",
        "<|image_pad|>",
    ),
)
