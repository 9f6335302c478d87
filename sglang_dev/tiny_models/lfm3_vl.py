"""LFM3-VL: gated short convolutions and attention, in the LM and in the vision tower."""

from __future__ import annotations

from typing import Any

from sglang_dev.tiny_models.common import (
    QWEN_IMAGE,
    TEXT,
    Family,
    Recipe,
    TokSpec,
    qwen_preprocessor,
)

# LFM3-VL (LiquidAI/LFM3-VL-2B): an LFM3 LM of gated short convolutions (conv state only) with
# sliding-window and full attention layers, a vision tower that mixes short convolutions and
# attention over Qwen's patch grid (no M-RoPE); ChatML with <|startoftext|> ----------------------
_LFM_SPECIALS = (
    "<|startoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>", "<|vision_start|>",
    "<|vision_end|>", "<|image_pad|>", "<|video_pad|>",
)  # fmt: skip
_LFM_ROLES = {"bos_token": "<|startoftext|>", "eos_token": "<|im_end|>", "pad_token": "<|pad|>"}
_LFM_TEMPLATE = (
    "{{- bos_token -}}"
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if message['content'] is string -%}{{- message['content'] -}}"
    "{%- else -%}{%- for part in message['content'] -%}"
    "{%- if part['type'] in ('image', 'image_url') -%}{{- '" + QWEN_IMAGE + "' -}}"
    "{%- elif part['type'] == 'text' -%}{{- part['text'] -}}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


def _recipe_lfm3_vl(tok: Any, vocab: int) -> Recipe:
    from transformers import Lfm3VlConfig

    t = tok.convert_tokens_to_ids
    text = dict(
        TEXT,
        model_type="lfm3",
        num_hidden_layers=4,
        layer_types=["conv", "sliding_attention", "full_attention", "conv"],
        head_dim=32,
        sliding_window=16,
        conv_L_cache=3,
        vocab_size=vocab,
        bos_token_id=t("<|startoftext|>"),
        eos_token_id=t("<|im_end|>"),
        pad_token_id=t("<|pad|>"),
    )
    vision = {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 4,  # conv, conv, attention, conv
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "patch_size": 16,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "conv_kernel_size": 3,
    }
    config = Lfm3VlConfig(
        text_config=text,
        vision_config=vision,
        image_token_id=t("<|image_pad|>"),
        video_token_id=t("<|video_pad|>"),
        vision_start_token_id=t("<|vision_start|>"),
        vision_end_token_id=t("<|vision_end|>"),
        projector_hidden_size=128,
    )
    pre = qwen_preprocessor(16, "Lfm3VlProcessor", "Qwen2VLImageProcessor", legacy=False)
    gen = {"bos_token_id": t("<|startoftext|>"), "eos_token_id": t("<|im_end|>")}
    return Recipe(config, "AutoModelForImageTextToText", gen, pre)


FAMILY_SPECS = (
    Family(
        "lfm3_vl",
        TokSpec((), _LFM_SPECIALS, _LFM_ROLES, _LFM_TEMPLATE),
        _recipe_lfm3_vl,
        QWEN_IMAGE,
        "<|image_pad|>",
        hybrid=True,
    ),
)
