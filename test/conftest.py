"""Shared fixtures: tiny models built once per session and HF reference generations."""

from __future__ import annotations

import functools
import os
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from PIL import Image

from sglang.srt.multimodal.hf_processor import load_hf_processor
from sglang.testing.tiny_models import IMAGE_PLACEHOLDER, build_tiny_model

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
transformers.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()

VLM_FAMILIES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "llava", "gemma3")
TEXT_FAMILIES = ("qwen2", "llama")
HYBRID_FAMILIES = ("qwen3_5", "qwen3_5_moe")  # linear-attention + full-attention VLMs

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
        if family in VLM_FAMILIES + HYBRID_FAMILIES
        else transformers.AutoModelForCausalLM
    )
    model = cls.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa").eval()
    return model, load_hf_processor(path)


def hf_greedy(
    family: str, prompt: str, images: list[Image.Image], max_new_tokens: int
) -> tuple[list[int], list[float]]:
    """HF ``generate`` greedy ids and the log-probabilities of the chosen tokens."""
    model, processor = _hf(family)
    if images:
        inputs = processor(text=[prompt], images=images, return_tensors="pt")
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
    logprobs = [
        float(torch.log_softmax(step[0].float(), -1)[tok]) for step, tok in zip(out.logits, ids)
    ]
    return ids, logprobs
