"""EXAONE 4.5: a Qwen2.5-VL-style tower and an EXAONE 4 LM."""

from __future__ import annotations

from typing import Any

from sglang_dev.tiny_models.common import (
    QWEN_VISION,
    TEXT,
    Family,
    Recipe,
    TokSpec,
    content_template,
    qwen_preprocessor,
)

# EXAONE 4.5 (LGAI-EXAONE/EXAONE-4.5-33B): a Qwen2.5-VL-style tower (windowed blocks, grouped KV
# heads) with Qwen's grid layout, an EXAONE 4 LM (3 sliding-window layers to 1 global, plain
# positions); EXAONE's [|role|] ... [|endofturn|] template ---------------------------------------
_EXAONE_TAIL = (
    "[|system|]", "[|user|]", "[|assistant|]", "[|endofturn|]", "<|vision_start|>",
    "<|vision_end|>", "<|image_pad|>", "<|video_pad|>",
)  # fmt: skip
_EXAONE_ROLES = {"bos_token": "[BOS]", "eos_token": "[|endofturn|]", "pad_token": "[PAD]"}
_EXAONE_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '[|' + message['role'] + '|]' -}}"
    + content_template("<|vision_start|><|image_pad|><|vision_end|>")
    + "{{- '[|endofturn|]\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '[|assistant|]' -}}{%- endif -%}"
)


def _recipe_exaone4_5(tok: Any, vocab: int) -> Recipe:
    from transformers import Exaone4_5_Config

    t = tok.convert_tokens_to_ids
    text = dict(
        TEXT,
        model_type="exaone4",
        num_hidden_layers=4,
        head_dim=32,
        sliding_window=16,
        sliding_window_pattern=4,
        vocab_size=vocab,
        bos_token_id=t("[BOS]"),
        eos_token_id=t("[|endofturn|]"),
        pad_token_id=t("[PAD]"),
    )
    vision = dict(
        QWEN_VISION,
        hidden_size=64,
        intermediate_size=128,
        num_key_value_heads=2,
        out_hidden_size=text["hidden_size"],
        patch_size=14,
        window_size=56,
        fullatt_block_indexes=[1],
    )
    config = Exaone4_5_Config(
        text_config=text,
        vision_config=vision,
        image_token_id=t("<|image_pad|>"),
        video_token_id=t("<|video_pad|>"),
    )
    pre = qwen_preprocessor(14, "Exaone4_5_Processor", "Qwen2VLImageProcessor", legacy=False)
    gen = {"bos_token_id": t("[BOS]"), "eos_token_id": t("[|endofturn|]")}
    return Recipe(config, "AutoModelForImageTextToText", gen, pre)


FAMILY_SPECS = (
    Family(
        "exaone4_5",
        TokSpec(("[PAD]", "[BOS]", "[UNK]"), _EXAONE_TAIL, _EXAONE_ROLES, _EXAONE_TEMPLATE),
        _recipe_exaone4_5,
        "<|vision_start|><|image_pad|><|vision_end|>",
        "<|image_pad|>",
    ),
)
