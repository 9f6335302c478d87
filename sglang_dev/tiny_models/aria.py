"""Aria: an Idefics3 tower, a cross-attention projector, an MoE LM."""

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

# Aria (rhymes-ai/Aria): an Idefics3 tower over a 490-px (or 980-px) padded view, a cross-attention
# projector to a fixed query count per view size, an MoE LM with shared experts; <fim_prefix> +
# <|img|> run + <fim_suffix> in ChatML. Tiny: 70-px patches (7 x 7 per 490-px view) to 8 queries;
# two routed experts, both taken (with 4 experts the tiny router's near-ties flip under bfloat16
# rounding: 5-token chunks of the int8 model land 2.6x past test_quantization's bound, 0 unchunked)
_ARIA_IMAGE = "<fim_prefix><|img|><fim_suffix>"


def _recipe_aria(tok: Any, vocab: int) -> Recipe:
    from transformers import AriaConfig

    text = qwen_text(
        tok,
        vocab,
        model_type="aria_text",
        head_dim=32,
        intermediate_size=64,
        moe_num_experts=2,
        moe_topk=2,
        moe_num_shared_experts=1,
        pad_token_id=tok.convert_tokens_to_ids("<|endoftext|>"),
    )
    vision = dict(SMALL_VIT, model_type="idefics3_vision", image_size=490, patch_size=70)
    config = AriaConfig(
        text_config=text,
        vision_config=vision,
        image_token_index=tok.convert_tokens_to_ids("<|img|>"),
        projector_patch_to_query_dict={49: 8, 196: 16},
        initializer_range=0.1,  # the projector's; at 0.02 its queries attend near uniformly
    )
    pre = {
        "do_convert_rgb": True,
        "do_normalize": True,
        "do_rescale": True,
        "image_mean": [0.5] * 3,
        "image_processor_type": "AriaImageProcessor",
        "image_std": [0.5] * 3,
        "max_image_size": 490,
        "min_image_size": 70,
        "processor_class": "AriaProcessor",
        "resample": 3,
        "rescale_factor": 1 / 255,
        "split_image": False,
    }
    proc = {"processor_class": "AriaProcessor", "size_conversion": {"490": 8, "980": 16}}
    return Recipe(config, "AutoModelForImageTextToText", qwen_generation(tok), pre, proc)


FAMILY_SPECS = (
    Family(
        "aria",
        TokSpec(
            (),
            (*QWEN_SPECIALS, "<fim_prefix>", "<fim_suffix>", "<|img|>"),
            {**QWEN_ROLES, "image_token": "<|img|>"},
            chatml_template(_ARIA_IMAGE, None),
        ),
        _recipe_aria,
        _ARIA_IMAGE,
        "<|img|>",
    ),
)
