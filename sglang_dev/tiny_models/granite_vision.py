"""Granite Vision 3.x, Granite 4 Vision and Granite-Docling: Granite LMs behind LLaVA-NeXT
or Idefics3-style image layouts."""

from __future__ import annotations

from typing import Any

from sglang_dev.tiny_models.common import (
    CLIP_MEAN,
    CLIP_STD,
    SMALL_VIT,
    TEXT,
    Family,
    Recipe,
    TokSpec,
    content_template,
)
from sglang_dev.tiny_models.idefics import ROW_COL
from sglang_dev.tiny_models.llava import clip_vision
from sglang_dev.tiny_models.llava_next import ANYRES_PINPOINTS, anyres_preprocessor

# Granite Vision 3.x: LLaVA-NeXT with a SigLIP tower, several feature layers concatenated and a
# Granite LM (embedding / residual / attention multipliers, logits scaling) ---------------------
_GRANITE_TAIL = ("<|start_of_role|>", "<|end_of_role|>", "<|end_of_text|>", "<image>", "<pad>")
_GRANITE_ROLES = {
    "bos_token": "<|end_of_text|>",
    "eos_token": "<|end_of_text|>",
    "pad_token": "<pad>",
    "unk_token": "<|end_of_text|>",
}
_GRANITE_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|start_of_role|>' + message['role'] + '<|end_of_role|>' -}}"
    + content_template("<image>\\n")
    + "{{- '<|end_of_text|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|start_of_role|>assistant<|end_of_role|>' -}}"
    "{%- endif -%}"
)


def _granite_text(tok: Any, vocab: int, model_type: str, **extra: Any) -> dict[str, Any]:
    """A Granite LM: embedding, residual and attention multipliers and logits scaling."""
    t = tok.convert_tokens_to_ids
    return dict(
        TEXT,
        model_type=model_type,
        vocab_size=vocab,
        bos_token_id=t("<|end_of_text|>"),
        eos_token_id=t("<|end_of_text|>"),
        pad_token_id=t("<pad>"),
        embedding_multiplier=12.0,
        logits_scaling=8.0,
        residual_multiplier=0.22,
        attention_multiplier=0.015625,
        **extra,
    )


def _recipe_granite_vision(tok: Any, vocab: int) -> Recipe:
    from transformers import LlavaNextConfig

    t = tok.convert_tokens_to_ids
    text = _granite_text(tok, vocab, "granite", tie_word_embeddings=True)
    vision = dict(SMALL_VIT, model_type="siglip_vision_model", image_size=28, patch_size=14)
    vision["num_hidden_layers"] = 3
    config = LlavaNextConfig(
        text_config=text,
        vision_config=vision,
        image_token_index=t("<image>"),
        image_grid_pinpoints=ANYRES_PINPOINTS,
        image_seq_length=4,
        vision_feature_layer=[-3, -2, -1],
        vision_feature_select_strategy="full",
        tie_word_embeddings=True,
    )
    pre = anyres_preprocessor("LlavaNextProcessor", [0.5] * 3, [0.5] * 3)
    proc = {
        "image_token": "<image>",
        "num_additional_image_tokens": 0,
        "patch_size": 14,
        "processor_class": "LlavaNextProcessor",
        "vision_feature_select_strategy": "full",
    }
    gen = {"bos_token_id": t("<|end_of_text|>"), "eos_token_id": t("<|end_of_text|>")}
    return Recipe(config, "AutoModelForImageTextToText", gen, pre, proc)


# Granite 4 Vision: LLaVA-NeXT tiling, window Q-Former downsamplers, image-token embeddings zero and
# projected features added before given decoder layers (deepstack + spatial offsets) -------------
def _recipe_granite4_vision(tok: Any, vocab: int) -> Recipe:
    from transformers import Granite4VisionConfig

    t = tok.convert_tokens_to_ids
    text = _granite_text(tok, vocab, "granite4_vision_text", num_hidden_layers=4)
    pinpoints = [[56, 112], [112, 56], [112, 112]]
    config = Granite4VisionConfig(
        text_config=text,
        vision_config=clip_vision(image_size=56),
        qformer_config={"num_hidden_layers": 1, "intermediate_size": 128},
        image_token_index=t("<image>"),
        image_grid_pinpoints=pinpoints,
        image_seq_length=4,
        downsample_rate="2/4",
        deepstack_layer_map=[[-2, 0], [-1, 1]],
        spatial_vision_layer=-1,
        spatial_target_layers=[2, 3],
        vision_feature_layer=-2,
        vision_feature_select_strategy="default",
        projector_dropout=0.0,
    )
    pre = anyres_preprocessor("Granite4VisionProcessor", CLIP_MEAN, CLIP_STD)
    pre.update(
        crop_size={"height": 56, "width": 56},
        image_grid_pinpoints=pinpoints,
        size={"shortest_edge": 56},
    )
    proc = {
        "downsample_rate": "2/4",
        "image_token": "<image>",
        "num_additional_image_tokens": 1,
        "patch_size": 14,
        "processor_class": "Granite4VisionProcessor",
        "vision_feature_select_strategy": "default",
    }
    gen = {"bos_token_id": t("<|end_of_text|>"), "eos_token_id": t("<|end_of_text|>")}
    return Recipe(config, "AutoModelForImageTextToText", gen, pre, proc)


# Granite-Docling (ibm-granite/granite-for-docling-500m, transformers granite_docling): page
# tiles with <row_i_col_j> tags around <image> runs and a <global-img> thumbnail (Idefics3 style),
# DeepStack features from inner vision layers, a Granite LM --------------------------------------
def _recipe_granite_docling(tok: Any, vocab: int) -> Recipe:
    from transformers import GraniteDoclingConfig

    t = tok.convert_tokens_to_ids
    text = _granite_text(tok, vocab, "granite_docling_text", tie_word_embeddings=True)
    # 1/head_dim would keep the tiny model's attention near uniform, hardly position-dependent
    text["attention_multiplier"] = 0.25
    vision = dict(
        SMALL_VIT,
        image_size=64,
        patch_size=16,
        out_hidden_size=text["hidden_size"],
        scale_factor=2,
        deepstack_visual_indexes=[0, 1],
        use_fine_route=True,
    )
    config = GraniteDoclingConfig(
        text_config=text,
        vision_config=vision,
        image_token_id=t("<image>"),
        pad_token_id=t("<pad>"),
        tie_word_embeddings=True,
    )
    pre = {
        "crop_to_patches": True,
        "do_convert_rgb": True,
        "do_normalize": True,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": [0.5] * 3,
        "image_processor_type": "GraniteDoclingImageProcessor",
        "image_std": [0.5] * 3,
        "max_patches": 6,
        "min_patches": 1,
        "processor_class": "GraniteDoclingProcessor",
        "resample": 3,
        "rescale_factor": 1 / 255,
        "size": {"height": 64, "width": 64},
    }
    proc = {"image_seq_len": 4, "processor_class": "GraniteDoclingProcessor"}
    gen = {"bos_token_id": t("<|end_of_text|>"), "eos_token_id": t("<|end_of_text|>")}
    return Recipe(config, "AutoModelForImageTextToText", gen, pre, proc)


FAMILY_SPECS = (
    Family(
        "granite_vision",
        TokSpec((), _GRANITE_TAIL, _GRANITE_ROLES, _GRANITE_TEMPLATE),
        _recipe_granite_vision,
        "<image>",
        "<image>",
    ),
    Family(
        "granite4_vision",
        TokSpec((), _GRANITE_TAIL, _GRANITE_ROLES, _GRANITE_TEMPLATE),
        _recipe_granite4_vision,
        "<image>",
        "<image>",
    ),
    Family(
        "granite_docling",
        TokSpec(
            (),
            (*_GRANITE_TAIL, "<fake_token_around_image>", "<global-img>", *ROW_COL),
            {**_GRANITE_ROLES, "image_token": "<image>"},
            _GRANITE_TEMPLATE,
        ),
        _recipe_granite_docling,
        "<image>",
        "<image>",
    ),
)
