"""DeepSeek-VL, DeepSeek-VL hybrid, DeepSeek-OCR-2 and Janus: DeepSeek's tokens and template."""

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

# DeepSeek-VL (deepseek-community/deepseek-vl-*-chat): 576 (here 4) image tokens per image; the
# hybrid adds a SAM high-resolution tower whose features join in the aligner -------------------
_DEEPSEEK_BOS, _DEEPSEEK_EOS = (
    "<\uff5cbegin\u2581of\u2581sentence\uff5c>",
    "<\uff5cend\u2581of\u2581sentence\uff5c>",
)
_DEEPSEEK_ROLES = {
    "bos_token": _DEEPSEEK_BOS,
    "eos_token": _DEEPSEEK_EOS,
    "pad_token": _DEEPSEEK_EOS,
    "image_token": "<image_placeholder>",
}
_DEEPSEEK_TEMPLATE = (
    "{{- bos_token -}}"
    "{%- for message in messages -%}"
    "{{- message['role'] | capitalize + ': ' -}}"
    + content_template("<image_placeholder>")
    + "{{- '\\n\\n' if message['role'] == 'user' else eos_token -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- 'Assistant:' -}}{%- endif -%}"
)


def _deepseek_text(tok: Any, vocab: int) -> dict[str, Any]:
    t = tok.convert_tokens_to_ids
    return dict(
        TEXT,
        model_type="llama",
        vocab_size=vocab,
        bos_token_id=t(_DEEPSEEK_BOS),
        eos_token_id=t(_DEEPSEEK_EOS),
        pad_token_id=t(_DEEPSEEK_EOS),
        rms_norm_eps=1e-6,
    )


def _deepseek_preprocessor(image_type: str, processor_class: str, **extra: Any) -> dict:
    return {
        "do_convert_rgb": True,
        "do_normalize": True,
        "do_pad": True,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": [0.5] * 3,
        "image_processor_type": image_type,
        "image_std": [0.5] * 3,
        "min_size": 14,
        "processor_class": processor_class,
        "resample": 3,
        "rescale_factor": 1 / 255,
        "size": {"height": 28, "width": 28},
        **extra,
    }


def _deepseek_generation(tok: Any) -> dict[str, Any]:
    t = tok.convert_tokens_to_ids
    return {"bos_token_id": t(_DEEPSEEK_BOS), "eos_token_id": t(_DEEPSEEK_EOS)}


def _recipe_deepseek_vl(tok: Any, vocab: int) -> Recipe:
    from transformers import DeepseekVLConfig

    config = DeepseekVLConfig(
        text_config=_deepseek_text(tok, vocab),
        vision_config=dict(
            SMALL_VIT, model_type="siglip_vision_model", image_size=28, patch_size=14
        ),
        image_token_id=tok.convert_tokens_to_ids("<image_placeholder>"),
    )
    pre = _deepseek_preprocessor("DeepseekVLImageProcessor", "DeepseekVLProcessor")
    proc = {"num_image_tokens": 4, "processor_class": "DeepseekVLProcessor"}
    return Recipe(config, "AutoModelForImageTextToText", _deepseek_generation(tok), pre, proc)


def _recipe_deepseek_vl_hybrid(tok: Any, vocab: int) -> Recipe:
    from transformers import DeepseekVLHybridConfig

    sam = {
        "model_type": "sam_vision_model",
        "hidden_size": 32,
        "output_channels": 16,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "image_size": 64,
        "patch_size": 16,
        "window_size": 2,
        "global_attn_indexes": [1],
        "num_pos_feats": 16,
        "mlp_dim": 64,
    }
    config = DeepseekVLHybridConfig(
        text_config=_deepseek_text(tok, vocab),
        vision_config=dict(
            SMALL_VIT, model_type="siglip_vision_model", image_size=28, patch_size=14
        ),
        high_res_vision_config=sam,
        image_token_id=tok.convert_tokens_to_ids("<image_placeholder>"),
    )
    pre = _deepseek_preprocessor(
        "DeepseekVLHybridImageProcessor",
        "DeepseekVLHybridProcessor",
        high_res_image_mean=CLIP_MEAN,
        high_res_image_std=CLIP_STD,
        high_res_resample=3,
        high_res_size={"height": 64, "width": 64},
    )
    proc = {"num_image_tokens": 4, "processor_class": "DeepseekVLHybridProcessor"}
    return Recipe(config, "AutoModelForImageTextToText", _deepseek_generation(tok), pre, proc)


# DeepSeek-OCR-2 (the DeepSeek-VL2 design): local tiles + a global view + a learned view
# separator, one contiguous run per image; an MoE LM. Its vision tower has fixed learned queries
# (144 per 768-px tile, 256 per 1024-px view), so views keep those token counts at tiny scale:
# a 48-px tile and a 64-px view through a SAM stage with 1-px patches and a 4x downsample.
def _recipe_deepseek_ocr2(tok: Any, vocab: int) -> Recipe:
    from transformers import DeepseekOcr2Config

    text = dict(
        _deepseek_text(tok, vocab),
        model_type="deepseek_ocr2_text",
        num_key_value_heads=4,
        n_routed_experts=4,
        n_shared_experts=1,
        num_experts_per_tok=2,
        moe_intermediate_size=64,
        mlp_layer_types=["dense", "sparse"],
    )
    sam = {  # windowed attention only: a global layer over 64x64 patches costs seconds here
        "hidden_size": 16,
        "output_channels": 16,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "image_size": 64,
        "patch_size": 1,
        "window_size": 8,
        "global_attn_indexes": [],
        "mlp_dim": 32,
        "downsample_channels": [32, 64],
    }
    encoder = {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 1,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 16,
    }
    config = DeepseekOcr2Config(
        text_config=text,
        vision_config={"sam_config": sam, "encoder_config": encoder},
        image_token_id=tok.convert_tokens_to_ids("<image>"),
    )
    pre = _deepseek_preprocessor(
        "DeepseekOcr2ImageProcessor",
        "DeepseekOcr2Processor",
        crop_to_patches=True,
        min_patches=2,
        max_patches=6,
        size={"height": 64, "width": 64},
        tile_size=48,
    )
    del pre["min_size"]
    proc = {"downsample_ratio": 4, "patch_size": 1, "processor_class": "DeepseekOcr2Processor"}
    return Recipe(config, "AutoModelForImageTextToText", _deepseek_generation(tok), pre, proc)


# Janus (deepseek-community/Janus-Pro-1B): DeepSeek-VL's layout (a SigLIP tower and a 2-layer
# aligner into a Llama LM, images padded to one square) plus a VQ image tokenizer and generation
# head, loaded but unused when generating text; <begin_of_image> + run + <end_of_image> ---------
_JANUS_ROLES = {
    **_DEEPSEEK_ROLES,
    "boi_token": "<begin_of_image>",
    "eoi_token": "<end_of_image>",
}
_JANUS_TEMPLATE = (
    "{{- bos_token -}}"
    "{%- for message in messages -%}"
    "{{- '<|' + message['role'] | capitalize + '|>: ' -}}"
    + content_template("<image_placeholder>\\n")
    + "{{- '\\n\\n' if message['role'] == 'user' else eos_token -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|Assistant|>:' -}}{%- endif -%}"
)


def _recipe_janus(tok: Any, vocab: int) -> Recipe:
    from transformers import JanusConfig

    text = _deepseek_text(tok, vocab)
    vision = {
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "image_size": 32,
        "patch_size": 8,
        "projection_dim": text["hidden_size"],
        "num_image_tokens": 16,
    }
    vq = {
        "embed_dim": 8,
        "num_embeddings": 64,
        "latent_channels": 32,  # group norms of 32 groups
        "base_channels": 32,
        "channel_multiplier": [1, 2],
        "num_res_blocks": 1,
        "num_patches": 4,
        "projection_dim": text["hidden_size"],
        "image_token_embed_dim": text["hidden_size"],
    }
    config = JanusConfig(
        text_config=text,
        vision_config=vision,
        vq_config=vq,
        image_token_id=tok.convert_tokens_to_ids("<image_placeholder>"),
    )
    pre = {
        "do_convert_rgb": True,
        "do_normalize": True,
        "do_pad": True,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": CLIP_MEAN,
        "image_processor_type": "JanusImageProcessor",
        "image_std": CLIP_STD,
        "min_size": 8,
        "processor_class": "JanusProcessor",
        "resample": 3,
        "rescale_factor": 1 / 255,
        "size": {"height": 32, "width": 32},
    }
    proc = {"num_image_tokens": 16, "processor_class": "JanusProcessor"}
    return Recipe(config, "AutoModelForImageTextToText", _deepseek_generation(tok), pre, proc)


FAMILY_SPECS = (
    Family(
        "deepseek_vl",
        TokSpec(
            (),
            (_DEEPSEEK_BOS, _DEEPSEEK_EOS, "<image_placeholder>"),
            _DEEPSEEK_ROLES,
            _DEEPSEEK_TEMPLATE,
            add_bos=True,
        ),
        _recipe_deepseek_vl,
        "<image_placeholder>",
        "<image_placeholder>",
    ),
    Family(
        "deepseek_vl_hybrid",
        TokSpec(
            (),
            (_DEEPSEEK_BOS, _DEEPSEEK_EOS, "<image_placeholder>"),
            _DEEPSEEK_ROLES,
            _DEEPSEEK_TEMPLATE,
            add_bos=True,
        ),
        _recipe_deepseek_vl_hybrid,
        "<image_placeholder>",
        "<image_placeholder>",
    ),
    Family(
        "deepseek_ocr2",
        TokSpec(
            (),
            (_DEEPSEEK_BOS, _DEEPSEEK_EOS, "<image>"),
            {**_DEEPSEEK_ROLES, "image_token": "<image>"},
            _DEEPSEEK_TEMPLATE.replace("<image_placeholder>", "<image>\\n"),
            add_bos=True,
        ),
        _recipe_deepseek_ocr2,
        "<image>",
        "<image>",
    ),
    Family(
        "janus",
        TokSpec(
            (),
            (
                _DEEPSEEK_BOS,
                _DEEPSEEK_EOS,
                "<image_placeholder>",
                "<begin_of_image>",
                "<end_of_image>",
                "<|User|>",
                "<|Assistant|>",
            ),  # fmt: skip
            _JANUS_ROLES,
            _JANUS_TEMPLATE,
            add_bos=True,
        ),
        _recipe_janus,
        "<image_placeholder>",
        "<image_placeholder>",
    ),
)
