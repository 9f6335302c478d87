"""Shared fixtures: tiny models built once per session and HF reference generations."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from pathlib import Path

# Before torch loads OpenMP: idle workers sleep at once rather than spin, so that the test
# workers and the server processes they start, more threads than the 2 cores, do not slow each
# other down (a server's scheduler inherits it in place of its own short spin).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np
import pytest
import torch
import transformers
from hypothesis import settings
from PIL import Image

from sglang.srt import kernels
from sglang.srt.models.adapters import load_vlm
from sglang.srt.multimodal.hf_processor import load_hf_processor
from sglang_dev.tiny_models import (
    BASE_VLM_FAMILIES,
    EXTRA_VLM_FAMILIES,
    HYBRID_VLM_FAMILIES,
    IMAGE_PLACEHOLDER,
    build_tiny_model,
)

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
transformers.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()

VLM_FAMILIES = BASE_VLM_FAMILIES  # test_parity.py; the others are in test_families.py
HYBRID_FAMILIES = HYBRID_VLM_FAMILIES  # linear-attention + full-attention VLMs (Qwen3.5)
ALL_VLM_FAMILIES = BASE_VLM_FAMILIES + EXTRA_VLM_FAMILIES + HYBRID_FAMILIES
TEXT_FAMILIES = ("qwen2", "llama")
# Granite LMs divide logits by ``logits_scaling`` and Cohere LMs multiply them by ``logit_scale``;
# HF's LLaVA-NeXT and Aya Vision wrappers skip it.
HF_SKIPS_LOGITS_SCALING = ("granite_vision", "aya_vision")
PREFIX_LM_FAMILIES = ("paligemma",)  # the whole prompt attends both ways

# Native kernel tests skip only where no compiler exists; where one does, a kernel that did not
# build fails them (and CI's SGLANG_REQUIRE_CPU_KERNELS=1 makes kernels.load raise at once).
needs_compiler = pytest.mark.skipif(
    kernels.compiler() is None, reason=f"no C++ compiler ({kernels.compiler_name()} not found)"
)


# The files that take most of a run (seconds on 2 cores, Zen 4: benchmarks 262, fleet 248,
# SGLang's kits 226, quantization 200, then 50-80 each), started first: with ``--dist loadfile``
# a worker takes whole files in collection order, and a long file collected last runs alone while
# the other worker idles.
SLOW_FIRST = (
    "test_benchmarks.py",
    "test_fleet.py",
    "test_sglang_conformance.py",
    "test_quantization.py",
    "test_families.py",
    "test_bf16.py",
    "test_hicache_fleet.py",
    "test_ocr_reader.py",
    "test_fail_fast.py",
    "test_router.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The ``SLOW_FIRST`` files first, in that order; each file's tests keep their order."""
    rank = {name: i for i, name in enumerate(SLOW_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


def pytest_sessionstart(session: pytest.Session) -> None:
    """Every kernel the suite loads, built before collection imports the tests, two or more at
    once (one after another they took ~10 minutes of a fresh run on 2 cores), saying on the
    terminal what it builds before it starts (xdist starts its workers after this hook)."""
    if kernels.compiler() is not None and os.environ.get(kernels.DISABLE_ENV, "0") in ("", "0"):
        kernels.prebuild(portable=("linear_quant", "linear_int8dq"), report=_terminal(session))


def _terminal(session: pytest.Session) -> Callable[[str], None] | None:
    """Writes a line where ``pytest -q`` shows it; None in an xdist worker (nobody reads it)."""
    if hasattr(session.config, "workerinput"):
        return None
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None:
        return lambda line: print(f"native kernels: {line}", file=sys.__stderr__, flush=True)

    def write(line: str) -> None:
        reporter.write_line(f"native kernels: {line}")
        reporter.flush()

    return write


# The native GEMM serves CPUs with AVX512-BF16 and no AMX, where a compiler builds it.
NATIVE_GEMM_EXPECTED = (
    kernels.expected_isa("gemm_bf16") == "avx512_bf16"
    and "amx_bf16" not in kernels.cpu_flags()
    and kernels.compiler() is not None
)

# Property tests run examples(n) examples: n in CI, NIGHTLY_FACTOR x n with
# HYPOTHESIS_PROFILE=nightly (tests without their own count take the profile's).
NIGHTLY = os.environ.get("HYPOTHESIS_PROFILE") == "nightly"
NIGHTLY_FACTOR = 10
settings.register_profile("ci", deadline=None)
settings.register_profile("nightly", deadline=None, max_examples=1000)
settings.load_profile("nightly" if NIGHTLY else "ci")


def examples(ci: int) -> int:
    return ci * NIGHTLY_FACTOR if NIGHTLY else ci


_MODEL_ROOT: Path | None = None


@pytest.fixture(scope="session", autouse=True)
def _model_root(tmp_path_factory: pytest.TempPathFactory) -> None:
    global _MODEL_ROOT
    _MODEL_ROOT = tmp_path_factory.mktemp("tiny-models")


@functools.cache
def model_dir(family: str) -> str:
    assert _MODEL_ROOT is not None
    return str(build_tiny_model(family, _MODEL_ROOT / family))


def make_image(seed: int, width: int = 64, height: int = 64) -> Image.Image:
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    return Image.fromarray(pixels)


def placeholder(family: str) -> str:
    return IMAGE_PLACEHOLDER.get(family, "")


@functools.cache
def _hf(family: str):
    path = model_dir(family)
    cls = (
        transformers.AutoModelForImageTextToText
        if family in ALL_VLM_FAMILIES
        else transformers.AutoModelForCausalLM
    )
    return load_hf_model(cls, path, torch.float32), load_hf_processor(path)


def load_hf_model(cls, path: str, dtype: torch.dtype):
    """HF's model with SDPA attention, or eager where the family has none (Gemma 2's
    soft-capped attention in PaliGemma 2)."""
    load = cls.from_pretrained
    if cls is transformers.AutoModelForImageTextToText:  # ShieldGemma 2: its classifier's model
        load = functools.partial(load_vlm, config=transformers.AutoConfig.from_pretrained(path))
    try:
        return load(path, dtype=dtype, attn_implementation="sdpa").eval()
    except ValueError:
        return load(path, dtype=dtype, attn_implementation="eager").eval()


def hf_inputs(processor, prompt: str, images: list[Image.Image]) -> transformers.BatchFeature:
    """HF's processor outputs for one sample (a prompt and its images). ShieldGemma 2's
    ``__call__`` ignores the text and writes one prompt per safety policy itself; the prompt's
    own text goes through the generic ``ProcessorMixin.__call__`` with its placeholder
    expansion (what the engine serves), the token types renamed as its ``__call__`` does.
    GOT-OCR 2 reads nested images as the pages of one image: a sample's images come flat."""
    name = type(processor).__name__
    if name == "GotOcr2Processor":
        return processor(text=[prompt], images=images, return_tensors="pt")
    if name != "ShieldGemma2Processor":
        # Cosmos3 Edge's model needs the token types its processor returns only when asked.
        try:
            names = processor.model_input_names
        except AttributeError:  # Qwen2.5-Omni lists its unbuilt audio and video processors' names
            names = ()
        kwargs = {"return_mm_token_type_ids": True} if "mm_token_type_ids" in names else {}
        return processor(text=[prompt], images=[images], return_tensors="pt", **kwargs)
    inputs = transformers.ProcessorMixin.__call__(
        processor, text=[prompt], images=[images], return_tensors="pt"
    )
    inputs["token_type_ids"] = inputs.pop("mm_token_type_ids")
    return inputs


def greedy_agreement(
    got: list[int], want: list[int], steps: list[torch.Tensor], bound: float
) -> int:
    """Tokens ``got`` shares with the reference's greedy ``want``. Where they part, the
    reference's own log-probabilities of the two tokens at that step (``steps``) must lie within
    ``bound`` of each other: only a near-tie that rounding can flip may change a greedy choice."""
    for n, (mine, theirs, step) in enumerate(zip(got, want, steps)):
        if mine != theirs:
            margin = float(step[theirs] - step[mine])
            assert margin <= bound, (
                f"token {n}: {mine}, margin {margin:.4f} to the reference's {theirs}"
            )
            return n
    assert len(got) == len(want)
    return len(got)


def hf_greedy(
    family: str, prompt: str, images: list[Image.Image], max_new_tokens: int
) -> tuple[list[int], list[float]]:
    """HF ``generate`` greedy ids and the log-probabilities of the chosen tokens. Where HF's
    wrapper skips the LM head's own scaling, log-probs are taken after it (the engine applies
    it as the LM's causal-LM head does); greedy ids do not depend on it."""
    model, processor = _hf(family)
    if images:
        # One sample and its images: LLaVA-OneVision encodes an image differently when its
        # prompt has others (a flat list would make each image a sample of its own).
        inputs = hf_inputs(processor, prompt, images)
    elif family in PREFIX_LM_FAMILIES:
        # HF's processor refuses a prompt without images; its layout for one with none: <bos>,
        # the prompt, a newline, all of it the bidirectional prefix.
        tokenizer = processor.tokenizer
        text = f"{tokenizer.bos_token}{prompt}\n"
        inputs = tokenizer([text], return_tensors="pt", add_special_tokens=False)
        inputs["token_type_ids"] = torch.zeros_like(inputs["input_ids"])
    else:
        tokenizer = getattr(processor, "tokenizer", processor)
        inputs = tokenizer([prompt], return_tensors="pt")
    with torch.no_grad():
        out = model.generate(
            **inputs,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
        )
    ids = out.sequences[0, inputs["input_ids"].shape[1] :].tolist()
    scaling = 1.0
    if family in HF_SKIPS_LOGITS_SCALING:
        text_config = model.config.get_text_config()
        scaling = getattr(text_config, "logits_scaling", None) or 1 / text_config.logit_scale
    logprobs = [
        float(torch.log_softmax(step[0].float() / scaling, -1)[tok])
        for step, tok in zip(out.logits, ids)
    ]
    return ids, logprobs
