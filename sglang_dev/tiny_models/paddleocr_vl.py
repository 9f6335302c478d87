"""PaddleOCR-VL and ERNIE-4.5-VL: ERNIE LMs with M-RoPE, ERNIE's tokens and template."""

from __future__ import annotations

from typing import Any

from sglang_dev.tiny_models.common import (
    CLIP_MEAN,
    CLIP_STD,
    SMALL_VIT,
    Family,
    Recipe,
    TokSpec,
    content_template,
)
from sglang_dev.tiny_models.llava import LLAVA_HEAD, llava_text

# PaddleOCR-VL (PaddlePaddle/PaddleOCR-VL): a NaViT-style SigLIP tower at native resolution (its own
# smart_resize), 2 x 2 merged patches, an ERNIE-4.5 LM with M-RoPE ---------------------------------
_PADDLE_IMAGE = "<|IMAGE_START|><|IMAGE_PLACEHOLDER|><|IMAGE_END|>"
_PADDLE_TAIL = (
    "<|begin_of_sentence|>", "<|end_of_sentence|>", "<|IMAGE_START|>", "<|IMAGE_PLACEHOLDER|>",
    "<|IMAGE_END|>", "<|video_pad|>", "<pad>",
)  # fmt: skip
_PADDLE_ROLES = {
    "bos_token": "<s>",
    "eos_token": "</s>",
    "pad_token": "<pad>",
    "unk_token": "<unk>",
    "image_token": "<|IMAGE_PLACEHOLDER|>",
}
_PADDLE_TEMPLATE = (
    "{{- '<|begin_of_sentence|>' -}}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'user' -%}{{- 'User: ' -}}"
    + content_template(_PADDLE_IMAGE)
    + "{{- '\\n' -}}"
    "{%- elif message['role'] == 'assistant' -%}{{- 'Assistant: ' -}}"
    + content_template("")
    + "{{- '<|end_of_sentence|>' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- 'Assistant: ' -}}{%- endif -%}"
)


def _recipe_paddleocr_vl(tok: Any, vocab: int) -> Recipe:
    from transformers import PaddleOCRVLConfig

    t = tok.convert_tokens_to_ids
    rope = {"rope_type": "default", "rope_theta": 500000.0, "mrope_section": [4, 6, 6]}
    text = dict(
        llava_text(tok, vocab, "paddleocr_vl_text", head_dim=32, rope_parameters=rope),
        eos_token_id=[t("</s>"), t("<|end_of_sentence|>")],
        tie_word_embeddings=True,
    )
    vision = dict(
        SMALL_VIT,
        image_size=56,
        patch_size=14,
        spatial_merge_size=2,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )
    config = PaddleOCRVLConfig(
        text_config=text,
        vision_config=vision,
        image_token_id=t("<|IMAGE_PLACEHOLDER|>"),
        video_token_id=t("<|video_pad|>"),
        vision_start_token_id=t("<|IMAGE_START|>"),
        vision_end_token_id=t("<|IMAGE_END|>"),
        tie_word_embeddings=True,
    )
    pre = {
        "do_convert_rgb": True,
        "do_normalize": True,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": [0.5] * 3,
        "image_processor_type": "PaddleOCRVLImageProcessor",
        "image_std": [0.5] * 3,
        "merge_size": 2,
        "patch_size": 14,
        "processor_class": "PaddleOCRVLProcessor",
        "resample": 3,
        "rescale_factor": 1 / 255,
        "size": {"shortest_edge": 56 * 56, "longest_edge": 112 * 112},
        "temporal_patch_size": 1,
    }
    gen = {"bos_token_id": text["bos_token_id"], "eos_token_id": text["eos_token_id"]}
    return Recipe(config, "AutoModelForImageTextToText", gen, pre)


# ERNIE-4.5-VL (baidu/ERNIE-4.5-VL-28B-A3B-PT): a Qwen2-VL-style tower, an ERNIE-4.5 MoE LM whose
# image tokens (and their start / end tokens) go to vision experts, text tokens to text experts;
# M-RoPE; ERNIE's tokens and template (as PaddleOCR-VL's) ------------------------------------------
_ERNIE_VL_TAIL = (*_PADDLE_TAIL, "<|VIDEO_START|>", "<|VIDEO_END|>", "<|VIDEO_PLACEHOLDER|>")
_ERNIE_VL_ROLES = {
    **_PADDLE_ROLES,
    "image_start_token": "<|IMAGE_START|>",
    "image_end_token": "<|IMAGE_END|>",
    "video_token": "<|VIDEO_PLACEHOLDER|>",
    "video_start_token": "<|VIDEO_START|>",
    "video_end_token": "<|VIDEO_END|>",
}


def _recipe_ernie4_5_vl_moe(tok: Any, vocab: int) -> Recipe:
    from transformers import Ernie4_5_VLMoeConfig

    t = tok.convert_tokens_to_ids
    rope = {"rope_type": "default", "rope_theta": 500000.0, "mrope_section": [6, 6, 4]}
    text = dict(
        llava_text(tok, vocab, "ernie4_5_vl_moe_text", rope_parameters=rope),
        eos_token_id=[t("</s>"), t("<|end_of_sentence|>")],
        moe_intermediate_size=[64, 32],  # text experts, vision experts
        moe_k=2,
        moe_num_experts=2,  # both taken: with 4, router near-ties flip under bfloat16 (Aria's)
        moe_num_shared_experts=1,
        num_hidden_layers=3,  # a sparse layer before the last: image tokens' experts matter
        mlp_layer_types=["dense", "sparse", "sparse"],
        tie_word_embeddings=True,
    )
    vision = {
        "depth": 2,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_heads": 4,
        "patch_size": 14,
        "spatial_merge_size": 2,
    }
    config = Ernie4_5_VLMoeConfig(
        text_config=text,
        vision_config=vision,
        image_start_token_id=t("<|IMAGE_START|>"),
        image_end_token_id=t("<|IMAGE_END|>"),
        image_token_id=t("<|IMAGE_PLACEHOLDER|>"),
        video_start_token_id=t("<|VIDEO_START|>"),
        video_end_token_id=t("<|VIDEO_END|>"),
        video_token_id=t("<|VIDEO_PLACEHOLDER|>"),
    )
    pre = {
        "do_convert_rgb": True,
        "do_normalize": True,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": CLIP_MEAN,
        "image_processor_type": "Ernie4_5_VLMoeImageProcessor",
        "image_std": CLIP_STD,
        "merge_size": 2,
        "patch_size": 14,
        "processor_class": "Ernie4_5_VLMoeProcessor",
        "resample": 3,
        "rescale_factor": 1 / 255,
        "size": {"shortest_edge": 56 * 56, "longest_edge": 112 * 112},
    }
    gen = {"bos_token_id": text["bos_token_id"], "eos_token_id": text["eos_token_id"]}
    return Recipe(config, "AutoModelForImageTextToText", gen, pre)


FAMILY_SPECS = (
    Family(
        "paddleocr_vl",
        TokSpec(LLAVA_HEAD, _PADDLE_TAIL, _PADDLE_ROLES, _PADDLE_TEMPLATE),
        _recipe_paddleocr_vl,
        _PADDLE_IMAGE,
        "<|IMAGE_PLACEHOLDER|>",
    ),
    Family(
        "ernie4_5_vl_moe",
        TokSpec(LLAVA_HEAD, _ERNIE_VL_TAIL, _ERNIE_VL_ROLES, _PADDLE_TEMPLATE),
        _recipe_ernie4_5_vl_moe,
        _PADDLE_IMAGE,
        "<|IMAGE_PLACEHOLDER|>",
    ),
)
