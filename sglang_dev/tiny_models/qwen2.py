"""Qwen2: the text-only Qwen LM (tied embeddings), ChatML."""

from __future__ import annotations

from typing import Any

from sglang_dev.tiny_models.common import (
    QWEN_ROLES,
    QWEN_SPECIALS,
    QWEN_SYSTEM,
    Family,
    Recipe,
    TokSpec,
    qwen_generation,
    qwen_template,
    qwen_text,
)


def _recipe_qwen2(tok: Any, vocab: int) -> Recipe:
    from transformers import Qwen2Config

    config = Qwen2Config(**qwen_text(tok, vocab), tie_word_embeddings=True)
    return Recipe(config, "AutoModelForCausalLM", qwen_generation(tok))


FAMILY_SPECS = (
    Family(
        "qwen2", TokSpec((), QWEN_SPECIALS, QWEN_ROLES, qwen_template(QWEN_SYSTEM)), _recipe_qwen2
    ),
)
