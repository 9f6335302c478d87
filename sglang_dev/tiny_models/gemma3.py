"""Gemma 3 (google/gemma-3-*-it) and ShieldGemma 2, which is Gemma 3 under its own model_type."""

from __future__ import annotations

from typing import Any

from sglang_dev.tiny_models.common import (
    TEXT,
    Family,
    Recipe,
    TokSpec,
)

_GEMMA_TEMPLATE = (
    "{{- bos_token -}}"
    "{%- if messages[0]['role'] == 'system' -%}"
    "{%- if messages[0]['content'] is string -%}"
    "{%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}"
    "{%- else -%}{%- set first_user_prefix = messages[0]['content'][0]['text'] + '\\n\\n' -%}"
    "{%- endif -%}{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}{%- set first_user_prefix = '' -%}{%- set loop_messages = messages -%}"
    "{%- endif -%}"
    "{%- for message in loop_messages -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{{- '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else '') -}}"
    "{%- if message['content'] is string -%}{{- message['content'] | trim -}}"
    "{%- else -%}{%- for part in message['content'] -%}"
    "{%- if part['type'] in ('image', 'image_url') -%}{{- '<start_of_image>' -}}"
    "{%- elif part['type'] == 'text' -%}{{- part['text'] | trim -}}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{{- '<end_of_turn>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<start_of_turn>model\\n' -}}{%- endif -%}"
)

_GEMMA_TAIL = (
    "<start_of_turn>",
    "<end_of_turn>",
    "<start_of_image>",
    "<end_of_image>",
    "<image_soft_token>",
)
_GEMMA_ROLES = {
    "pad_token": "<pad>",
    "eos_token": "<eos>",
    "bos_token": "<bos>",
    "unk_token": "<unk>",
    "mask_token": "<mask>",
    "boi_token": "<start_of_image>",
    "eoi_token": "<end_of_image>",
    "image_token": "<image_soft_token>",
}

_GEMMA_HEAD = ("<pad>", "<eos>", "<bos>", "<unk>", "<mask>")


def _recipe_gemma3(tok: Any, vocab: int) -> Recipe:
    from transformers import Gemma3Config

    t = tok.convert_tokens_to_ids
    layer_types = ["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"]
    text = dict(
        TEXT,
        num_hidden_layers=4,
        layer_types=layer_types,
        sliding_window=32,
        head_dim=32,
        query_pre_attn_scalar=32,
        initializer_range=0.02,
        vocab_size=vocab,
        pad_token_id=t("<pad>"),
        eos_token_id=t("<eos>"),
        bos_token_id=t("<bos>"),
    )
    vision = dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        image_size=64,
        patch_size=8,
        vision_use_head=False,
    )
    config = Gemma3Config(
        text_config=text,
        vision_config=vision,
        mm_tokens_per_image=16,
        boi_token_index=t("<start_of_image>"),
        eoi_token_index=t("<end_of_image>"),
        image_token_index=t("<image_soft_token>"),
        initializer_range=0.02,
    )
    pre = {
        "do_convert_rgb": None,
        "do_normalize": True,
        "do_pan_and_scan": None,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": [0.5, 0.5, 0.5],
        "image_processor_type": "Gemma3ImageProcessor",
        "image_seq_length": 16,
        "image_std": [0.5, 0.5, 0.5],
        "pan_and_scan_max_num_crops": None,
        "pan_and_scan_min_crop_size": None,
        "pan_and_scan_min_ratio_to_activate": None,
        "processor_class": "Gemma3Processor",
        "resample": 2,
        "rescale_factor": 1 / 255,
        "size": {"height": 64, "width": 64},
    }
    proc = {"image_seq_length": 16, "processor_class": "Gemma3Processor"}
    eos = [t("<eos>"), t("<end_of_turn>")]
    gen = {"bos_token_id": t("<bos>"), "eos_token_id": eos, "pad_token_id": t("<pad>")}
    return Recipe(config, "AutoModelForImageTextToText", gen, pre, proc)


# ShieldGemma 2 (google/shieldgemma-2-4b-it): Gemma 3 under its own model_type, an image and a
# safety policy per prompt (its chat template), answered Yes / No --------------------------------

_SHIELDGEMMA_TEMPLATE = (
    "{{- bos_token -}}"
    "{%- for message in messages -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{{- '<start_of_turn>' + role + '\\n' -}}"
    "{%- if role == 'user' -%}{{- 'You are a policy expert trying to help determine whether a "
    "generated or real image is in violation of the safety policy below.\\n\\n' -}}{%- endif -%}"
    "{%- if message['content'] is string -%}{{- message['content'] | trim -}}"
    "{%- else -%}{%- for part in message['content'] -%}"
    "{%- if part['type'] in ('image', 'image_url') -%}{{- '<start_of_image>' -}}"
    "{%- elif part['type'] == 'text' -%}"
    "{{- '\\n\\n<BEGIN_SAFETY_POLICY>\\n' + part['text'] | trim + '\\n</END_SAFETY_POLICY>' -}}"
    "{%- endif -%}{%- endfor -%}{%- endif -%}"
    "{%- if role == 'user' -%}{{- '\\n\\nDoes the image violate the above policy? Your Answer "
    "must start with \\'Yes\\' or \\'No\\'.' -}}{%- endif -%}"
    "{{- '<end_of_turn>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<start_of_turn>model\\n' -}}{%- endif -%}"
)


def _recipe_shieldgemma2(tok: Any, vocab: int) -> Recipe:
    from transformers import ShieldGemma2Config

    gemma3 = _recipe_gemma3(tok, vocab)
    data = gemma3.config.to_dict()
    keep = ("mm_tokens_per_image", "boi_token_index", "eoi_token_index", "image_token_index")
    config = ShieldGemma2Config(
        text_config=data["text_config"],
        vision_config=data["vision_config"],
        initializer_range=0.02,
        **{k: data[k] for k in keep},
    )
    pre = dict(gemma3.preprocessor, processor_class="ShieldGemma2Processor")
    proc = {
        "image_seq_length": 16,
        "policy_definitions": {"dangerous": "No Dangerous Content: nothing harmful."},
        "processor_class": "ShieldGemma2Processor",
    }
    return Recipe(config, "AutoModelForImageTextToText", gemma3.generation, pre, proc)


FAMILY_SPECS = (
    Family(
        "gemma3",
        TokSpec(_GEMMA_HEAD, _GEMMA_TAIL, _GEMMA_ROLES, _GEMMA_TEMPLATE, add_bos=True),
        _recipe_gemma3,
        "<start_of_image>",
        "<image_soft_token>",
        base=True,
    ),
    Family(
        "shieldgemma2",
        TokSpec(_GEMMA_HEAD, _GEMMA_TAIL, _GEMMA_ROLES, _SHIELDGEMMA_TEMPLATE, add_bos=True),
        _recipe_shieldgemma2,
        "<start_of_image>",
        "<image_soft_token>",
    ),
)
