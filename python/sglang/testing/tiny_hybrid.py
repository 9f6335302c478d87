"""Tiny recipes for hybrid linear-attention VLMs: Qwen3.5, Qwen3.5-MoE and LFM3-VL.

Laid out as the published checkpoints are: Qwen3-VL's processor and vision tower without
deepstack, Qwen's special tokens plus ``<think>``/``</think>`` as plain added tokens (decoding
keeps them), and a chat template in Qwen3.5's style that thinks by default and takes
``enable_thinking``. The language model keeps the 3:1 pattern of Gated DeltaNet and full-attention
layers.
"""

from __future__ import annotations

from typing import Any

from sglang.testing.tiny_common import (
    _QWEN3_VISION,
    _QWEN_ROLES,
    _QWEN_SPECIALS,
    _TEXT,
    _qwen_generation,
    _qwen_ids,
    _qwen_preprocessor,
    _qwen_text,
    _Recipe,
    _TokSpec,
)
from sglang.testing.tiny_families import Family

_QWEN_IMAGE = "<|vision_start|><|image_pad|><|vision_end|>"
_QWEN3_5_SPECIALS = (*_QWEN_SPECIALS, "<tool_call>", "</tool_call>")
_THINK_TOKENS = ("<think>", "</think>")

# Qwen3.5 style: thinking on by default (the generation prompt opens a <think> block);
# ``enable_thinking=False`` renders an empty block. Earlier assistant turns keep only their answer.
_QWEN3_5_TEMPLATE = (
    "{%- set ns = namespace(last_query=-1, images=0) -%}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'user' -%}{%- set ns.last_query = loop.index0 -%}{%- endif -%}"
    "{%- endfor -%}"
    "{%- for message in messages -%}"
    "{%- set body = namespace(text='') -%}"
    "{%- if message['content'] is string -%}{%- set body.text = message['content'] -%}"
    "{%- elif message['content'] -%}{%- for part in message['content'] -%}"
    "{%- if part['type'] in ('image', 'image_url') or 'image' in part or 'image_url' in part -%}"
    "{%- set ns.images = ns.images + 1 -%}"
    "{%- if add_vision_id -%}"
    "{%- set body.text = body.text + 'Picture ' + ns.images|string + ': ' -%}{%- endif -%}"
    "{%- set body.text = body.text + '<|vision_start|><|image_pad|><|vision_end|>' -%}"
    "{%- elif part['type'] in ('video', 'video_url') or 'video' in part -%}"
    "{%- set body.text = body.text + '<|vision_start|><|video_pad|><|vision_end|>' -%}"
    "{%- elif 'text' in part -%}{%- set body.text = body.text + part['text'] -%}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{%- if message['role'] == 'assistant' -%}"
    "{%- set reasoning = message['reasoning_content'] if message['reasoning_content'] is string "
    "else '' -%}"
    "{%- set answer = body.text -%}"
    "{%- if '</think>' in answer -%}"
    "{%- set reasoning = answer.split('</think>')[0].split('<think>')[-1].strip('\\n') -%}"
    "{%- set answer = answer.split('</think>')[-1].lstrip('\\n') -%}"
    "{%- endif -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- if loop.index0 > ns.last_query and reasoning -%}"
    "{{- '<think>\\n' + reasoning + '\\n</think>\\n\\n' -}}{%- endif -%}"
    "{{- answer + '<|im_end|>\\n' -}}"
    "{%- else -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + body.text + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}"
    "{%- if enable_thinking is defined and enable_thinking is false -%}"
    "{{- '<think>\\n\\n</think>\\n\\n' -}}"
    "{%- else -%}{{- '<think>\\n' -}}{%- endif -%}"
    "{%- endif -%}"
)


# Qwen3.5: 3 Gated DeltaNet linear-attention layers then 1 full-attention layer (partial rotary).
_QWEN3_5_TEXT = {
    "num_hidden_layers": 4,
    "head_dim": 64,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    "linear_conv_kernel_dim": 4,
    "rope_parameters": {
        "rope_type": "default",
        "rope_theta": 10000000.0,
        "partial_rotary_factor": 0.25,
        "mrope_section": [3, 3, 2],
        "mrope_interleaved": True,
    },
}
_QWEN3_5_MOE = {
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 64,
    "shared_expert_intermediate_size": 64,
}


def _recipe_qwen3_5(tok: Any, vocab: int, moe: bool = False) -> _Recipe:
    import transformers

    cls = transformers.Qwen3_5MoeConfig if moe else transformers.Qwen3_5Config
    text = _qwen_text(tok, vocab, **_QWEN3_5_TEXT, **(_QWEN3_5_MOE if moe else {}))
    if moe:
        del text["intermediate_size"]
    vision = {k: v for k, v in _QWEN3_VISION.items() if k != "deepstack_visual_indexes"}
    config = cls(text_config=text, vision_config=vision, **_qwen_ids(tok))
    pre = _qwen_preprocessor(16, "Qwen3VLProcessor", "Qwen2VLImageProcessorFast", legacy=False)
    return _Recipe(config, "AutoModelForImageTextToText", _qwen_generation(tok), pre)


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
    "{%- if part['type'] in ('image', 'image_url') -%}{{- '" + _QWEN_IMAGE + "' -}}"
    "{%- elif part['type'] == 'text' -%}{{- part['text'] -}}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


def _recipe_lfm3_vl(tok: Any, vocab: int) -> _Recipe:
    from transformers import Lfm3VlConfig

    t = tok.convert_tokens_to_ids
    text = dict(
        _TEXT,
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
    pre = _qwen_preprocessor(16, "Lfm3VlProcessor", "Qwen2VLImageProcessor", legacy=False)
    gen = {"bos_token_id": t("<|startoftext|>"), "eos_token_id": t("<|im_end|>")}
    return _Recipe(config, "AutoModelForImageTextToText", gen, pre)


# MiniCPM-V 4.6 (openbmb/MiniCPM-V-4.6): a SigLIP tower over the image and its slices (NaViT
# packing, a window-attention merger inside the tower and a 2 x 2 merger after it: 16x fewer
# tokens), a Qwen3.5 LM (Gated DeltaNet); each image <image_id>N</image_id> + <image> + run +
# </image>, then its slices' <slice> runs row by row -----------------------------------------------
_MINICPM_TOKENS = ("<image>", "</image>", "<slice>", "</slice>", "<image_id>", "</image_id>")
_MINICPM_ROLES = {
    **_QWEN_ROLES,
    "image_token": "<|image_pad|>",
    "video_token": "<|video_pad|>",
    "image_start_token": "<image>",
    "image_end_token": "</image>",
    "slice_start_token": "<slice>",
    "slice_end_token": "</slice>",
    "image_id_start_token": "<image_id>",
    "image_id_end_token": "</image_id>",
}
_MINICPM_TEMPLATE = _QWEN3_5_TEMPLATE.replace(_QWEN_IMAGE, "<|image_pad|>\\n")


def _recipe_minicpmv4_6(tok: Any, vocab: int) -> _Recipe:
    from transformers import MiniCPMV4_6Config

    text = _qwen_text(tok, vocab, model_type="qwen3_5_text", **_QWEN3_5_TEXT)
    vision = {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "image_size": 112,
        "patch_size": 14,
    }
    config = MiniCPMV4_6Config(
        text_config=text,
        vision_config=vision,
        insert_layer_id=0,
        image_size=112,
        image_token_id=tok.convert_tokens_to_ids("<|image_pad|>"),
        video_token_id=tok.convert_tokens_to_ids("<|video_pad|>"),
    )
    pre = {
        "do_convert_rgb": True,
        "do_normalize": True,
        "do_rescale": True,
        "do_resize": True,
        "downsample_mode": "16x",
        "image_mean": [0.5] * 3,
        "image_processor_type": "MiniCPMV4_6ImageProcessor",
        "image_std": [0.5] * 3,
        "max_slice_nums": 4,
        "patch_size": 14,
        "processor_class": "MiniCPMV4_6Processor",
        "resample": 3,
        "rescale_factor": 1 / 255,
        "scale_resolution": 112,
        "slice_mode": True,
        "use_image_id": True,
    }
    return _Recipe(config, "AutoModelForImageTextToText", _qwen_generation(tok), pre)


# MiniCPM-V 4.7 (openbmb/MiniCPM-V-4.7-1B): MiniCPM-V 4.6 with canvas M-RoPE (image, slice and
# row-break markers pinned to the image canvas's corners and edges) ------------------------------
def _recipe_minicpmv4_7(tok: Any, vocab: int) -> _Recipe:
    from transformers import MiniCPMV4_7Config

    v46 = _recipe_minicpmv4_6(tok, vocab)
    data = v46.config.to_dict()
    t = tok.convert_tokens_to_ids
    keep = ("insert_layer_id", "image_size", "image_token_id", "video_token_id")
    config = MiniCPMV4_7Config(
        text_config=data["text_config"],
        vision_config=data["vision_config"],
        image_start_id=t("<image>"),
        image_end_id=t("</image>"),
        slice_start_id=t("<slice>"),
        slice_end_id=t("</slice>"),
        newline_id=tok("\\n", add_special_tokens=False)["input_ids"][0],
        **{k: data[k] for k in keep},
    )
    pre = dict(v46.preprocessor, processor_class="MiniCPMV4_7Processor")
    return _Recipe(config, "AutoModelForImageTextToText", v46.generation, pre)


_TOKENIZER = _TokSpec((), _QWEN3_5_SPECIALS, _QWEN_ROLES, _QWEN3_5_TEMPLATE, plain=_THINK_TOKENS)
FAMILIES: dict[str, Family] = {
    "qwen3_5": Family(_TOKENIZER, _recipe_qwen3_5, _QWEN_IMAGE, "<|image_pad|>"),
    "qwen3_5_moe": Family(
        _TOKENIZER,
        lambda tok, vocab: _recipe_qwen3_5(tok, vocab, moe=True),
        _QWEN_IMAGE,
        "<|image_pad|>",
    ),
    "lfm3_vl": Family(
        _TokSpec((), _LFM_SPECIALS, _LFM_ROLES, _LFM_TEMPLATE),
        _recipe_lfm3_vl,
        _QWEN_IMAGE,
        "<|image_pad|>",
    ),
    "minicpmv4_6": Family(
        _TokSpec(
            (),
            (*_QWEN3_5_SPECIALS, *_MINICPM_TOKENS),
            _MINICPM_ROLES,
            _MINICPM_TEMPLATE,
            plain=_THINK_TOKENS,
        ),
        _recipe_minicpmv4_6,
        "<|image_pad|>",
        "<|image_pad|>",
    ),
    "minicpmv4_7": Family(
        _TokSpec(
            (),
            (*_QWEN3_5_SPECIALS, *_MINICPM_TOKENS),
            _MINICPM_ROLES,
            _MINICPM_TEMPLATE,
            plain=_THINK_TOKENS,
        ),
        _recipe_minicpmv4_7,
        "<|image_pad|>",
        "<|image_pad|>",
    ),
}
