"""InternVL 3 (-hf checkpoints) and Qianfan-OCR: GotOCR2 tiles plus a thumbnail, pixel-shuffled."""

from __future__ import annotations

from typing import Any

from sglang_dev.tiny_models.common import (
    IMAGENET_MEAN,
    IMAGENET_STD,
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

# InternVL 3 (-hf checkpoints): Qwen2 LM; tiles of 448 (here 56) plus a thumbnail --------------
_INTERNVL_TOKENS = {"start_image_token": "<img>", "end_image_token": "</img>"}
_INTERNVL_ROLES = {
    **QWEN_ROLES,
    **_INTERNVL_TOKENS,
    "context_image_token": "<IMG_CONTEXT>",
    "video_token": "<video>",
}


def _recipe_internvl(tok: Any, vocab: int) -> Recipe:
    from transformers import InternVLConfig

    config = InternVLConfig(
        text_config=dict(qwen_text(tok, vocab), model_type="qwen2"),
        vision_config=dict(SMALL_VIT, image_size=[56, 56], patch_size=[14, 14]),
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
        "image_mean": IMAGENET_MEAN,
        "image_processor_type": "GotOcr2ImageProcessorFast",
        "image_std": IMAGENET_STD,
        "max_patches": 6,
        "min_patches": 1,
        "processor_class": "InternVLProcessor",
        "resample": 3,
        "rescale_factor": 1 / 255,
        "size": {"height": 56, "width": 56},
    }
    proc = {"image_seq_length": 4, "processor_class": "InternVLProcessor"}
    # InternVLVideoProcessor: every frame resized to one tile
    video = {
        "image_mean": IMAGENET_MEAN,
        "image_std": IMAGENET_STD,
        "initial_shift": True,
        "resample": 3,
        "size": {"height": 56, "width": 56},
        "video_processor_type": "InternVLVideoProcessor",
    }
    gen = qwen_generation(tok)
    return Recipe(config, "AutoModelForImageTextToText", gen, pre, proc, video)


# Qianfan-OCR (baidu/Qianfan-OCR): the InternVL design (GotOCR2 tiles of 448, here 56, plus a
# thumbnail, pixel-shuffled) with a Qwen3 LM; prompts write <image>, expanded to <img> +
# <IMG_CONTEXT> run + </img> ---------------------------------------------------------------------
_QIANFAN_ROLES = {**_INTERNVL_ROLES, "image_token": "<image>"}
del _QIANFAN_ROLES["video_token"]


def _recipe_qianfan_ocr(tok: Any, vocab: int) -> Recipe:
    from transformers import QianfanOCRConfig

    config = QianfanOCRConfig(
        text_config=qwen_text(tok, vocab, model_type="qwen3", head_dim=32, sliding_window=None),
        vision_config=dict(SMALL_VIT, image_size=[56, 56], patch_size=[14, 14]),
        image_token_id=tok.convert_tokens_to_ids("<IMG_CONTEXT>"),
        image_seq_length=4,
        downsample_ratio=0.5,
    )
    pre = {
        "crop_to_patches": False,
        "do_convert_rgb": True,
        "do_normalize": True,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": IMAGENET_MEAN,
        "image_processor_type": "GotOcr2ImageProcessor",
        "image_std": IMAGENET_STD,
        "max_patches": 6,
        "min_patches": 1,
        "processor_class": "QianfanOCRProcessor",
        "resample": 3,
        "rescale_factor": 1 / 255,
        "size": {"height": 56, "width": 56},
    }
    proc = {"image_seq_length": 4, "processor_class": "QianfanOCRProcessor"}
    return Recipe(config, "AutoModelForImageTextToText", qwen_generation(tok), pre, proc)


FAMILY_SPECS = (
    Family(
        "internvl",
        TokSpec(
            (),
            (*QWEN_SPECIALS, "<img>", "</img>", "<IMG_CONTEXT>", "<video>"),
            _INTERNVL_ROLES,
            chatml_template("<IMG_CONTEXT>\n", video_text="<video>\n"),
        ),
        _recipe_internvl,
        "<IMG_CONTEXT>",
        "<IMG_CONTEXT>",
        video=True,
    ),
    Family(
        "qianfan_ocr",
        TokSpec(
            (),
            (*QWEN_SPECIALS, "<img>", "</img>", "<IMG_CONTEXT>", "<image>"),
            _QIANFAN_ROLES,
            chatml_template("<image>\\n", None),
        ),
        _recipe_qianfan_ocr,
        "<image>",
        "<IMG_CONTEXT>",
    ),
)
