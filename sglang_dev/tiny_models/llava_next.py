"""LLaVA-NeXT and LLaVA-OneVision: anyres tiles (their grid pinpoints and image processor)."""

from __future__ import annotations

from typing import Any

from sglang_dev.tiny_models.common import (
    CLIP_MEAN,
    CLIP_STD,
    QWEN_ROLES,
    QWEN_SPECIALS,
    SMALL_VIT,
    Family,
    Recipe,
    TokSpec,
    chatml_template,
    qwen_generation,
    qwen_text,
)
from sglang_dev.tiny_models.llava import (
    LLAVA_HEAD,
    LLAVA_ROLES,
    clip_vision,
    llava_generation,
    llava_text,
)

# LLaVA-NeXT (llava-v1.6-mistral-7b-hf layout): anyres tiles at 336 (here 28) -------------------
_MISTRAL_TEMPLATE = (
    "{{- bos_token -}}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'user' -%}{{- '[INST] ' -}}"
    "{%- if message['content'] is string -%}{{- message['content'] -}}"
    "{%- else -%}{%- for part in message['content'] -%}"
    "{%- if part['type'] in ('image', 'image_url') -%}{{- '<image>\\n' -}}"
    "{%- elif part['type'] == 'text' -%}{{- part['text'] -}}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}{{- ' [/INST]' -}}"
    "{%- elif message['role'] == 'assistant' -%}"
    "{{- ' ' + (message['content'] if message['content'] is string"
    " else message['content'][0]['text']) + eos_token -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
)
ANYRES_PINPOINTS = [[28, 56], [56, 28], [56, 56], [84, 28], [28, 84]]


def anyres_preprocessor(processor_class: str, mean: list, std: list, **extra: Any) -> dict:
    """preprocessor_config.json of LLaVA-NeXT's anyres tiling (28-px tiles, ANYRES_PINPOINTS)."""
    return {
        "aspect_ratio_setting": "anyres",
        "crop_size": {"height": 28, "width": 28},
        "do_center_crop": True,
        "do_convert_rgb": True,
        "do_normalize": True,
        "do_pad": True,
        "do_rescale": True,
        "do_resize": True,
        "image_grid_pinpoints": ANYRES_PINPOINTS,
        "image_mean": mean,
        "image_processor_type": "LlavaNextImageProcessor",
        "image_std": std,
        "processor_class": processor_class,
        "resample": 3,
        "rescale_factor": 1 / 255,
        "size": {"shortest_edge": 28},
        **extra,
    }


def _recipe_llava_next(tok: Any, vocab: int) -> Recipe:
    from transformers import LlavaNextConfig

    config = LlavaNextConfig(
        text_config=llava_text(tok, vocab, "mistral", sliding_window=None, head_dim=32),
        vision_config=clip_vision(),
        image_token_index=tok.convert_tokens_to_ids("<image>"),
        image_grid_pinpoints=ANYRES_PINPOINTS,
        image_seq_length=4,
        vision_feature_layer=-2,
        vision_feature_select_strategy="default",
    )
    pre = anyres_preprocessor("LlavaNextProcessor", CLIP_MEAN, CLIP_STD)
    proc = {
        "image_token": "<image>",
        "num_additional_image_tokens": 1,
        "patch_size": 14,
        "processor_class": "LlavaNextProcessor",
        "vision_feature_select_strategy": "default",
    }
    return Recipe(config, "AutoModelForImageTextToText", llava_generation(tok), pre, proc)


# LLaVA-OneVision (llava-onevision-qwen2-*-ov-hf): SigLIP + Qwen2, anyres_max_9 ----------------
def _recipe_llava_onevision(tok: Any, vocab: int) -> Recipe:
    from transformers import LlavaOnevisionConfig

    config = LlavaOnevisionConfig(
        text_config=dict(qwen_text(tok, vocab), model_type="qwen2"),
        vision_config=dict(
            SMALL_VIT, model_type="siglip_vision_model", image_size=28, patch_size=14
        ),
        image_token_index=tok.convert_tokens_to_ids("<image>"),
        video_token_index=tok.convert_tokens_to_ids("<video>"),
        image_grid_pinpoints=ANYRES_PINPOINTS,
        vision_aspect_ratio="anyres_max_9",
        vision_feature_layer=-1,
        vision_feature_select_strategy="full",
    )
    pre = anyres_preprocessor("LlavaOnevisionProcessor", [0.5] * 3, [0.5] * 3)
    pre.update(
        image_processor_type="LlavaOnevisionImageProcessor", size={"height": 28, "width": 28}
    )
    del pre["crop_size"], pre["do_center_crop"], pre["aspect_ratio_setting"]
    proc = {
        "image_token": "<image>",
        "num_image_tokens": 4,
        "processor_class": "LlavaOnevisionProcessor",
        "video_token": "<video>",
        "vision_aspect_ratio": "anyres_max_9",
        "vision_feature_select_strategy": "full",
    }
    # LlavaOnevisionVideoProcessor: every frame resized to the tower's view
    video = {
        "image_mean": [0.5] * 3,
        "image_std": [0.5] * 3,
        "resample": 3,
        "size": {"height": 28, "width": 28},
        "video_processor_type": "LlavaOnevisionVideoProcessor",
    }
    gen = qwen_generation(tok)
    return Recipe(config, "AutoModelForImageTextToText", gen, pre, proc, video)


FAMILY_SPECS = (
    Family(
        "llava_next",
        TokSpec(
            LLAVA_HEAD,
            ("<image>", "<pad>"),
            {**LLAVA_ROLES, "image_token": "<image>"},
            _MISTRAL_TEMPLATE,
            add_bos=True,
        ),
        _recipe_llava_next,
        "<image>",
        "<image>",
    ),
    Family(
        "llava_onevision",
        TokSpec(
            (),
            (*QWEN_SPECIALS, "<image>", "<video>"),
            {**QWEN_ROLES, "image_token": "<image>", "video_token": "<video>"},
            chatml_template("<image>\n", video_text="<video>\n"),
        ),
        _recipe_llava_onevision,
        "<image>",
        "<image>",
        video=True,
    ),
)
