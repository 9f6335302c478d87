"""Cosmos3 Reasoner (cosmos3_omni, the Qwen3-VL design) and Cosmos3 Edge."""

from __future__ import annotations

from typing import Any

from sglang_dev.tiny_models.common import (
    QWEN_ROLES,
    QWEN_SPECIALS,
    SMALL_VIT,
    Family,
    Recipe,
    TokSpec,
    qwen_generation,
    qwen_ids,
    qwen_template,
    qwen_text,
)
from sglang_dev.tiny_models.qwen3_vl import recipe_qwen3_vl


# Cosmos3 Reasoner (nvidia/Cosmos3-Nano, transformers cosmos3_omni): Qwen3-VL (deepstack, M-RoPE)
# under its own config; the generator, sound and action towers of the unified checkpoint are not
# loaded -----------------------------------------------------------------------------------------
def _recipe_cosmos3_omni(tok: Any, vocab: int) -> Recipe:
    from transformers import Cosmos3OmniConfig

    qwen3_vl = recipe_qwen3_vl(tok, vocab)
    data = qwen3_vl.config.to_dict()
    ids = {k: v for k, v in data.items() if k.endswith("token_id")}
    config = Cosmos3OmniConfig(
        text_config=data["text_config"], vision_config=data["vision_config"], **ids
    )
    return Recipe(config, "AutoModelForImageTextToText", qwen3_vl.generation, qwen3_vl.preprocessor)


# Cosmos3 Edge (nvidia/Cosmos3-Edge): a SigLIP2 tower over GLM-style resized images (16-px patches,
# 2 x 2 merged), a Llama-style LM (relu2 MLP) with M-RoPE; Qwen3-VL's processor -------------------
def _recipe_cosmos3_edge(tok: Any, vocab: int) -> Recipe:
    from transformers import Cosmos3EdgeConfig

    rope = {"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [6, 5, 5]}
    text = dict(qwen_text(tok, vocab), head_dim=32, hidden_act="relu2", rope_parameters=rope)
    vision = dict(SMALL_VIT, patch_size=16, num_patches=16, spatial_merge_size=2)
    config = Cosmos3EdgeConfig(
        text_config=text, vision_config=vision, projector_hidden_size=128, **qwen_ids(tok)
    )
    pre = {
        "do_convert_rgb": True,
        "do_normalize": True,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": [0.5] * 3,
        "image_processor_type": "Cosmos3EdgeImageProcessor",
        "image_std": [0.5] * 3,
        "merge_size": 2,
        "patch_size": 16,
        "processor_class": "Cosmos3EdgeProcessor",
        "resample": 3,
        "rescale_factor": 1 / 255,
        "size": {"shortest_edge": 64 * 64, "longest_edge": 128 * 128},
        "temporal_patch_size": 1,
    }
    return Recipe(config, "AutoModelForImageTextToText", qwen_generation(tok), pre)


FAMILY_SPECS = (
    Family(
        "cosmos3_omni",
        TokSpec((), QWEN_SPECIALS, QWEN_ROLES, qwen_template(None)),
        _recipe_cosmos3_omni,
        "<|vision_start|><|image_pad|><|vision_end|>",
        "<|image_pad|>",
    ),
    Family(
        "cosmos3_edge",
        TokSpec((), QWEN_SPECIALS, QWEN_ROLES, qwen_template(None)),
        _recipe_cosmos3_edge,
        "<|vision_start|><|image_pad|><|vision_end|>",
        "<|image_pad|>",
    ),
)
