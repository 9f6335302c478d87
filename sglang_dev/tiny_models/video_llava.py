"""Video-LLaVA and LLaVA-NeXT-Video (images only): LLaVA layouts with a Vicuna-style template."""

from __future__ import annotations

from typing import Any

from sglang_dev.tiny_models.common import (
    CLIP_MEAN,
    CLIP_STD,
    Family,
    Recipe,
    TokSpec,
    content_template,
)
from sglang_dev.tiny_models.llava import (
    LLAVA_HEAD,
    LLAVA_ROLES,
    clip_vision,
    llava_generation,
    llava_text,
)
from sglang_dev.tiny_models.llava_next import ANYRES_PINPOINTS, anyres_preprocessor

# Video-LLaVA (LanguageBind/Video-LLaVA-7B-hf), LLaVA-NeXT-Video (llava-hf/LLaVA-NeXT-Video-7B-hf):
# images as LLaVA 1.5 (center crop) and LLaVA-NeXT (anyres tiles), a Vicuna-style template; videos
# are not served ---------------------------------------------------------------------------------
_VICUNA_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- ('USER: ' if message['role'] == 'user' else 'ASSISTANT: ') -}}"
    + content_template("<image>\\n")
    + "{{- ' ' if message['role'] == 'user' else eos_token -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- 'ASSISTANT:' -}}{%- endif -%}"
)
_VIDEO_LLAVA_ROLES = {**LLAVA_ROLES, "image_token": "<image>", "video_token": "<video>"}


def _recipe_video_llava(tok: Any, vocab: int) -> Recipe:
    from transformers import VideoLlavaConfig

    t = tok.convert_tokens_to_ids
    config = VideoLlavaConfig(
        text_config=llava_text(tok, vocab, "llama"),
        vision_config=clip_vision(image_size=56),
        image_token_index=t("<image>"),
        video_token_index=t("<video>"),
        image_seq_length=16,
        video_seq_length=8 * 17,
        vision_feature_layer=-2,
        vision_feature_select_strategy="default",
    )
    pre = {
        "crop_size": {"height": 56, "width": 56},
        "do_center_crop": True,
        "do_convert_rgb": True,
        "do_normalize": True,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": CLIP_MEAN,
        "image_processor_type": "VideoLlavaImageProcessor",
        "image_std": CLIP_STD,
        "processor_class": "VideoLlavaProcessor",
        "resample": 3,
        "rescale_factor": 1 / 255,
        "size": {"shortest_edge": 56},
    }
    proc = {
        "image_token": "<image>",
        "num_additional_image_tokens": 1,
        "patch_size": 14,
        "processor_class": "VideoLlavaProcessor",
        "video_token": "<video>",
        "vision_feature_select_strategy": "default",
    }
    return Recipe(config, "AutoModelForImageTextToText", llava_generation(tok), pre, proc)


def _recipe_llava_next_video(tok: Any, vocab: int) -> Recipe:
    from transformers import LlavaNextVideoConfig

    t = tok.convert_tokens_to_ids
    config = LlavaNextVideoConfig(
        text_config=llava_text(tok, vocab, "llama"),
        vision_config=clip_vision(),
        image_token_index=t("<image>"),
        video_token_index=t("<video>"),
        image_grid_pinpoints=ANYRES_PINPOINTS,
        image_seq_length=4,
        video_seq_length=1,
        vision_feature_layer=-2,
        vision_feature_select_strategy="default",
    )
    pre = anyres_preprocessor("LlavaNextVideoProcessor", CLIP_MEAN, CLIP_STD)
    proc = {
        "image_token": "<image>",
        "num_additional_image_tokens": 1,
        "patch_size": 14,
        "processor_class": "LlavaNextVideoProcessor",
        "video_token": "<video>",
        "vision_feature_select_strategy": "default",
    }
    return Recipe(config, "AutoModelForImageTextToText", llava_generation(tok), pre, proc)


FAMILY_SPECS = (
    Family(
        "video_llava",
        TokSpec(
            LLAVA_HEAD,
            ("<image>", "<video>", "<pad>"),
            _VIDEO_LLAVA_ROLES,
            _VICUNA_TEMPLATE,
            add_bos=True,
        ),
        _recipe_video_llava,
        "<image>",
        "<image>",
    ),
    Family(
        "llava_next_video",
        TokSpec(
            LLAVA_HEAD,
            ("<image>", "<video>", "<pad>"),
            _VIDEO_LLAVA_ROLES,
            _VICUNA_TEMPLATE,
            add_bos=True,
        ),
        _recipe_llava_next_video,
        "<image>",
        "<image>",
    ),
)
