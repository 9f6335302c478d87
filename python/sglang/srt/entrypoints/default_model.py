"""The model served when no model path is given: a tiny random Qwen2.5-VL.

It is built locally on first use (a byte-level BPE tokenizer trained on a small corpus and seeded
random float32 weights, no model hub or network) by ``sglang.tiny_models`` from its one recipe,
and cached under ``$SGLANG_CACHE_DIR/tiny-models``. Its answers are meaningless; it exists so that
the engine and the server start, and can be tried end to end, offline.
"""

from __future__ import annotations

from pathlib import Path

from sglang.tiny_models import default_family, tiny_model_path


def default_model_path() -> Path:
    """The cached folder of the default model, built on first use."""
    return tiny_model_path(default_family())


def resolve_model_path(model_path: str | None) -> str:
    """``model_path``, or the default model's folder when it is None."""
    if model_path is not None:
        return model_path
    return str(default_model_path())
