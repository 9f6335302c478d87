"""Tiny random Hugging Face model folders: the default model, and the checkpoints of tests and
benchmarks.

Every family (Qwen2-VL, LLaVA, Gemma 3, InternVL, ... and the text-only Qwen2 and Llama) is
one ``Family`` spec in a module of this package, registered in ``registry.REGISTRY``.
``build_tiny_model(family, out_dir)`` writes a standard HF checkout with random float32 weights,
deterministically from ``seed``; ``tiny_model_path(family)`` builds it once into the cache.
This package is a leaf: it uses transformers, tokenizers and torch only, nothing of sglang.srt.

CLI: ``python -m sglang.tiny_models [--family F] [--out DIR] [--seed S] [--size S]``.
"""

from sglang.tiny_models.build import (
    RECIPE_VERSION,
    SIZES,
    build_tiny_model,
    build_tokenizer,
    main,
    tiny_model_path,
)
from sglang.tiny_models.common import Family
from sglang.tiny_models.registry import (
    BASE_VLM_FAMILIES,
    DEFAULT_FAMILY,
    EXTRA_VLM_FAMILIES,
    FAMILIES,
    HYBRID_VLM_FAMILIES,
    IMAGE_PLACEHOLDER,
    IMAGE_TOKEN,
    REGISTRY,
    SMALL_FAMILIES,
    TEXT_FAMILIES,
    VIDEO_FAMILIES,
    VLM_FAMILIES,
)

__all__ = [
    "BASE_VLM_FAMILIES",
    "DEFAULT_FAMILY",
    "EXTRA_VLM_FAMILIES",
    "FAMILIES",
    "HYBRID_VLM_FAMILIES",
    "IMAGE_PLACEHOLDER",
    "IMAGE_TOKEN",
    "RECIPE_VERSION",
    "REGISTRY",
    "SIZES",
    "SMALL_FAMILIES",
    "TEXT_FAMILIES",
    "VIDEO_FAMILIES",
    "VLM_FAMILIES",
    "Family",
    "build_tiny_model",
    "build_tokenizer",
    "main",
    "tiny_model_path",
]
