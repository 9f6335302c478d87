"""Ovis2: a visual tokenizer (softmax over a visual vocabulary) and indicator tokens."""

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

# Ovis2 (AIDC-AI/Ovis2-*-hf style): a visual tokenizer (softmax over a visual vocabulary, then an
# embedding table); indicator tokens around and between tiles take learned visual embeddings ----
_OVIS_INDICATORS = ("<IMG_START>", "<IMG_GRID>", "<IMG_COL>", "<IMG_ROW>", "<IMG_END>")


def _recipe_ovis2(tok: Any, vocab: int) -> Recipe:
    from transformers import Ovis2Config

    t = tok.convert_tokens_to_ids
    vision = dict(
        SMALL_VIT,
        image_size=56,
        patch_size=14,
        vocab_size=64,
        hidden_stride=2,
        num_visual_indicator_tokens=len(_OVIS_INDICATORS),
    )
    text = dict(qwen_text(tok, vocab), model_type="qwen2")
    config = Ovis2Config(
        text_config=text,
        vision_config=vision,
        image_token_id=t("<IMG_ATOM>"),
        visual_indicator_token_ids=[t(x) for x in _OVIS_INDICATORS],
        vocab_size=vocab,
        hidden_size=text["hidden_size"],
    )
    pre = {
        "crop_to_patches": True,
        "do_convert_rgb": True,
        "do_normalize": True,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": CLIP_MEAN,
        "image_processor_type": "Ovis2ImageProcessor",
        "image_std": CLIP_STD,
        "max_patches": 6,
        "min_patches": 1,
        "processor_class": "Ovis2Processor",
        "resample": 3,
        "rescale_factor": 1 / 255,
        "size": {"height": 56, "width": 56},
        "use_covering_area_grid": True,
    }
    proc = {"image_seq_length": 4, "processor_class": "Ovis2Processor"}
    return Recipe(config, "AutoModelForImageTextToText", qwen_generation(tok), pre, proc)


FAMILY_SPECS = (
    Family(
        "ovis2",
        TokSpec(
            (),
            (*QWEN_SPECIALS, "<image>", "<IMG_ATOM>", *_OVIS_INDICATORS),
            {**QWEN_ROLES, "image_token": "<image>"},
            chatml_template("<image>\\n"),
        ),
        _recipe_ovis2,
        "<image>",
        "<IMG_ATOM>",
    ),
)
