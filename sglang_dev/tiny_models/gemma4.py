"""Gemma 4: sliding / full layers of different head dims, KV sharing, per-layer inputs."""

from __future__ import annotations

from typing import Any

from sglang_dev.tiny_models.common import (
    Family,
    Recipe,
    TokSpec,
)

# Gemma 4: 5:1-style sliding / full layers whose head dims differ, the last layers reading the
# KV of earlier ones, per-layer inputs, keys as values on full layers, images bidirectional on
# the sliding layers; aspect-preserving patches pooled 3 x 3 into soft tokens --------------------
_GEMMA4_HEAD = ("<pad>", "<eos>", "<bos>", "<unk>", "<mask>")
_GEMMA4_TAIL = (
    *("<|turn>", "<turn|>", "<|image>", "<image|>", "<|image|>", "<|video|>"),
    *("<|audio>", "<audio|>", "<|audio|>"),  # the processor requires them (audio is not served)
)
_GEMMA4_ROLES = {
    "pad_token": "<pad>",
    "eos_token": "<eos>",
    "bos_token": "<bos>",
    "unk_token": "<unk>",
    "mask_token": "<mask>",
    "boi_token": "<|image>",
    "eoi_token": "<image|>",
    "image_token": "<|image|>",
    "boa_token": "<|audio>",
    "eoa_token": "<audio|>",
    "audio_token": "<|audio|>",
}
_GEMMA4_TEMPLATE = (
    "{{- bos_token -}}"
    "{%- for message in messages -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{{- '<|turn>' + role + '\\n' -}}"
    "{%- if message['content'] is string -%}{{- message['content'] | trim -}}"
    "{%- else -%}{%- for part in message['content'] -%}"
    "{%- if part['type'] in ('image', 'image_url') -%}{{- '<|image|>' -}}"
    "{%- elif part['type'] == 'text' -%}{{- part['text'] | trim -}}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{{- '<turn|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|turn>model\\n' -}}{%- endif -%}"
)
_GEMMA4_LAYERS = ["sliding_attention", "sliding_attention", "full_attention"] * 2


def _recipe_gemma4(tok: Any, vocab: int) -> Recipe:
    from transformers import Gemma4Config

    t = tok.convert_tokens_to_ids
    text = dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=len(_GEMMA4_LAYERS),
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        global_head_dim=32,
        num_global_key_value_heads=1,
        attention_k_eq_v=True,
        num_kv_shared_layers=2,
        hidden_size_per_layer_input=64,
        vocab_size_per_layer_input=vocab,
        layer_types=_GEMMA4_LAYERS,
        sliding_window=24,
        use_bidirectional_attention="vision",
        final_logit_softcapping=30.0,
        max_position_embeddings=4096,
        initializer_range=0.02,
        vocab_size=vocab,
        pad_token_id=t("<pad>"),
        eos_token_id=t("<eos>"),
        bos_token_id=t("<bos>"),
    )
    vision = dict(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=16,
        patch_size=4,
        pooling_kernel_size=3,
        position_embedding_size=256,
    )
    config = Gemma4Config(
        text_config=text,
        vision_config=vision,
        audio_config=None,
        image_token_id=t("<|image|>"),
        boi_token_id=t("<|image>"),
        eoi_token_id=t("<image|>"),
        video_token_id=t("<|video|>"),
        initializer_range=0.02,
    )
    pre = {
        "image_processor_type": "Gemma4ImageProcessor",
        "processor_class": "Gemma4Processor",
        "do_convert_rgb": True,
        "do_normalize": False,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": [0.0, 0.0, 0.0],
        "image_std": [1.0, 1.0, 1.0],
        "max_soft_tokens": 70,
        "patch_size": 4,
        "pooling_kernel_size": 3,
        "resample": 3,
        "rescale_factor": 1 / 255,
    }
    proc = {"image_seq_length": 70, "processor_class": "Gemma4Processor"}
    eos = [t("<eos>"), t("<turn|>")]
    gen = {"bos_token_id": t("<bos>"), "eos_token_id": eos, "pad_token_id": t("<pad>")}
    return Recipe(config, "AutoModelForImageTextToText", gen, pre, proc)


FAMILY_SPECS = (
    Family(
        "gemma4",
        TokSpec(_GEMMA4_HEAD, _GEMMA4_TAIL, _GEMMA4_ROLES, _GEMMA4_TEMPLATE, add_bos=True),
        _recipe_gemma4,
        "<|image|>",
        "<|image|>",
    ),
)
