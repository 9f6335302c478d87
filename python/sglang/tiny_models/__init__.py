"""Tiny random Hugging Face model folders, built here from a ``Family`` spec: the builder and the
one recipe the engine needs, its default model (``qwen2_5_vl``).

``build_tiny_model(spec, out_dir)`` writes a standard HF checkout with random float32 weights,
deterministically from ``seed``; ``tiny_model_path(spec)`` builds it once into the cache. The
other families' recipes, their registry and the CLI are development tools outside the installed
package (``sglang_dev.tiny_models`` in the repository). This package is a leaf: it uses
transformers, tokenizers and torch only, nothing of sglang.srt.
"""

from sglang.tiny_models.build import (
    RECIPE_VERSION,
    SIZES,
    build_tiny_model,
    build_tokenizer,
    tiny_model_path,
)
from sglang.tiny_models.common import Family


def default_family() -> Family:
    """The spec of the engine's default model (its recipe module is imported on first use)."""
    from sglang.tiny_models.qwen2_5_vl import FAMILY_SPECS

    return FAMILY_SPECS[0]


__all__ = [
    "RECIPE_VERSION",
    "SIZES",
    "Family",
    "build_tiny_model",
    "build_tokenizer",
    "default_family",
    "tiny_model_path",
]
