"""The tiny families of the tests and benchmarks, by name.

Every family (Qwen2-VL, LLaVA, Gemma 3, InternVL, ... and the text-only Qwen2 and Llama) is
one ``Family`` spec in a module of this package, registered in ``registry.REGISTRY``.
``build_tiny_model(family, out_dir)`` writes a standard HF checkout with random float32 weights,
deterministically from ``seed``; ``tiny_model_path(family)`` builds it once into the cache.
The builder and the default model's recipe are ``sglang.tiny_models`` (shipped); the other recipes
live here.

CLI: ``python -m sglang_dev.tiny_models [--family F] [--out DIR] [--seed S] [--size S]``.
"""

from sglang.tiny_models import RECIPE_VERSION, SIZES, Family
from sglang_dev.tiny_models.build import (
    build_tiny_model,
    build_tokenizer,
    family_spec,
    main,
    tiny_model_path,
)
from sglang_dev.tiny_models.registry import (
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
    "family_spec",
    "main",
    "tiny_model_path",
]
