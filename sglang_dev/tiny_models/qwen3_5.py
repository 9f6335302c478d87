"""Qwen3.5 and Qwen3.5-MoE: hybrid linear-attention VLMs.

Laid out as the published checkpoints are: Qwen3-VL's processor and vision tower without
deepstack, Qwen's special tokens plus ``<think>``/``</think>`` as plain added tokens (decoding
keeps them), and a chat template in Qwen3.5's style that thinks by default and takes
``enable_thinking``. The language model keeps the 3:1 pattern of Gated DeltaNet and full-attention
layers.
"""

from __future__ import annotations

from typing import Any

from sglang_dev.tiny_models.common import (
    QWEN3_VISION,
    QWEN_IMAGE,
    QWEN_ROLES,
    QWEN_SPECIALS,
    Family,
    Recipe,
    TokSpec,
    qwen_generation,
    qwen_ids,
    qwen_preprocessor,
    qwen_text,
    qwen_video_preprocessor,
)

QWEN3_5_SPECIALS = (*QWEN_SPECIALS, "<tool_call>", "</tool_call>")
THINK_TOKENS = ("<think>", "</think>")

# Qwen3.5 style: thinking on by default (the generation prompt opens a <think> block);
# ``enable_thinking=False`` renders an empty block. Earlier assistant turns keep only their answer.
QWEN3_5_TEMPLATE = (
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
QWEN3_5_TEXT = {
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


def _recipe_qwen3_5(tok: Any, vocab: int, moe: bool = False) -> Recipe:
    import transformers

    cls = transformers.Qwen3_5MoeConfig if moe else transformers.Qwen3_5Config
    text = qwen_text(tok, vocab, **QWEN3_5_TEXT, **(_QWEN3_5_MOE if moe else {}))
    if moe:
        del text["intermediate_size"]
    vision = {k: v for k, v in QWEN3_VISION.items() if k != "deepstack_visual_indexes"}
    config = cls(text_config=text, vision_config=vision, **qwen_ids(tok))
    pre = qwen_preprocessor(16, "Qwen3VLProcessor", "Qwen2VLImageProcessorFast", legacy=False)
    video = qwen_video_preprocessor(16, "Qwen3VLVideoProcessor")
    return Recipe(config, "AutoModelForImageTextToText", qwen_generation(tok), pre, None, video)


def _recipe_qwen3_5_moe(tok: Any, vocab: int) -> Recipe:
    return _recipe_qwen3_5(tok, vocab, moe=True)


# "small": the vision tower's overrides (the text's are the builder's SMALL_TEXT)
_SMALL_VISION = {
    "depth": 4,
    "hidden_size": 384,
    "num_heads": 6,
    "intermediate_size": 1024,
    "out_hidden_size": 256,
}


_TOKENIZER = TokSpec((), QWEN3_5_SPECIALS, QWEN_ROLES, QWEN3_5_TEMPLATE, plain=THINK_TOKENS)


FAMILY_SPECS = (
    Family(
        "qwen3_5",
        _TOKENIZER,
        _recipe_qwen3_5,
        QWEN_IMAGE,
        "<|image_pad|>",
        video=True,
        small_vision=_SMALL_VISION,
        hybrid=True,
    ),
    Family(
        "qwen3_5_moe",
        _TOKENIZER,
        _recipe_qwen3_5_moe,
        QWEN_IMAGE,
        "<|image_pad|>",
        video=True,
        hybrid=True,
    ),
)
