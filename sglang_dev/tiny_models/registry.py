"""The one registry of tiny families: name -> ``Family``, filled from the family modules.

Every tuple the tests and benchmarks use is derived from the ``Family`` attributes: VLMs (those
with an image placeholder) in three groups, base, extra and hybrid, then the text-only LMs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from types import ModuleType

from sglang_dev.tiny_models import (
    aria,
    aya_vision,
    cosmos3,
    deepseek_vl,
    exaone4_5,
    gemma3,
    gemma4,
    glm4v,
    got_ocr2,
    granite_vision,
    hunyuan_vl,
    hyperclovax_vision_v2,
    idefics,
    internvl,
    lfm3_vl,
    lighton_ocr,
    llama,
    llava,
    llava_next,
    minicpm_v,
    mistral3,
    ovis2,
    paddleocr_vl,
    paligemma,
    qwen2,
    qwen2_vl,
    qwen3_5,
    qwen3_vl,
    qwen_omni,
    video_llama_3,
    video_llava,
)
from sglang_dev.tiny_models.common import Family

# Family modules in registration order (a module's FAMILY_SPECS keep their own order).
_MODULES = (
    qwen2_vl,  # and qwen2_5_vl
    qwen3_vl,
    llava,
    gemma3,
    internvl,
    llava_next,
    granite_vision,
    mistral3,
    idefics,
    glm4v,
    deepseek_vl,
    aya_vision,
    ovis2,
    gemma4,
    paligemma,
    lighton_ocr,
    got_ocr2,
    video_llava,
    paddleocr_vl,
    aria,
    exaone4_5,
    hunyuan_vl,
    cosmos3,
    video_llama_3,
    hyperclovax_vision_v2,
    qwen_omni,
    qwen3_5,
    lfm3_vl,
    minicpm_v,
    qwen2,
    llama,
)


def _collect(modules: Iterable[ModuleType]) -> dict[str, Family]:
    registry: dict[str, Family] = {}
    for module in modules:
        for family in module.FAMILY_SPECS:
            if family.name in registry:
                raise ValueError(f"family {family.name!r} is registered twice")
            if family.small_vision is not None and not family.vlm:
                raise ValueError(f"family {family.name!r}: a small size needs a vision tower")
            registry[family.name] = family
    return registry


REGISTRY: dict[str, Family] = _collect(_MODULES)


def _names(keep: Callable[[Family], bool]) -> tuple[str, ...]:
    return tuple(name for name, family in REGISTRY.items() if keep(family))


# VLMs checked at parity with HF in test_parity.py; the others: test_families.py
BASE_VLM_FAMILIES = _names(lambda f: f.vlm and f.base)
HYBRID_VLM_FAMILIES = _names(lambda f: f.vlm and f.hybrid)  # linear attention: test_qwen3_5.py
EXTRA_VLM_FAMILIES = _names(lambda f: f.vlm and not f.base and not f.hybrid)
VLM_FAMILIES = BASE_VLM_FAMILIES + EXTRA_VLM_FAMILIES + HYBRID_VLM_FAMILIES
TEXT_FAMILIES = _names(lambda f: not f.vlm)
FAMILIES = VLM_FAMILIES + TEXT_FAMILIES
SMALL_FAMILIES = _names(lambda f: f.small_vision is not None)  # size "small" too
VIDEO_FAMILIES = _names(lambda f: f.video)  # video_preprocessor_config.json
DEFAULT_FAMILY = "qwen2_5_vl"  # the tests' and benchmarks' default family

# What a prompt writes for one image, and the token whose embedding rows are an image's (the
# model's image_token_id), per VLM family.
IMAGE_PLACEHOLDER: dict[str, str] = {n: REGISTRY[n].placeholder or "" for n in VLM_FAMILIES}
IMAGE_TOKEN: dict[str, str] = {n: REGISTRY[n].image_token or "" for n in VLM_FAMILIES}
