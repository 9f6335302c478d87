"""bfloat16 against HF running the same checkpoint in bfloat16.

Half precision is not token-exact (the engine reduces in another order than HF: chunks, the KV
pool, its attention), so the contract is on the prompt's logprobs. The bound is the noise that
bfloat16 itself brings, measured on the same model, prompt and positions: HF in bfloat16 against
HF in float32. The engine in bfloat16 and HF in bfloat16 are two roundings of one float32
computation, each about that far from it, so they may differ by up to about twice the noise:
the largest difference stays within ``MAX_FACTOR`` times the largest noise and the mean within
``MEAN_FACTOR`` times the mean noise (measured on the tiny models: at most 1.22x and 0.94x). A
real error moves the logprobs past that: one image's embedding dropped gives 3x-400x the mean
noise in every family, one chunk's positions shifted by one 1.7x-12x except where a tiny random
model hardly depends on positions (see ``POSITION_BLIND``).
"""

from __future__ import annotations

import functools
import json
import shutil
from pathlib import Path

import pytest
import torch
import transformers
from conftest import (
    ALL_VLM_FAMILIES,
    HF_SKIPS_LOGITS_SCALING,
    hf_inputs,
    load_hf_model,
    make_image,
    model_dir,
    placeholder,
)

import sglang
from sglang.srt.model_executor.dtypes import checkpoint_dtype, resolve_dtype
from sglang.srt.model_executor.model_runner import ModelRunner
from sglang.srt.multimodal.embedder import MultimodalEmbedder
from sglang.srt.multimodal.hf_processor import load_hf_processor

MAX_FACTOR = 2.0
MEAN_FACTOR = 1.5
ONE_TOKEN = {"temperature": 0, "max_new_tokens": 1}
CHUNK = 7  # cuts through every family's images (Gemma3's are kept whole by the scheduler)


def _prompt(family: str) -> tuple[str, list]:
    ph = placeholder(family)
    return f"First {ph} then {ph} compare the two in a few words.", [
        make_image(11, 48, 48),
        make_image(12, 96, 40),
    ]


@functools.cache
def _hf_model(family: str, dtype: torch.dtype):
    return load_hf_model(transformers.AutoModelForImageTextToText, model_dir(family), dtype)


@functools.cache
def _hf_logprobs(family: str, dtype: torch.dtype) -> torch.Tensor:
    """log P(token p | tokens < p) for p >= 1 of the two-image prompt, from HF in ``dtype``."""
    prompt, images = _prompt(family)
    processor = load_hf_processor(model_dir(family))
    inputs = hf_inputs(processor, prompt, images)  # one sample
    inputs = {k: v.to(dtype) if v.is_floating_point() else v for k, v in inputs.items()}
    model = _hf_model(family, dtype)
    with torch.no_grad():
        logits = model(**inputs).logits[0].float()
    if family in HF_SKIPS_LOGITS_SCALING:  # the engine applies the LM head's scaling
        text_config = model.config.get_text_config()
        logits = logits / (
            getattr(text_config, "logits_scaling", None) or 1 / text_config.logit_scale
        )
    ids = inputs["input_ids"][0]
    return torch.log_softmax(logits, -1)[:-1].gather(1, ids[1:, None])[:, 0]


@functools.cache
def _engine(family: str, chunk: int) -> sglang.Engine:
    return sglang.Engine(model_path=model_dir(family), dtype="bfloat16", chunked_prefill_size=chunk)


def _engine_logprobs(out: dict, start: int = 0) -> torch.Tensor:
    """The prompt logprobs of positions max(start, 1).. from an engine output."""
    entries = out["meta_info"]["input_token_logprobs"]
    return torch.tensor([lp for lp, _, _ in entries[1 if start == 0 else 0 :]])


def _gap(family: str, got: torch.Tensor, start: int = 1) -> float:
    """How far the engine's logprobs of positions ``start``.. are from HF's in bfloat16, in units
    of the bound: within the bound when at most 1."""
    bf16 = _hf_logprobs(family, torch.bfloat16)[start - 1 :]
    noise = (bf16 - _hf_logprobs(family, torch.float32)[start - 1 :]).abs()
    assert got.shape == bf16.shape and noise.max() > 0  # bfloat16 is really measured
    gap = (got - bf16).abs()
    return max(gap.max() / (MAX_FACTOR * noise.max()), gap.mean() / (MEAN_FACTOR * noise.mean()))


def _generate(engine: sglang.Engine, family: str, start: int = 0) -> dict:
    prompt, images = _prompt(family)
    return engine.generate(
        prompt, ONE_TOKEN, image_data=images, return_logprob=True, logprob_start_len=start
    )


@pytest.mark.parametrize("family", ALL_VLM_FAMILIES)
def test_bf16_prompt_logprobs_within_noise_of_hf(family: str) -> None:
    """Whole prompt and chunks cutting through images; a cached prefix (the second run resumes
    from the radix cache up to the logprob start); two requests in one batch."""
    whole = _engine(family, -1)
    assert whole.runner.dtype == torch.bfloat16 and whole.runner.kv_pool.dtype == torch.bfloat16
    assert _gap(family, _engine_logprobs(_generate(whole, family))) <= 1

    chunked = _engine(family, CHUNK)
    first = _generate(chunked, family)
    assert _gap(family, _engine_logprobs(first)) <= 1
    start = first["meta_info"]["prompt_tokens"] // 2
    again = _generate(chunked, family, start)
    assert 0 < again["meta_info"]["cached_tokens"] <= start  # hybrids: at a state snapshot
    assert _gap(family, _engine_logprobs(again, start), start) <= 1

    prompt, images = _prompt(family)
    text = "Only text in this request, a little longer than the others are."
    outs = chunked.generate(
        [text, prompt],
        ONE_TOKEN,
        image_data=[[], images],
        return_logprob=True,
        logprob_start_len=0,
    )
    assert _gap(family, _engine_logprobs(outs[1])) <= 1
    chunked.scheduler.check_integrity()


# Tiny random models on which a one-position shift of a chunk moves logprobs less than bfloat16
# noise: Granite LMs' attention multiplier keeps attention near uniform, Qwen3.5's 3 of 4 layers
# are linear attention (no positions; MiniCPM-V 4.6 and 4.7 have the same tiny Qwen3.5 LM:
# 0.11x and 0.17x the bound, and 4.7's canvas M-RoPE is checked against HF in test_qwen3_5).
# PaliGemma's prompt is never chunked, and shifting the second half of the tiny model's prompt by
# three positions stays at 0.8x the bound. The dropped-image test covers them.
POSITION_BLIND = (
    "granite_vision",
    "granite4_vision",
    "qwen3_5",
    "qwen3_5_moe",
    "paligemma",
    "minicpmv4_6",
    "minicpmv4_7",
)


@pytest.mark.parametrize("family", ALL_VLM_FAMILIES)
def test_bf16_bound_catches_a_dropped_image(family: str, monkeypatch) -> None:
    engine = sglang.Engine(model_path=model_dir(family), dtype="bfloat16", chunked_prefill_size=-1)
    original = MultimodalEmbedder._get_chunked_embedding_by_item

    def drop_last_image(self, *args):
        return original(self, *args)[:-1]

    monkeypatch.setattr(MultimodalEmbedder, "_get_chunked_embedding_by_item", drop_last_image)
    assert _gap(family, _engine_logprobs(_generate(engine, family))) > 1


@pytest.mark.parametrize("family", [f for f in ALL_VLM_FAMILIES if f not in POSITION_BLIND])
def test_bf16_bound_catches_a_chunk_with_shifted_positions(family: str, monkeypatch) -> None:
    engine = sglang.Engine(model_path=model_dir(family), dtype="bfloat16", chunked_prefill_size=16)
    original = ModelRunner.forward
    calls = []

    def shift_second_chunk(self, batch):
        calls.append(batch.is_decode)
        if len(calls) == 2 and not batch.is_decode:
            batch.positions = batch.positions + 1
        return original(self, batch)

    monkeypatch.setattr(ModelRunner, "forward", shift_second_chunk)
    assert _gap(family, _engine_logprobs(_generate(engine, family))) > 1


def _with_declared_dtype(family: str, tmp_path: Path, declared: str) -> Path:
    folder = tmp_path / f"{family}-{declared}"
    shutil.copytree(model_dir(family), folder)
    config = json.loads((folder / "config.json").read_text())
    config.pop("dtype", None)
    config["torch_dtype"] = declared  # the older name, still read
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_auto_dtype_follows_checkpoint_and_cpu(tmp_path: Path, monkeypatch) -> None:
    import sglang.srt.model_executor.dtypes as dtypes

    folder = _with_declared_dtype("qwen2_5_vl", tmp_path, "bfloat16")
    config = transformers.AutoConfig.from_pretrained(folder)
    assert checkpoint_dtype(config) == torch.bfloat16
    for isa, want in (
        ("amx", torch.bfloat16),
        ("avx512_bf16", torch.bfloat16),
        (None, torch.float32),
    ):
        monkeypatch.setattr(dtypes, "cpu_bfloat16_isa", lambda isa=isa: isa)
        choice = resolve_dtype("auto", config, "cpu")
        assert choice.dtype == want and choice.fell_back == (isa is None)
        assert (isa or "no native bfloat16") in choice.reason
    assert resolve_dtype("float16", config, "cpu").dtype == torch.bfloat16
    assert resolve_dtype("float32", config, "cpu").dtype == torch.float32
    # A float32 checkpoint is downcast as SGLang and vLLM downcast it; float32 only on request.
    float32_config = transformers.AutoConfig.from_pretrained(model_dir("qwen2_5_vl"))
    for isa, want in (("amx", torch.bfloat16), (None, torch.float32)):
        monkeypatch.setattr(dtypes, "cpu_bfloat16_isa", lambda isa=isa: isa)
        choice = resolve_dtype("auto", float32_config, "cpu")
        assert (choice.dtype, choice.fell_back) == (want, False)
        assert "declares float32" in choice.reason
    assert resolve_dtype("float32", float32_config, "cpu").dtype == torch.float32

    monkeypatch.setattr(dtypes, "cpu_bfloat16_isa", lambda: "avx512_bf16")
    engine = sglang.Engine(model_path=str(folder))
    info = engine.get_server_info()
    assert (info["dtype"], info["kv_cache_dtype"]) == ("bfloat16", "bfloat16")
    assert engine.runner.model.dtype == torch.bfloat16
    assert engine.runner.kv_pool.k_buffer[0].dtype == torch.bfloat16
    prompt, images = _prompt("qwen2_5_vl")
    engine.generate(prompt, ONE_TOKEN, image_data=images)
    entry = next(iter(engine.runner.embedder.cache._entries.values()))
    assert entry.embedding.dtype == torch.bfloat16  # the embedding cache holds bfloat16 rows


def test_unknown_dtypes_are_refused() -> None:
    with pytest.raises(ValueError, match="dtype must be auto or one of"):
        sglang.Engine(model_path=model_dir("qwen2_5_vl"), dtype="int3")
    with pytest.raises(ValueError, match="kv_cache_dtype must be auto or one of"):
        sglang.Engine(dtype="float32", model_path=model_dir("qwen2_5_vl"), kv_cache_dtype="fp4")
