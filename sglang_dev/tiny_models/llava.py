"""LLaVA 1.5 (llava-hf/llava-1.5-*-hf) and VipLlava; the LLaVA text and CLIP tower pieces that
the other LLaVA-style families share."""

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

LLAVA_HEAD = ("<unk>", "<s>", "</s>")
LLAVA_ROLES = {"unk_token": "<unk>", "bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>"}


def clip_vision(**extra: Any) -> dict[str, Any]:
    """A tiny CLIP vision tower (28-px images of 14-px patches) with ``extra`` overrides."""
    base = dict(SMALL_VIT, model_type="clip_vision_model", image_size=28, patch_size=14)
    return {**base, "projection_dim": 64, "hidden_act": "quick_gelu", **extra}


def llava_text(tok: Any, vocab: int, model_type: str, **extra: Any) -> dict[str, Any]:
    """A ``model_type`` text config with LLaVA's <s> / </s> / <pad> token ids."""
    t = tok.convert_tokens_to_ids
    return dict(
        TEXT,
        model_type=model_type,
        vocab_size=vocab,
        bos_token_id=t("<s>"),
        eos_token_id=t("</s>"),
        pad_token_id=t("<pad>"),
        rms_norm_eps=1e-5,
        **extra,
    )


def llava_generation(tok: Any) -> dict[str, Any]:
    """generation_config.json of the LLaVA-style families (<s> / </s> / <pad>)."""
    t = tok.convert_tokens_to_ids
    return {"bos_token_id": t("<s>"), "eos_token_id": t("</s>"), "pad_token_id": t("<pad>")}


_LLAVA_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message['role'] != 'system' -%}{{- message['role'].upper() + ': ' -}}{%- endif -%}"
    "{%- if message['content'] is string -%}{{- message['content'] + ' ' -}}"
    "{%- else -%}"
    "{%- for part in message['content'] -%}"
    "{%- if part['type'] in ('image', 'image_url') -%}{{- '<image>\\n' -}}{%- endif -%}"
    "{%- endfor -%}"
    "{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'text' -%}{{- part['text'] + ' ' -}}{%- endif -%}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- 'ASSISTANT:' -}}{%- endif -%}"
)


def _recipe_llava(tok: Any, vocab: int) -> Recipe:
    from transformers import LlavaConfig

    t = tok.convert_tokens_to_ids
    text = dict(
        TEXT,
        model_type="llama",
        vocab_size=vocab,
        bos_token_id=t("<s>"),
        eos_token_id=t("</s>"),
        pad_token_id=t("<pad>"),
        rms_norm_eps=1e-5,
    )
    vision = dict(
        model_type="clip_vision_model",
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        image_size=56,
        patch_size=14,
        projection_dim=64,
        hidden_act="quick_gelu",
    )
    config = LlavaConfig(
        text_config=text,
        vision_config=vision,
        image_token_index=t("<image>"),
        image_seq_length=16,
        vision_feature_layer=-2,
        vision_feature_select_strategy="default",
        pad_token_id=t("<pad>"),
    )
    pre = {
        "crop_size": {"height": 56, "width": 56},
        "do_center_crop": True,
        "do_convert_rgb": True,
        "do_normalize": True,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": CLIP_MEAN,
        "image_processor_type": "CLIPImageProcessor",
        "image_std": CLIP_STD,
        "processor_class": "LlavaProcessor",
        "resample": 3,
        "rescale_factor": 1 / 255,
        "size": {"shortest_edge": 56},
    }
    proc = {
        "image_token": "<image>",
        "num_additional_image_tokens": 1,
        "patch_size": 14,
        "processor_class": "LlavaProcessor",
        "vision_feature_select_strategy": "default",
    }
    gen = {"bos_token_id": t("<s>"), "eos_token_id": t("</s>"), "pad_token_id": t("<pad>")}
    return Recipe(config, "AutoModelForImageTextToText", gen, pre, proc)


# VipLlava (llava-hf/vip-llava-7b-hf): LLaVA 1.5 with several CLIP layers concatenated and a
# layer-normed projector; its "###Human: / ###Assistant:" template --------------------------------
_VIPLLAVA_TEMPLATE = (
    "{{- 'A chat between a curious human and an artificial intelligence assistant. The assistant "
    "gives helpful, detailed, and polite answers to the human\\'s questions.' -}}"
    "{%- for message in messages -%}"
    "{{- '###' + ('Human' if message['role'] == 'user' else 'Assistant') + ': ' -}}"
    + content_template("<image>\\n")
    + "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '###Assistant:' -}}{%- endif -%}"
)


def _recipe_vipllava(tok: Any, vocab: int) -> Recipe:
    from transformers import VipLlavaConfig

    llava = _recipe_llava(tok, vocab)
    data = llava.config.to_dict()
    vision = dict(data["vision_config"], num_hidden_layers=3)
    config = VipLlavaConfig(
        text_config=data["text_config"],
        vision_config=vision,
        image_token_index=data["image_token_index"],
        image_seq_length=16,
        vision_feature_layer=[-2, -3, 1],
    )
    return Recipe(
        config, "AutoModelForImageTextToText", llava.generation, llava.preprocessor, llava.processor
    )


FAMILY_SPECS = (
    Family(
        "llava",
        TokSpec(
            LLAVA_HEAD,
            ("<image>", "<pad>"),
            {**LLAVA_ROLES, "image_token": "<image>"},
            _LLAVA_TEMPLATE,
            add_bos=True,
        ),
        _recipe_llava,
        "<image>",
        "<image>",
        base=True,
    ),
    Family(
        "vipllava",
        TokSpec(
            ("<unk>", "<s>", "</s>"),
            ("<image>", "<pad>"),
            {**LLAVA_ROLES, "image_token": "<image>"},
            _VIPLLAVA_TEMPLATE,
            add_bos=True,
        ),
        _recipe_vipllava,
        "<image>",
        "<image>",
    ),
)
