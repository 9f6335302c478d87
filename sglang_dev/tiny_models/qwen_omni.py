"""Qwen2.5-Omni and Qwen3-Omni thinkers (images only): Qwen-VL towers, audio towers unserved."""

from __future__ import annotations

from typing import Any

from sglang_dev.tiny_models.common import (
    QWEN3_ROPE,
    QWEN3_VISION,
    QWEN_ROLES,
    QWEN_SPECIALS,
    QWEN_VISION,
    Family,
    Recipe,
    TokSpec,
    chatml_template,
    qwen_generation,
    qwen_preprocessor,
    qwen_text,
)

# Qwen2.5-Omni thinker (Qwen/Qwen2.5-Omni-7B's thinker, transformers qwen2_5_omni_thinker), images
# only: a Qwen2.5-VL tower and grid, M-RoPE; its audio tower is built but not served ---------------
_OMNI_IMAGE = "<|vision_bos|><|IMAGE|><|vision_eos|>"
_OMNI_TAIL = (
    *QWEN_SPECIALS, "<|IMAGE|>", "<|AUDIO|>", "<|VIDEO|>", "<|vision_bos|>", "<|vision_eos|>",
    "<|audio_bos|>", "<|audio_eos|>",
)  # fmt: skip
_OMNI_ROLES = {
    **QWEN_ROLES,
    "image_token": "<|IMAGE|>",
    "audio_token": "<|AUDIO|>",
    "video_token": "<|VIDEO|>",
    "vision_bos_token": "<|vision_bos|>",
    "vision_eos_token": "<|vision_eos|>",
    "audio_bos_token": "<|audio_bos|>",
    "audio_eos_token": "<|audio_eos|>",
}


def _recipe_qwen2_5_omni_thinker(tok: Any, vocab: int) -> Recipe:
    from transformers import Qwen2_5OmniThinkerConfig

    t = tok.convert_tokens_to_ids
    rope = {"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [4, 6, 6]}
    text = qwen_text(tok, vocab, model_type="qwen2_5_omni_text", rope_parameters=rope)
    vision = dict(
        QWEN_VISION,
        hidden_size=64,
        intermediate_size=128,
        out_hidden_size=text["hidden_size"],
        patch_size=14,
        window_size=56,
        fullatt_block_indexes=[1],
    )
    audio = {
        "num_mel_bins": 16,
        "encoder_layers": 1,
        "encoder_attention_heads": 2,
        "encoder_ffn_dim": 64,
        "d_model": 32,
        "output_dim": text["hidden_size"],
        "max_source_positions": 100,
        "n_window": 10,
    }
    config = Qwen2_5OmniThinkerConfig(
        text_config=text,
        vision_config=vision,
        audio_config=audio,
        image_token_index=t("<|IMAGE|>"),
        audio_token_index=t("<|AUDIO|>"),
        video_token_index=t("<|VIDEO|>"),
        audio_start_token_id=t("<|audio_bos|>"),
        audio_end_token_id=t("<|audio_eos|>"),
        user_token_id=t("<|im_start|>"),
        vision_start_token_id=t("<|vision_bos|>"),  # read by get_rope_index
        vision_end_token_id=t("<|vision_eos|>"),
    )
    pre = qwen_preprocessor(14, "Qwen2_5OmniProcessor", "Qwen2VLImageProcessor", legacy=False)
    return Recipe(config, "AutoModelForImageTextToText", qwen_generation(tok), pre)


# Qwen3-Omni thinker (transformers qwen3_omni_moe_thinker), images only: a Qwen3-VL-style tower
# (deepstack), an MoE LM, M-RoPE; its audio tower is built but not served -----------------------
def _recipe_qwen3_omni_moe_thinker(tok: Any, vocab: int) -> Recipe:
    from transformers import Qwen3OmniMoeThinkerConfig

    t = tok.convert_tokens_to_ids
    text = qwen_text(
        tok,
        vocab,
        model_type="qwen3_omni_moe_text",
        head_dim=32,
        rope_parameters=QWEN3_ROPE,
        # both experts taken: with 4, a router near-tie flips when the prompt shares its batch
        # (test_bf16's batch: 0.2 nats at one position, 14x HF's bfloat16 noise; 0 alone)
        num_experts=2,
        num_experts_per_tok=2,
        moe_intermediate_size=64,
        decoder_sparse_step=1,
    )
    vision = dict(QWEN3_VISION, out_hidden_size=text["hidden_size"])
    audio = {
        "num_mel_bins": 16,
        "encoder_layers": 1,
        "encoder_attention_heads": 2,
        "encoder_ffn_dim": 64,
        "d_model": 32,
        "output_dim": text["hidden_size"],
        "max_source_positions": 100,
        "n_window": 10,
        "n_window_infer": 40,
        "conv_chunksize": 50,
        "downsample_hidden_size": 16,
    }
    config = Qwen3OmniMoeThinkerConfig(
        text_config=text,
        vision_config=vision,
        audio_config=audio,
        image_token_id=t("<|IMAGE|>"),
        audio_token_id=t("<|AUDIO|>"),
        video_token_id=t("<|VIDEO|>"),
        audio_start_token_id=t("<|audio_bos|>"),
        user_token_id=t("<|im_start|>"),
        vision_start_token_id=t("<|vision_bos|>"),  # read by get_rope_index
        vision_end_token_id=t("<|vision_eos|>"),
    )
    pre = qwen_preprocessor(16, "Qwen3OmniMoeProcessor", "Qwen2VLImageProcessor", legacy=False)
    return Recipe(config, "AutoModelForImageTextToText", qwen_generation(tok), pre)


FAMILY_SPECS = (
    Family(
        "qwen2_5_omni_thinker",
        TokSpec((), _OMNI_TAIL, _OMNI_ROLES, chatml_template(_OMNI_IMAGE)),
        _recipe_qwen2_5_omni_thinker,
        _OMNI_IMAGE,
        "<|IMAGE|>",
    ),
    Family(
        "qwen3_omni_moe_thinker",
        TokSpec((), _OMNI_TAIL, _OMNI_ROLES, chatml_template(_OMNI_IMAGE, None)),
        _recipe_qwen3_omni_moe_thinker,
        _OMNI_IMAGE,
        "<|IMAGE|>",
    ),
)
