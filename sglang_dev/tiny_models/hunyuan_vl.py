"""HunYuan-VL (HunyuanOCR): a NaViT-style tower and XD-RoPE."""

from __future__ import annotations

from typing import Any

from sglang_dev.tiny_models.common import (
    CLIP_MEAN,
    CLIP_STD,
    SMALL_VIT,
    TEXT,
    Family,
    Recipe,
    TokSpec,
    content_template,
)

# HunYuan-VL (tencent/HunyuanOCR): a NaViT-style tower, 2 x 2 patches merged by convolution with a
# learned newline per row, the run wrapped by two more image tokens; XD-RoPE (4 rotary axes: text,
# width, height, image index); prompts write image start + image + image end tokens ---------------
_HY_BOS, _HY_EOS = (
    "<\uff5chy_begin\u2581of\u2581sentence\uff5c>",
    "<\uff5chy_place\u2581holder\u2581no\u25812\uff5c>",
)
_HY_USER, _HY_ASSISTANT = "<\uff5chy_User\uff5c>", "<\uff5chy_Assistant\uff5c>"
_HY_IMAGE_TOKENS = tuple(
    f"<\uff5chy_place\u2581holder\u2581no\u2581{i}\uff5c>" for i in (100, 101, 102, 103)
)
_HY_IMAGE = "".join(_HY_IMAGE_TOKENS[:3])  # start, image, end
_HY_ROLES = {
    "bos_token": _HY_BOS,
    "eos_token": _HY_EOS,
    "pad_token": "<\uff5chy_pad\uff5c>",
    "image_start_token": _HY_IMAGE_TOKENS[0],
    "image_token": _HY_IMAGE_TOKENS[1],
    "image_end_token": _HY_IMAGE_TOKENS[2],
}
_HY_TEMPLATE = (
    "{{- bos_token -}}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'user' -%}{{- '" + _HY_USER + "' -}}"
    "{%- elif message['role'] == 'assistant' -%}{{- '"
    + _HY_ASSISTANT
    + "' -}}{%- endif -%}"
    + content_template(_HY_IMAGE)
    + "{%- if message['role'] == 'assistant' -%}{{- eos_token -}}{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '" + _HY_ASSISTANT + "' -}}{%- endif -%}"
)


def _recipe_hunyuan_vl(tok: Any, vocab: int) -> Recipe:
    from transformers import HunYuanVLConfig

    t = tok.convert_tokens_to_ids
    rope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [4, 4, 4, 4]}
    text = dict(
        TEXT,
        head_dim=32,
        vocab_size=vocab,
        rope_parameters=rope,
        bos_token_id=t(_HY_BOS),
        eos_token_id=t(_HY_EOS),
        pad_token_id=t(_HY_ROLES["pad_token"]),
        tie_word_embeddings=True,
    )
    vision = dict(
        SMALL_VIT,
        out_hidden_size=text["hidden_size"],
        patch_size=16,
        spatial_merge_size=2,
        max_image_size=128,
        min_image_size=64,
        initializer_range=0.05,  # images move the tiny LM's logprobs well past bfloat16 noise
    )
    config = HunYuanVLConfig(
        text_config=text,
        vision_config=vision,
        image_token_id=t(_HY_IMAGE_TOKENS[1]),
        im_start_id=t(_HY_IMAGE_TOKENS[0]),
        im_end_id=t(_HY_IMAGE_TOKENS[2]),
        im_newline_id=t(_HY_IMAGE_TOKENS[3]),
    )
    pre = {
        "do_convert_rgb": True,
        "do_normalize": True,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": CLIP_MEAN,
        "image_processor_type": "HunYuanVLImageProcessor",
        "image_std": CLIP_STD,
        "merge_size": 2,
        "patch_size": 16,
        "processor_class": "HunYuanVLProcessor",
        "resample": 3,
        "rescale_factor": 1 / 255,
        "size": {"shortest_edge": 64 * 64, "longest_edge": 128 * 128},
        "temporal_patch_size": 1,
    }
    gen = {"bos_token_id": t(_HY_BOS), "eos_token_id": t(_HY_EOS)}
    return Recipe(config, "AutoModelForImageTextToText", gen, pre)


FAMILY_SPECS = (
    Family(
        "hunyuan_vl",
        TokSpec(
            (),
            (_HY_BOS, _HY_EOS, _HY_USER, _HY_ASSISTANT, _HY_ROLES["pad_token"], *_HY_IMAGE_TOKENS),
            _HY_ROLES,
            _HY_TEMPLATE,
        ),
        _recipe_hunyuan_vl,
        _HY_IMAGE,
        _HY_IMAGE_TOKENS[1],
    ),
)
