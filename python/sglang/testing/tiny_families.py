"""Tiny recipes for the VLM families users bring (InternVL, LLaVA-NeXT, Granite Vision, ...).

Each family is laid out as its published checkpoints are: the processor class they name, the
family's special tokens (as tokenizer attributes where the processor reads them) and a chat
template in the family's style. Sizes are tiny but keep each family's structure: several tiles
per image where the family tiles, row breaks where it breaks rows.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sglang.testing.tiny_common import (
    _QWEN_ROLES,
    _QWEN_SPECIALS,
    _QWEN_SYSTEM,
    _qwen_generation,
    _qwen_template,
    _qwen_text,
    _Recipe,
    _TokSpec,
)

_IMAGENET_MEAN = [0.485, 0.456, 0.406]
_IMAGENET_STD = [0.229, 0.224, 0.225]
_SMALL_VIT = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
}


@dataclass(frozen=True)
class Family:
    tokenizer: _TokSpec
    recipe: Callable[[Any, int], _Recipe]
    placeholder: str  # what a prompt writes for one image
    image_token: str  # the token whose embedding rows are the image's


def _chatml(image_text: str, system: str | None = _QWEN_SYSTEM) -> str:
    """A Qwen-style ChatML template that writes ``image_text`` for every image part."""
    return _qwen_template(system).replace("<|vision_start|><|image_pad|><|vision_end|>", image_text)


# InternVL 3 (-hf checkpoints): Qwen2 LM; tiles of 448 (here 56) plus a thumbnail --------------
_INTERNVL_TOKENS = {"start_image_token": "<img>", "end_image_token": "</img>"}
_INTERNVL_ROLES = {
    **_QWEN_ROLES,
    **_INTERNVL_TOKENS,
    "context_image_token": "<IMG_CONTEXT>",
    "video_token": "<video>",
}


def _recipe_internvl(tok: Any, vocab: int) -> _Recipe:
    from transformers import InternVLConfig

    config = InternVLConfig(
        text_config=dict(_qwen_text(tok, vocab), model_type="qwen2"),
        vision_config=dict(_SMALL_VIT, image_size=[56, 56], patch_size=[14, 14]),
        image_token_id=tok.convert_tokens_to_ids("<IMG_CONTEXT>"),
        image_seq_length=4,
        downsample_ratio=0.5,
        vision_feature_layer=-1,
        vision_feature_select_strategy="default",
    )
    pre = {
        "crop_to_patches": False,  # the processor turns tiling on, the image processor does not
        "do_convert_rgb": True,
        "do_normalize": True,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": _IMAGENET_MEAN,
        "image_processor_type": "GotOcr2ImageProcessorFast",
        "image_std": _IMAGENET_STD,
        "max_patches": 6,
        "min_patches": 1,
        "processor_class": "InternVLProcessor",
        "resample": 3,
        "rescale_factor": 1 / 255,
        "size": {"height": 56, "width": 56},
    }
    proc = {"image_seq_length": 4, "processor_class": "InternVLProcessor"}
    return _Recipe(config, "AutoModelForImageTextToText", _qwen_generation(tok), pre, proc)


FAMILIES: dict[str, Family] = {
    "internvl": Family(
        _TokSpec(
            (),
            (*_QWEN_SPECIALS, "<img>", "</img>", "<IMG_CONTEXT>", "<video>"),
            _INTERNVL_ROLES,
            _chatml("<IMG_CONTEXT>\n"),
        ),
        _recipe_internvl,
        "<IMG_CONTEXT>",
        "<IMG_CONTEXT>",
    ),
}
