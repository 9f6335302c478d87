"""PaliGemma 2: SigLIP + Gemma 2, a prefix-LM without a chat template."""

from __future__ import annotations

from typing import Any

from sglang_dev.tiny_models.common import (
    SMALL_VIT,
    TEXT,
    Family,
    Recipe,
    TokSpec,
)

# PaliGemma 2: SigLIP + Gemma 2; a prefix-LM (images, <bos>, the prompt and a newline attend both
# ways; the answer is causal), positions from 1; no chat template ------------------------------
_PALIGEMMA_HEAD = ("<pad>", "<eos>", "<bos>", "<unk>")
_PALIGEMMA_TAIL = (
    "<image>",
    *(f"<loc{i:0>4}>" for i in range(1024)),
    *(f"<seg{i:0>3}>" for i in range(128)),
)
_PALIGEMMA_ROLES = {
    "pad_token": "<pad>",
    "eos_token": "<eos>",
    "bos_token": "<bos>",
    "unk_token": "<unk>",
    "image_token": "<image>",
}


def _recipe_paligemma(tok: Any, vocab: int) -> Recipe:
    from transformers import PaliGemmaConfig

    t = tok.convert_tokens_to_ids
    text = dict(
        TEXT,
        model_type="gemma2",
        num_hidden_layers=3,
        head_dim=32,
        query_pre_attn_scalar=32,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        sliding_window=16,
        attn_logit_softcapping=50.0,
        final_logit_softcapping=30.0,
        initializer_range=0.02,
        vocab_size=vocab,
        pad_token_id=t("<pad>"),
        eos_token_id=t("<eos>"),
        bos_token_id=t("<bos>"),
    )
    vision = dict(SMALL_VIT, image_size=32, patch_size=8, projection_dim=128)
    config = PaliGemmaConfig(
        text_config=text,
        vision_config=vision,
        image_token_index=t("<image>"),
        projection_dim=128,
        hidden_size=128,
    )
    pre = {
        "image_processor_type": "SiglipImageProcessor",
        "processor_class": "PaliGemmaProcessor",
        "do_convert_rgb": None,
        "do_normalize": True,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
        "image_seq_length": 16,
        "resample": 3,
        "rescale_factor": 1 / 255,
        "size": {"height": 32, "width": 32},
    }
    gen = {"bos_token_id": t("<bos>"), "eos_token_id": t("<eos>"), "pad_token_id": t("<pad>")}
    return Recipe(config, "AutoModelForImageTextToText", gen, pre, None)


FAMILY_SPECS = (
    Family(
        "paligemma",
        TokSpec(_PALIGEMMA_HEAD, _PALIGEMMA_TAIL, _PALIGEMMA_ROLES, ""),
        _recipe_paligemma,
        "<image>",
        "<image>",
    ),
)
