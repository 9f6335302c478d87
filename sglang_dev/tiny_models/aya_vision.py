"""Aya Vision and Cohere Compass: Cohere LMs, Cohere's turn tokens and template."""

from __future__ import annotations

from typing import Any

from sglang_dev.tiny_models.common import (
    QWEN3_ROPE,
    QWEN3_VISION,
    SMALL_VIT,
    TEXT,
    Family,
    Recipe,
    TokSpec,
    content_template,
    qwen_preprocessor,
)

# Aya Vision (CohereLabs/aya-vision-*): GotOCR2 tiles, each "TILE_k" + patch tokens, a global tile
# last, inside <|START_OF_IMG|>...<|END_OF_IMG|>; a Cohere2 LM (3:1 sliding, logit_scale) ---------
_COHERE_HEAD = ("<PAD>", "<UNK>", "<CLS>", "<SEP>", "<MASK_TOKEN>", "<BOS_TOKEN>", "<EOS_TOKEN>")
_AYA_TAIL = (
    "<|START_OF_TURN_TOKEN|>", "<|END_OF_TURN_TOKEN|>", "<|USER_TOKEN|>", "<|CHATBOT_TOKEN|>",
    "<|SYSTEM_TOKEN|>", "<|START_OF_IMG|>", "<|END_OF_IMG|>", "<|IMG_PATCH|>",
    "<|IMG_LINE_BREAK|>", "TILE_GLOBAL", "<image>",
)  # fmt: skip
_AYA_ROLES = {
    "bos_token": "<BOS_TOKEN>",
    "eos_token": "<|END_OF_TURN_TOKEN|>",
    "pad_token": "<PAD>",
    "unk_token": "<UNK>",
}
_AYA_TEMPLATE = (
    "{{- bos_token -}}"
    "{%- for message in messages -%}"
    "{%- set role = 'CHATBOT' if message['role'] == 'assistant' else message['role'] | upper -%}"
    "{{- '<|START_OF_TURN_TOKEN|><|' + role + '_TOKEN|>' -}}"
    + content_template("<image>")
    + "{{- '<|END_OF_TURN_TOKEN|>' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{- '<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>' -}}{%- endif -%}"
)


def _recipe_aya_vision(tok: Any, vocab: int) -> Recipe:
    from transformers import AyaVisionConfig

    t = tok.convert_tokens_to_ids
    layer_types = ["sliding_attention"] * 3 + ["full_attention"]
    text = dict(
        TEXT,
        model_type="cohere2",
        num_hidden_layers=4,
        layer_types=layer_types,
        sliding_window=16,
        vocab_size=vocab,
        logit_scale=0.25,
        bos_token_id=t("<BOS_TOKEN>"),
        eos_token_id=t("<|END_OF_TURN_TOKEN|>"),
        pad_token_id=t("<PAD>"),
    )
    config = AyaVisionConfig(
        text_config=text,
        vision_config=dict(
            SMALL_VIT, model_type="siglip_vision_model", image_size=56, patch_size=14
        ),
        image_token_index=t("<|IMG_PATCH|>"),
        downsample_factor=2,
        vision_feature_layer=-1,
        vision_feature_select_strategy="full",
    )
    pre = {
        "crop_to_patches": False,
        "do_convert_rgb": True,
        "do_normalize": True,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": [0.5] * 3,
        "image_processor_type": "GotOcr2ImageProcessor",
        "image_std": [0.5] * 3,
        "max_patches": 6,
        "min_patches": 1,
        "processor_class": "AyaVisionProcessor",
        "resample": 3,
        "rescale_factor": 1 / 255,
        "size": {"height": 56, "width": 56},
    }
    proc = {
        "downsample_factor": 2,
        "img_size": 56,
        "patch_size": 14,
        "processor_class": "AyaVisionProcessor",
    }
    gen = {"bos_token_id": t("<BOS_TOKEN>"), "eos_token_id": t("<|END_OF_TURN_TOKEN|>")}
    return Recipe(config, "AutoModelForImageTextToText", gen, pre, proc)


# Cohere Compass (CohereLabs/North-Micro-Vision-Instruct): the Qwen3-VL design (deepstack,
# interleaved M-RoPE) with a Cohere2 LM (3 sliding-window layers with rotary positions to 1 global
# layer without, logit_scale); Cohere's turn template ----------------------------------------------
_COMPASS_IMAGE = "<|VISION_START|><|IMAGE_PAD|><|VISION_END|>"
_COMPASS_TAIL = (
    *_AYA_TAIL[:5],
    "<|VISION_START|>",
    "<|VISION_END|>",
    "<|IMAGE_PAD|>",
    "<|VIDEO_PAD|>",
)
_COMPASS_TEMPLATE = _AYA_TEMPLATE.replace("<image>", _COMPASS_IMAGE)


def _recipe_cohere_compass(tok: Any, vocab: int) -> Recipe:
    from transformers import CohereCompassConfig

    t = tok.convert_tokens_to_ids
    rope = dict(QWEN3_ROPE)
    layer_types = ["sliding_attention"] * 3 + ["full_attention"]
    text = dict(
        TEXT,
        num_hidden_layers=4,
        head_dim=32,
        layer_types=layer_types,
        sliding_window=16,
        rope_parameters={"sliding_attention": rope, "full_attention": None},
        logit_scale=0.25,
        vocab_size=vocab,
        bos_token_id=t("<BOS_TOKEN>"),
        eos_token_id=t("<|END_OF_TURN_TOKEN|>"),
        pad_token_id=t("<PAD>"),
    )
    config = CohereCompassConfig(
        text_config=text,
        vision_config=QWEN3_VISION,
        image_token_id=t("<|IMAGE_PAD|>"),
        video_token_id=t("<|VIDEO_PAD|>"),
        vision_start_token_id=t("<|VISION_START|>"),
        vision_end_token_id=t("<|VISION_END|>"),
    )
    pre = qwen_preprocessor(
        16, "CohereCompassProcessor", "CohereCompassImageProcessor", legacy=False
    )
    gen = {"bos_token_id": t("<BOS_TOKEN>"), "eos_token_id": t("<|END_OF_TURN_TOKEN|>")}
    return Recipe(config, "AutoModelForImageTextToText", gen, pre)


FAMILY_SPECS = (
    Family(
        "aya_vision",
        TokSpec(_COHERE_HEAD, _AYA_TAIL, _AYA_ROLES, _AYA_TEMPLATE, add_bos=True),
        _recipe_aya_vision,
        "<image>",
        "<|IMG_PATCH|>",
    ),
    Family(
        "cohere_compass",
        TokSpec(_COHERE_HEAD, _COMPASS_TAIL, _AYA_ROLES, _COMPASS_TEMPLATE, add_bos=True),
        _recipe_cohere_compass,
        _COMPASS_IMAGE,
        "<|IMAGE_PAD|>",
    ),
)
