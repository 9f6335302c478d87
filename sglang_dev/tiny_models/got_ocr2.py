"""GOT-OCR 2.0: a SAM-style tower, 256 tokens per view, a Qwen2 LM."""

from __future__ import annotations

from typing import Any

from sglang_dev.tiny_models.common import (
    CLIP_MEAN,
    CLIP_STD,
    QWEN_ROLES,
    QWEN_SPECIALS,
    Family,
    Recipe,
    TokSpec,
    content_template,
    qwen_generation,
    qwen_text,
)

# GOT-OCR 2.0 (stepfun-ai/GOT-OCR-2.0-hf): a SAM-style tower whose two stride-2 convolutions give
# 256 tokens per view (here a 64-px view of 1-px patches, windowed attention only), a Qwen2 LM;
# <img> + <imgpad> x 256 per view + </img>, in ChatML with GOT's system prompt -------------------
_GOT_SYSTEM = "You should follow the instructions carefully and explain your answers in detail."
_GOT_IMAGE = "<img><imgpad></img>"
_GOT_TEMPLATE = (
    "{{- '<|im_start|>system\\n" + _GOT_SYSTEM + "<|im_end|>' -}}"
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    + content_template(_GOT_IMAGE + "\\n")
    + "{{- '<|im_end|>' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


def _recipe_got_ocr2(tok: Any, vocab: int) -> Recipe:
    from transformers import GotOcr2Config

    vision = {
        "hidden_size": 16,
        "output_channels": 16,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "image_size": 64,
        "patch_size": 1,
        "window_size": 8,
        "global_attn_indexes": [],
        "mlp_dim": 32,
        "initializer_range": 0.1,  # the default 1e-10 would make every image look the same
    }
    config = GotOcr2Config(
        text_config=dict(qwen_text(tok, vocab), model_type="qwen2", tie_word_embeddings=True),
        vision_config=vision,
        image_token_index=tok.convert_tokens_to_ids("<imgpad>"),
        image_seq_length=256,
    )
    pre = {
        "crop_to_patches": False,
        "do_convert_rgb": True,
        "do_normalize": True,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": CLIP_MEAN,
        "image_processor_type": "GotOcr2ImageProcessor",
        "image_std": CLIP_STD,
        "max_patches": 6,
        "min_patches": 1,
        "processor_class": "GotOcr2Processor",
        "resample": 3,
        "rescale_factor": 1 / 255,
        "size": {"height": 64, "width": 64},
    }
    proc = {"processor_class": "GotOcr2Processor"}
    return Recipe(config, "AutoModelForImageTextToText", qwen_generation(tok), pre, proc)


FAMILY_SPECS = (
    Family(
        "got_ocr2",
        TokSpec((), (*QWEN_SPECIALS, "<img>", "</img>", "<imgpad>"), QWEN_ROLES, _GOT_TEMPLATE),
        _recipe_got_ocr2,
        _GOT_IMAGE,
        "<imgpad>",
    ),
)
