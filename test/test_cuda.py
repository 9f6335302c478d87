"""The CUDA path on an NVIDIA GPU: greedy parity with HF running on the same GPU, bfloat16 within
HF's own half-precision noise, the embedding cache's pinned non-blocking moves, the towers' flash
attention and sampling on device tensors.

Every test needs a CUDA device and is skipped without one (CI has none);
``scripts/gpu_check.sh`` runs this module on a GPU machine. With ``SGLANG_GPU_REPORT`` set, the
measurements behind the asserts (token agreement, logprob gaps in units of the bound, copy and
sleep times) are written there as JSON.
"""

from __future__ import annotations

import functools
import json
import os
import time
import types
from typing import Any

import numpy as np
import pytest
import torch
import transformers
from conftest import (
    greedy_agreement,
    hf_inputs,
    load_hf_model,
    make_image,
    model_dir,
    placeholder,
)

import sglang
from sglang.srt.models import fast_vision
from sglang.srt.multimodal import embedder as embedder_module
from sglang.srt.multimodal.embedder import MultimodalEmbedder, _move_items_to_device
from sglang.srt.multimodal.hf_processor import load_hf_processor

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

DEVICE = "cuda"
FAMILIES = ("qwen2_5_vl", "qwen3_vl", "gemma3")
MAX_NEW = 8
GREEDY = {"temperature": 0, "max_new_tokens": MAX_NEW}
CHUNK = 7  # cuts through every image (Gemma 3's are kept whole by the scheduler)
KV_TOKENS = 4096  # each engine's pool: many engines share the GPU in one test process
# As in test_bf16: the engine and HF in bfloat16 are two roundings of one float32 computation.
MAX_FACTOR = 2.0
MEAN_FACTOR = 1.5

# HF runs the patch embeddings' convolutions through cuDNN, which takes TF32 by default; the
# float32 contract is against full float32.
torch.backends.cudnn.allow_tf32 = False
torch.backends.cuda.matmul.allow_tf32 = False

REPORT: dict[str, Any] = {}


@pytest.fixture(scope="module", autouse=True)
def _write_report():
    yield
    path = os.environ.get("SGLANG_GPU_REPORT")
    if path and REPORT:
        REPORT["device"] = torch.cuda.get_device_name(0)
        with open(path, "w") as f:
            json.dump(REPORT, f, indent=2)


def _cases(family: str) -> list[tuple[str, list]]:
    ph = placeholder(family)
    return [
        (f"Describe {ph} in a few words.", [make_image(1, 64, 64)]),
        (f"First {ph} then {ph} compare them.", [make_image(2, 96, 64), make_image(3, 64, 128)]),
    ]


TEXT_ONLY = "Only text in this request, a little longer than the others are."


def _engine(family: str, dtype: str, chunk: int) -> sglang.Engine:
    return sglang.Engine(
        model_path=model_dir(family),
        dtype=dtype,
        device=DEVICE,
        chunked_prefill_size=chunk,
        max_total_tokens=KV_TOKENS,
    )


@functools.cache
def _hf_model(family: str, dtype: torch.dtype):
    cls = transformers.AutoModelForImageTextToText
    return load_hf_model(cls, model_dir(family), dtype).to(DEVICE)


def _hf_batch(family: str, dtype: torch.dtype, prompt: str, images: list) -> dict:
    processor = load_hf_processor(model_dir(family))
    if images:
        inputs = hf_inputs(processor, prompt, images)
    else:
        inputs = getattr(processor, "tokenizer", processor)([prompt], return_tensors="pt")
    return {
        k: v.to(DEVICE, dtype) if v.is_floating_point() else v.to(DEVICE) for k, v in inputs.items()
    }


@functools.cache
def _hf_greedy(family: str, dtype: torch.dtype, case: int) -> tuple[list[int], list[torch.Tensor]]:
    """HF ``generate`` on the GPU: greedy ids and each step's log-probabilities (float32)."""
    prompt, images = _cases(family)[case] if case >= 0 else (TEXT_ONLY, [])
    inputs = _hf_batch(family, dtype, prompt, images)
    with torch.no_grad():
        out = _hf_model(family, dtype).generate(
            **inputs,
            max_new_tokens=MAX_NEW,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
        )
    ids = out.sequences[0, inputs["input_ids"].shape[1] :].tolist()
    return ids, [torch.log_softmax(step[0].float(), -1).cpu() for step in out.logits]


def _logprobs_of(out: dict) -> list[float]:
    return [lp for lp, _, _ in out["meta_info"]["output_token_logprobs"]]


# float32: token for token ------------------------------------------------------------------------
@pytest.mark.parametrize("family", FAMILIES)
def test_float32_greedy_equals_hf_on_the_gpu(family: str) -> None:
    """Whole prompts and chunks cutting through images, a radix-cache hit, and a batch that
    mixes a text-only request with a two-image one."""
    refs = [_hf_greedy(family, torch.float32, case) for case in range(2)]
    text_ref = _hf_greedy(family, torch.float32, -1)
    for chunk in (-1, CHUNK):
        engine = _engine(family, "float32", chunk)
        assert engine.runner.kv_pool.k_buffer[0].device.type == DEVICE
        assert next(engine.runner.model.parameters()).device.type == DEVICE
        for (prompt, images), (ids, steps) in zip(_cases(family), refs):
            hf_lps = [float(step[tok]) for step, tok in zip(steps, ids)]
            first = engine.generate(prompt, GREEDY, image_data=images, return_logprob=True)
            assert first["output_ids"] == ids
            assert _logprobs_of(first) == pytest.approx(hf_lps, abs=1e-3)
            again = engine.generate(prompt, GREEDY, image_data=images, return_logprob=True)
            assert again["output_ids"] == ids
            assert again["meta_info"]["cached_tokens"] == again["meta_info"]["prompt_tokens"] - 1
        prompt, images = _cases(family)[1]
        outs = engine.generate(
            [TEXT_ONLY, prompt], GREEDY, image_data=[[], images], return_logprob=True
        )
        assert [o["output_ids"] for o in outs] == [text_ref[0], refs[1][0]]
        engine.scheduler.check_integrity()
        engine.shutdown()
    REPORT.setdefault("float32_greedy", {})[family] = {"tokens": MAX_NEW, "equal": True}


def test_float32_engine_turns_tf32_off(monkeypatch) -> None:
    """cuDNN convolutions default to TF32, which moved Qwen3.5's video logprobs 3e-4 off HF's
    float32 on the CPU; the float32 engine asks for full float32."""
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", True)
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", True)
    _engine("qwen2_5_vl", "float32", -1).shutdown()
    assert not torch.backends.cudnn.allow_tf32 and not torch.backends.cuda.matmul.allow_tf32


# bfloat16: within HF's own noise -----------------------------------------------------------------
@functools.cache
def _hf_prompt_logprobs(family: str, dtype: torch.dtype) -> torch.Tensor:
    """log P(token p | tokens < p), p >= 1, of the two-image prompt, from HF on the GPU."""
    prompt, images = _cases(family)[1]
    inputs = _hf_batch(family, dtype, prompt, images)
    with torch.no_grad():
        logits = _hf_model(family, dtype)(**inputs).logits[0].float()
    ids = inputs["input_ids"][0]
    return torch.log_softmax(logits, -1)[:-1].gather(1, ids[1:, None])[:, 0].cpu()


def _noise(family: str) -> torch.Tensor:
    return (
        _hf_prompt_logprobs(family, torch.bfloat16) - _hf_prompt_logprobs(family, torch.float32)
    ).abs()


def _gap(family: str, out: dict, start: int = 1) -> float:
    """The engine's prompt logprobs of positions ``start``.. against HF's in bfloat16, in units of
    the bound (within it when at most 1)."""
    entries = out["meta_info"]["input_token_logprobs"]
    got = torch.tensor([lp for lp, _, _ in entries[1 if start == 1 else 0 :]])
    bf16 = _hf_prompt_logprobs(family, torch.bfloat16)[start - 1 :]
    noise = _noise(family)[start - 1 :]
    assert got.shape == bf16.shape and noise.max() > 0
    gap = (got - bf16).abs()
    return float(
        max(gap.max() / (MAX_FACTOR * noise.max()), gap.mean() / (MEAN_FACTOR * noise.mean()))
    )


def _greedy_agreement(family: str, got: list[int]) -> int:
    """Tokens the engine's greedy output shares with HF's bfloat16 ``generate``; where they part,
    only at a near-tie within the bound (``conftest.greedy_agreement``)."""
    ids, steps = _hf_greedy(family, torch.bfloat16, 1)
    return greedy_agreement(got, ids, steps, MAX_FACTOR * float(_noise(family).max()))


@pytest.mark.parametrize("family", FAMILIES)
def test_bfloat16_within_hf_noise_on_the_gpu(family: str) -> None:
    prompt, images = _cases(family)[1]
    params = {"temperature": 0, "max_new_tokens": MAX_NEW}
    report = REPORT.setdefault("bfloat16", {}).setdefault(family, {})
    for chunk in (-1, CHUNK):
        engine = _engine(family, "bfloat16", chunk)
        assert engine.runner.kv_pool.k_buffer[0].dtype == torch.bfloat16
        first = engine.generate(
            prompt, params, image_data=images, return_logprob=True, logprob_start_len=0
        )
        report[f"gap_chunk{chunk}"] = gap = _gap(family, first)
        assert gap <= 1
        report[f"greedy_tokens_equal_chunk{chunk}"] = _greedy_agreement(family, first["output_ids"])
        start = first["meta_info"]["prompt_tokens"] // 2
        again = engine.generate(
            prompt, params, image_data=images, return_logprob=True, logprob_start_len=start
        )
        assert 0 < again["meta_info"]["cached_tokens"] <= start
        report[f"gap_cached_chunk{chunk}"] = gap = _gap(family, again, start)
        assert gap <= 1
        engine.scheduler.check_integrity()
        engine.shutdown()


@pytest.mark.parametrize("family", FAMILIES)
def test_bfloat16_bound_catches_a_dropped_image_on_the_gpu(family: str, monkeypatch) -> None:
    original = MultimodalEmbedder._get_chunked_embedding_by_item

    def drop_last_image(self, *args):
        return original(self, *args)[:-1]

    monkeypatch.setattr(MultimodalEmbedder, "_get_chunked_embedding_by_item", drop_last_image)
    engine = _engine(family, "bfloat16", -1)
    prompt, images = _cases(family)[1]
    out = engine.generate(
        prompt, {"temperature": 0, "max_new_tokens": 1}, image_data=images,
        return_logprob=True, logprob_start_len=0,
    )  # fmt: skip
    REPORT.setdefault("dropped_image_gap", {})[family] = gap = _gap(family, out)
    assert gap > 1
    engine.shutdown()


# Moves of pixel features ------------------------------------------------------------------------
def _timed_move(item: Any, move) -> dict[str, Any]:
    """Queue ~0.5 s of GPU sleep, then run ``move`` on the host: how long the host call took,
    whether the stream was still busy when it returned, and the device-side sleep and copy
    times from CUDA events."""
    torch.cuda.synchronize()
    start, slept, done = (torch.cuda.Event(enable_timing=True) for _ in range(3))
    start.record()
    torch.cuda._sleep(1_000_000_000)
    slept.record()
    t0 = time.perf_counter()
    moved = move(item)
    host_ms = (time.perf_counter() - t0) * 1e3
    done.record()
    busy = not done.query()
    done.synchronize()
    return {
        "moved": moved,
        "host_ms": host_ms,
        "stream_busy_on_return": busy,
        "sleep_ms": start.elapsed_time(slept),
        "copy_ms": slept.elapsed_time(done),
    }


def test_feature_moves_are_pinned_and_non_blocking() -> None:
    """``_move_items_to_device`` returns while the copy waits behind earlier GPU work, which a
    copy from pageable memory cannot do: the host would stage it chunk by chunk as the stream
    drains. The copy lands after that work, in the model's dtype, with the values sent."""
    pixels = np.random.default_rng(0).standard_normal((4096, 2048), dtype=np.float32)  # 32 MB
    grid = np.array([[1, 64, 64]], dtype=np.int64)
    item = types.SimpleNamespace(features={"pixel_values": pixels, "image_grid_thw": grid})
    _move_items_to_device([item], DEVICE, torch.bfloat16)  # the pinned host pool's first block

    ours = _timed_move(item, lambda it: _move_items_to_device([it], DEVICE, torch.bfloat16)[0])
    moved = ours.pop("moved")
    assert ours["stream_busy_on_return"] and ours["host_ms"] < ours["sleep_ms"] / 2
    assert moved["pixel_values"].device.type == DEVICE
    assert moved["pixel_values"].dtype == torch.bfloat16
    assert moved["image_grid_thw"].dtype == torch.int64  # integer features keep their dtype
    expected = torch.from_numpy(pixels).to(torch.bfloat16)
    assert torch.equal(moved["pixel_values"].cpu(), expected)
    assert torch.equal(moved["image_grid_thw"].cpu(), torch.from_numpy(grid))
    assert isinstance(item.features["pixel_values"], np.ndarray)  # the host copy stays

    def pageable(it):
        return torch.from_numpy(it.features["pixel_values"]).to(DEVICE, non_blocking=True)

    control = _timed_move(item, pageable)
    control.pop("moved")
    REPORT["moves"] = {"pinned": ours, "pageable_control": control}
    assert control["host_ms"] > control["sleep_ms"] / 2  # what a blocking move looks like


def test_only_cache_misses_move_to_the_gpu(monkeypatch) -> None:
    moves: list[int] = []
    original = embedder_module._move_items_to_device

    def counting(items, device, dtype=None):
        moves.append(len(items))
        out = original(items, device, dtype)
        assert all(t.device.type == DEVICE for f in out for t in f.values() if torch.is_tensor(t))
        return out

    monkeypatch.setattr(embedder_module, "_move_items_to_device", counting)
    engine = _engine("qwen2_5_vl", "bfloat16", CHUNK)
    prompt, images = _cases("qwen2_5_vl")[1]
    engine.generate(prompt, GREEDY, image_data=images)
    assert sum(moves) == 2
    engine.generate("Look. " + prompt, GREEDY, image_data=images)  # no shared KV prefix
    assert sum(moves) == 2  # both embeddings come from the cache, on the GPU
    entries = engine.runner.embedder.cache._entries.values()
    assert entries and all(e.embedding.device.type == DEVICE for e in entries)
    engine.shutdown()


# Vision attention on flash ---------------------------------------------------------------------
_original_flash = fast_vision._segments_on_flash


@pytest.mark.parametrize("dim", [80, 72])  # Qwen2.5-VL's and Qwen3-VL's head dims
def test_vision_attention_on_flash_matches_float32_segments(dim: int, monkeypatch) -> None:
    lengths = [64, 64, 100, 7, 256, 1]
    heads, total = 16, sum(lengths)
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    q, k, v = (
        torch.randn(1, heads, total, dim, device=DEVICE, generator=gen, dtype=torch.bfloat16)
        for _ in range(3)
    )
    cu = torch.tensor([0, *np.cumsum(lengths)], dtype=torch.int32, device=DEVICE)
    calls = []
    monkeypatch.setattr(
        fast_vision,
        "_segments_on_flash",
        lambda *a: calls.append(1) or _original_flash(*a),
    )
    module = types.SimpleNamespace(perf_counters=None, attention_kernel=None)
    out, _ = fast_vision.varlen_vision_attention(
        module, q, k, v, None, scaling=dim**-0.5, cu_seq_lens_q=cu, max_length_q=max(lengths)
    )
    assert calls and out.shape == (1, total, heads, dim)
    reference = torch.cat([
        torch.softmax(qs.float() @ ks.float().transpose(-1, -2) * dim**-0.5, -1) @ vs.float()
        for qs, ks, vs in zip(*(t[0].split(lengths, dim=1) for t in (q, k, v)))
    ], dim=1).transpose(0, 1)  # fmt: skip
    flash_err = (out[0].float() - reference).abs().max().item()
    sdpa = fast_vision._segments_by_runs(
        *(t[0].transpose(0, 1) for t in (q, k, v)), cu.tolist(), dim**-0.5, 0.0
    )
    sdpa_err = (sdpa.float() - reference).abs().max().item()
    REPORT.setdefault("vision_flash", {})[dim] = {"flash_err": flash_err, "sdpa_err": sdpa_err}
    assert flash_err <= 2 * sdpa_err + 1e-3


# Sampling on device logits ---------------------------------------------------------------------
def test_sampling_on_gpu_logits_is_seeded_and_penalised() -> None:
    engine = _engine("qwen2_5_vl", "bfloat16", -1)
    prompt, images = _cases("qwen2_5_vl")[0]
    params = {
        "temperature": 0.8, "top_p": 0.9, "top_k": 20, "min_p": 0.01,
        "frequency_penalty": 0.5, "presence_penalty": 0.2, "repetition_penalty": 1.1,
        "max_new_tokens": MAX_NEW, "sampling_seed": 7, "ignore_eos": True,
    }  # fmt: skip
    first = engine.generate(prompt, params, image_data=images)
    again = engine.generate(prompt, params, image_data=images)
    assert first["output_ids"] == again["output_ids"] and len(first["output_ids"]) == MAX_NEW
    greedy = engine.generate(prompt, {**GREEDY, "ignore_eos": True}, image_data=images)
    top1 = engine.generate(
        prompt, {"temperature": 1.0, "top_k": 1, "max_new_tokens": MAX_NEW, "ignore_eos": True},
        image_data=images,
    )  # fmt: skip
    assert top1["output_ids"] == greedy["output_ids"]
    engine.scheduler.check_integrity()
    engine.shutdown()
