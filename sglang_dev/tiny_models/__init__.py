"""The tiny families of the tests and benchmarks, by name.

Every family (Qwen2-VL, LLaVA, Gemma 3, InternVL, ... and the text-only Qwen2 and Llama) is
one ``Family`` spec in a module of this package, registered in ``registry.REGISTRY``.
``build_tiny_model(family, out_dir)`` writes a standard HF checkout with random float32 weights,
deterministically from ``seed``; ``tiny_model_path(family)`` builds it once into the cache.
The builder is ``build``, the shared building blocks ``common``. None of this ships: the
engine's embedded default is the trained OCR reader (``sglang/default_model``).

CLI: ``python -m sglang_dev.tiny_models [--family F] [--out DIR] [--seed S] [--size S]``.
"""

from sglang_dev.tiny_models.build import (
    RECIPE_VERSION,
    SIZES,
    build_tiny_model,
    build_tokenizer,
    family_spec,
    main,
    tiny_model_path,
)
from sglang_dev.tiny_models.common import Family
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
