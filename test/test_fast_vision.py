"""The Qwen-VL vision fast path against HF's own tower: the batched segment attention is
bitwise equal; the matrix-product patch embedding and the native attention kernel are equal to
float rounding."""

from __future__ import annotations

import functools
import importlib
import types

import pytest
import torch
import transformers
from conftest import examples, make_image, model_dir, needs_compiler, placeholder
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang.srt import kernels
from sglang.srt.core.perf_counters import PerfCounters
from sglang.srt.layers.quantization import packed_linear
from sglang.srt.layers.quantization.base import keep_out_of_compile
from sglang.srt.models import fast_vision
from sglang.srt.multimodal.hf_processor import load_hf_processor

QWEN_FAMILIES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")


@functools.cache
def _inputs(family: str):
    processor = load_hf_processor(model_dir(family)).image_processor
    images = [make_image(1, 96, 64), make_image(2, 64, 128), make_image(3, 96, 64)]
    out = processor(images=images, return_tensors="pt")
    return out["pixel_values"], out["image_grid_thw"]


def _model(family: str) -> torch.nn.Module:
    return transformers.AutoModelForImageTextToText.from_pretrained(
        model_dir(family), dtype=torch.float32, attn_implementation="sdpa"
    ).eval()


def _encode(model: torch.nn.Module, family: str) -> list[torch.Tensor]:
    pixel_values, grid = _inputs(family)
    with torch.no_grad():
        out = model.model.get_image_features(pixel_values=pixel_values, image_grid_thw=grid)
    return _flat([out.pooler_output, getattr(out, "deepstack_features", None) or []])


def _flat(value) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    return [t for part in value for t in _flat(part)]


@pytest.mark.parametrize("family", QWEN_FAMILIES)
def test_fast_vision_matches_hf(family: str, monkeypatch: pytest.MonkeyPatch) -> None:
    config = transformers.AutoConfig.from_pretrained(model_dir(family))
    ref = _encode(_model(family), family)

    calls = []
    monkeypatch.setattr(
        fast_vision.F,
        "scaled_dot_product_attention",
        _counting(fast_vision.F.scaled_dot_product_attention, calls),
    )
    monkeypatch.setenv("SGLANG_EXACT_PATCH_EMBED", "1")
    monkeypatch.setenv(kernels.DISABLE_ENV, "1")  # the torch path, bitwise equal to HF's
    exact = _model(family)
    assert fast_vision.install(exact, config)
    got = _encode(exact, family)
    assert calls, "the tower's attention did not go through varlen_vision_attention"
    assert all(torch.equal(a, b) for a, b in zip(ref, got, strict=True))

    monkeypatch.setenv("SGLANG_EXACT_PATCH_EMBED", "0")
    monkeypatch.delenv(kernels.DISABLE_ENV)
    fast = _model(family)
    fast_vision.install(fast, config)
    kernel_calls: list = []
    for module in fast.model.visual.modules():
        if getattr(module, "attention_kernel", None) is not None:
            module.attention_kernel = _CountingKernel(module.attention_kernel, kernel_calls)
    for a, b in zip(ref, _encode(fast, family), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)
    assert kernel_calls or kernels.compiler() is None


def _counting(fn, calls: list):
    def wrapper(*args, **kwargs):
        calls.append(args[0].shape)
        return fn(*args, **kwargs)

    return wrapper


class _CountingKernel:
    def __init__(self, kernel, calls: list) -> None:
        self.kernel, self.calls = kernel, calls

    def varlen_attention(self, out, q, *args) -> None:
        self.calls.append(tuple(q.shape))
        self.kernel.varlen_attention(out, q, *args)


def test_equal_segment_runs() -> None:
    assert fast_vision.equal_segment_runs([0, 4, 8, 12, 14, 18, 18, 22]) == [
        (0, 3, 4),
        (12, 1, 2),
        (14, 2, 4),
    ]
    assert fast_vision.equal_segment_runs([0]) == []


def test_varlen_attention_equals_per_segment_sdpa() -> None:
    torch.manual_seed(0)
    cu = torch.tensor([0, 5, 10, 15, 18, 30, 42], dtype=torch.int32)
    q, k, v = (torch.randn(1, 42, 3, 8).transpose(1, 2) for _ in range(3))
    out, _ = fast_vision.varlen_vision_attention(None, q, k, v, None, scaling=0.3, cu_seq_lens_q=cu)
    for a, b in zip(cu.tolist(), cu[1:].tolist()):
        ref = torch.nn.functional.scaled_dot_product_attention(
            q[:, :, a:b], k[:, :, a:b], v[:, :, a:b], scale=0.3
        )
        assert torch.equal(out[0, a:b], ref[0].transpose(0, 1))


def test_attention_flops_follow_each_cu_seqlens_tensor() -> None:
    """Segment lengths are read from the device once per cu_seqlens tensor (the layers of a
    forward share it), and a new tensor, equal in shape but not in lengths, is read anew."""
    counters = PerfCounters()
    module = types.SimpleNamespace(perf_counters=counters, attention_kernel=None)
    q = torch.randn(1, 2, 12, 8)
    first = torch.tensor([0, 4, 12], dtype=torch.int32)
    for _ in range(3):  # three layers of one forward
        fast_vision.varlen_vision_attention(module, q, q, q, None, cu_seq_lens_q=first)
    assert counters.vision_flops == 3 * 4.0 * 2 * 8 * (4**2 + 8**2)
    second = torch.tensor([0, 6, 12], dtype=torch.int32)
    fast_vision.varlen_vision_attention(module, q, q, q, None, cu_seq_lens_q=second)
    assert counters.vision_flops == 4.0 * 2 * 8 * (3 * (4**2 + 8**2) + 2 * 6**2)
    # the attention's share, kept apart: all of this tower's FLOPs, and the calls' seconds
    assert counters.vision_attention_flops == counters.vision_flops
    assert 0 < counters.vision_attention_seconds < 60


def test_other_families_are_left_alone() -> None:
    config = transformers.AutoConfig.from_pretrained(model_dir("llava"))
    model = transformers.AutoModelForImageTextToText.from_pretrained(model_dir("llava"))
    assert not fast_vision.install(model, config)


ROTARY = kernels.load("vision_rotary")


@needs_compiler
@settings(max_examples=examples(80), deadline=None)
@given(
    tokens=st.integers(1, 40),
    heads=st.integers(1, 5),
    dim=st.sampled_from([2, 6, 64, 72, 80, 128]),
    dtype=st.sampled_from([torch.bfloat16, torch.float32]),
    packed=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_native_rotary_is_bitwise_hf(tokens, heads, dim, dtype, packed, seed) -> None:
    """q and k as views of a fused qkv projection or on their own, any angles: the kernel's
    result is HF's bit for bit, for every family that defines the function."""
    gen = torch.Generator().manual_seed(seed)
    if packed:
        qkv = torch.randn(tokens, 3, heads, dim, generator=gen).to(dtype)
        q, k, _ = qkv.permute(1, 0, 2, 3).unbind(0)
    else:
        q, k = (torch.randn(tokens, heads, dim, generator=gen).to(dtype) for _ in range(2))
    angles = torch.randn(tokens, dim // 2, generator=gen) * 20
    emb = torch.cat((angles, angles), dim=-1)
    cos, sin = emb.cos(), emb.sin()
    for family in QWEN_FAMILIES:
        module = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
        hf = getattr(module, fast_vision.ROTARY_FUNCTION)
        hf = getattr(hf, "hf_function", hf)
        want = hf(q, k, cos, sin)
        got = fast_vision.native_rotary(hf, ROTARY)(q, k, cos, sin)
        assert all(g.dtype == w.dtype and torch.equal(g, w) for g, w in zip(got, want))


@needs_compiler
def test_native_rotary_replaces_the_towers_function_once() -> None:
    family = "qwen2_5_vl"
    module = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
    model = _model(family)
    config = transformers.AutoConfig.from_pretrained(model_dir(family))
    for _ in range(2):
        fast_vision.install(model, config)
    installed = getattr(module, fast_vision.ROTARY_FUNCTION)
    assert not hasattr(installed.hf_function, "hf_function")  # wrapped once, HF's inside
    calls = []
    real = ROTARY.rotary_pair
    q = torch.randn(4, 2, 8).bfloat16()
    cos = sin = torch.ones(4, 8)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(ROTARY, "rotary_pair", lambda *a: calls.append(1) or real(*a))
        installed(q, q, cos, sin)  # CPU inputs: the kernel
        installed(q, q, cos.bfloat16(), sin.bfloat16())  # bfloat16 angles: HF's function
    assert calls == [1]


@pytest.mark.skipif(not packed_linear.available(), reason="no packed bfloat16 product here")
def test_compiled_code_calls_the_packed_linears_as_they_are() -> None:
    """inductor cannot lower a product over oneDNN-packed weights: a compiled module calls the
    linears a method serves eagerly (``keep_out_of_compile``), with the same result."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 64)
    ).to(torch.bfloat16)
    x = torch.randn(7, 64, dtype=torch.bfloat16)
    assert packed_linear.install(model) == 2
    with torch.no_grad():
        want = model(x)
        assert keep_out_of_compile(model) == 2
        got = torch.compile(model, dynamic=True)(x)
    torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)


def test_a_compiled_bfloat16_tower_gives_the_same_tokens() -> None:
    """``--enable-torch-compile`` in bfloat16 (packed tower linears, native kernels): the same
    greedy tokens as the eager tower."""
    import sglang

    prompt = f"Describe {placeholder('qwen2_5_vl')} now"
    params = {"max_new_tokens": 4, "temperature": 0}
    tokens = []
    for compiled in (False, True):
        engine = sglang.Engine(
            model_path=model_dir("qwen2_5_vl"), dtype="bfloat16", enable_torch_compile=compiled
        )
        try:
            out = engine.generate([prompt], params, image_data=[[make_image(1)]])
            tokens.append(out[0]["output_ids"])
        finally:
            engine.shutdown()
    assert len(tokens[0]) == 4 and tokens[1] == tokens[0]
