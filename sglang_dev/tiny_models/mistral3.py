"""Mistral3 (Mistral-Small-3.1): a Pixtral tower, [IMG] runs broken by [IMG_BREAK] per row."""

from __future__ import annotations

from typing import Any

from sglang_dev.tiny_models.common import (
    CLIP_MEAN,
    CLIP_STD,
    SMALL_VIT,
    Family,
    Recipe,
    TokSpec,
)
from sglang_dev.tiny_models.llava import LLAVA_HEAD, LLAVA_ROLES, llava_generation, llava_text

# Mistral3 (Mistral-Small-3.1): Pixtral tower, [IMG] runs broken by [IMG_BREAK] per row ------------
_MISTRAL3_TAIL = ("[INST]", "[/INST]", "[IMG]", "[IMG_BREAK]", "[IMG_END]")
_MISTRAL3_TEMPLATE = (
    "{{- bos_token -}}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'user' -%}{{- '[INST]' -}}"
    "{%- if message['content'] is string -%}{{- message['content'] -}}"
    "{%- else -%}{%- for part in message['content'] -%}"
    "{%- if part['type'] in ('image', 'image_url') -%}{{- '[IMG]' -}}"
    "{%- elif part['type'] == 'text' -%}{{- part['text'] -}}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}{{- '[/INST]' -}}"
    "{%- elif message['role'] == 'assistant' -%}"
    "{{- (message['content'] if message['content'] is string"
    " else message['content'][0]['text']) + eos_token -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
)


def _recipe_mistral3(tok: Any, vocab: int) -> Recipe:
    from transformers import Mistral3Config

    vision = dict(SMALL_VIT, model_type="pixtral", image_size=112, patch_size=14, head_dim=16)
    config = Mistral3Config(
        text_config=llava_text(tok, vocab, "mistral", sliding_window=None, head_dim=32),
        vision_config=vision,
        image_token_index=tok.convert_tokens_to_ids("[IMG]"),
        spatial_merge_size=2,
        vision_feature_layer=-1,
        multimodal_projector_bias=False,
        projector_hidden_act="gelu",
    )
    pre = {
        "do_convert_rgb": True,
        "do_normalize": True,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": CLIP_MEAN,
        "image_processor_type": "PixtralImageProcessor",
        "image_std": CLIP_STD,
        "patch_size": 14,
        "processor_class": "PixtralProcessor",
        "resample": 3,
        "rescale_factor": 1 / 255,
        "size": {"longest_edge": 112},
    }
    proc = {
        "image_break_token": "[IMG_BREAK]",
        "image_end_token": "[IMG_END]",
        "image_token": "[IMG]",
        "patch_size": 14,
        "processor_class": "PixtralProcessor",
        "spatial_merge_size": 2,
    }
    return Recipe(config, "AutoModelForImageTextToText", llava_generation(tok), pre, proc)


FAMILY_SPECS = (
    Family(
        "mistral3",
        TokSpec(
            LLAVA_HEAD,
            (*_MISTRAL3_TAIL, "<pad>"),
            LLAVA_ROLES,
            _MISTRAL3_TEMPLATE,
            add_bos=True,
        ),
        _recipe_mistral3,
        "[IMG]",
        "[IMG]",
    ),
)
