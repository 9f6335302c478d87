"""The vision towers' segment attention on the native kernel (``varlen_attention`` in
``kernels/csrc/prefill_attention.cpp``, called by ``fast_vision.varlen_vision_attention``)
against a float64 softmax reference on random layouts: 1-5 segments of 1-300 tokens (empty ones
too), 1-4 heads, head dims 64/80/128 and 72 (bfloat16: zero-padded to 80 on the way in;
float32: torch's path), q/k/v as HF's towers hand them over or as plain (1, heads, N, dim)
tensors; float32 and bfloat16.

Bounds, as for the causal kernel (``test/test_prefill_attention.py``): float32 differs from the
reference by float32 rounding only, 1e-4 of max|v|; bfloat16 rounds each softmax weight to
bfloat16 (2^-9 relative, normalized by the float32 sum of the unrounded weights) and the output
(2^-9), so 2^-8 max|v| plus float32 noise."""

from __future__ import annotations

import pytest
import torch
from attention_bounds import excess
from conftest import examples, needs_compiler
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang.srt import kernels
from sglang.srt.core.perf_counters import PerfCounters
from sglang.srt.models import fast_vision

KERNEL = kernels.load("prefill_attention")
needs_kernel = needs_compiler


class _Attention(torch.nn.Module):
    """What ``fast_vision.install`` leaves on a tower's attention module."""

    def __init__(self, kernel) -> None:
        super().__init__()
        self.attention_kernel = kernel
        self.perf_counters = PerfCounters()


def reference(q, k, v, cu: list[int], scale: float, drop: int | None = None):
    """float64 softmax attention within each segment, (1, heads, N, dim) in, (N, heads, dim)
    out, and each element's spread (``attention_bounds``); ``drop``: a token no query sees."""
    out = torch.zeros(q.shape[2], q.shape[1], q.shape[3], dtype=torch.float64)
    spread = torch.zeros_like(out)
    for a, b in zip(cu, cu[1:]):
        if b > a:
            qs, ks, vs = (t[0, :, a:b].double() for t in (q, k, v))
            scores = qs @ ks.transpose(1, 2) * scale
            if drop is not None and a <= drop < b:
                scores[..., drop - a] = float("-inf")
            weights = scores.softmax(-1)
            out[a:b] = (weights @ vs).transpose(0, 1)
            spread[a:b] = (weights @ vs.abs()).transpose(0, 1)
    return out, spread


def random_qkv(gen, tokens: int, heads: int, dim: int, dtype, token_major: bool):
    """q, k, v as (1, heads, N, dim); token_major: storage (N, heads, dim), as HF's towers."""
    shape = (tokens, heads, dim) if token_major else (heads, tokens, dim)
    tensors = (torch.randn(shape, generator=gen).to(dtype) for _ in range(3))
    return [(t.transpose(0, 1) if token_major else t).unsqueeze(0) for t in tensors]


@needs_kernel
@settings(max_examples=examples(30), deadline=None)
@given(
    lengths=st.lists(
        st.one_of(st.integers(1, 300), st.just(64), st.just(0)), min_size=1, max_size=5
    ),  # fmt: skip
    heads=st.integers(1, 4),
    dim=st.sampled_from([64, 72, 80, 128]),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    token_major=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_kernel_matches_float64_attention_within_segments(
    lengths, heads, dim, dtype, token_major, seed
) -> None:
    gen = torch.Generator().manual_seed(seed)
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    q, k, v = random_qkv(gen, cu[-1], heads, dim, dtype, token_major)
    module, scale = _Attention(KERNEL), dim**-0.5
    cu_t = torch.tensor(cu, dtype=torch.int32)
    out, _ = fast_vision.varlen_vision_attention(module, q, k, v, None, scale, cu_seq_lens_q=cu_t)
    assert out.shape == (1, cu[-1], heads, dim) and out.dtype == dtype
    assert excess(out[0], *reference(q, k, v, cu, scale), dtype) <= 1
    flops = 4.0 * heads * dim * sum(n * n for n in lengths)
    assert module.perf_counters.vision_flops == flops


@needs_kernel
@settings(max_examples=examples(20), deadline=None)
@given(
    length=st.integers(1, 300),
    dim=st.sampled_from([64, 80]),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    seed=st.integers(0, 2**16),
)
def test_kernel_keeps_far_negative_scores_of_a_partial_key_block(length, dim, dtype, seed):
    """Every score near -150: the softmax is still well defined, and only a running max that
    takes no score of the zero keys padding a block's last tile (scores 0) keeps its weights
    from underflowing to 0 / 0."""
    gen = torch.Generator().manual_seed(seed)
    near_one = lambda: 1 + 0.1 * torch.randn(1, 1, length, dim, generator=gen)  # noqa: E731
    q = (-150 / dim**0.5 * near_one()).to(dtype)
    k, v = near_one().to(dtype), torch.randn(1, 1, length, dim, generator=gen).to(dtype)
    module, scale, cu = _Attention(KERNEL), dim**-0.5, [0, length]
    cu_t = torch.tensor(cu, dtype=torch.int32)
    out, _ = fast_vision.varlen_vision_attention(module, q, k, v, None, scale, cu_seq_lens_q=cu_t)
    max_score = float((q.double() @ k.double().transpose(-1, -2)).abs().max()) * scale
    assert excess(out[0], *reference(q, k, v, cu, scale), dtype, max_score) <= 1


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("seed", range(4))
def test_bound_catches_one_key_left_out(dtype, seed) -> None:
    """Against a reference that leaves one token of a 300-token image out of every query's
    softmax (a one-key masking error), the kernel's output is outside the bound."""
    gen = torch.Generator().manual_seed(seed)
    cu = [0, 300, 364]
    q, k, v = random_qkv(gen, cu[-1], 4, 80, dtype, True)
    module, scale = _Attention(KERNEL), 80**-0.5
    cu_t = torch.tensor(cu, dtype=torch.int32)
    out, _ = fast_vision.varlen_vision_attention(module, q, k, v, None, scale, cu_seq_lens_q=cu_t)
    assert excess(out[0], *reference(q, k, v, cu, scale), dtype) <= 1
    assert excess(out[0], *reference(q, k, v, cu, scale, drop=150), dtype) > 1


class _Refusing:
    def varlen_attention(self, *args) -> None:
        raise AssertionError("the kernel was called")


def test_other_dtypes_padded_float32_and_dropout_keep_the_torch_path() -> None:
    gen = torch.Generator().manual_seed(0)
    cu = torch.tensor([0, 3, 10])
    q, k, v = random_qkv(gen, 10, 2, 16, torch.float16, True)
    module = _Attention(_Refusing())
    out, _ = fast_vision.varlen_vision_attention(module, q, k, v, None, 0.25, cu_seq_lens_q=cu)
    torch.testing.assert_close(out[0].double(), reference(q, k, v, [0, 3, 10], 0.25)[0],
                               atol=2e-3, rtol=2e-3)  # fmt: skip
    q, k, v = random_qkv(gen, 10, 2, 24, torch.float32, True)
    out, _ = fast_vision.varlen_vision_attention(module, q, k, v, None, 0.25, cu_seq_lens_q=cu)
    want, _ = reference(q, k, v, [0, 3, 10], 0.25)
    torch.testing.assert_close(out[0].double(), want, atol=1e-5, rtol=1e-5)
    q, k, v = random_qkv(gen, 10, 2, 16, torch.float32, True)
    torch.manual_seed(0)
    fast_vision.varlen_vision_attention(module, q, k, v, None, 0.25, 0.5, cu_seq_lens_q=cu)


@needs_kernel
def test_kernel_checks_its_inputs() -> None:
    q = torch.randn(10, 2, 16)
    out = torch.empty_like(q)
    with pytest.raises(RuntimeError, match="must rise"):
        KERNEL.varlen_attention(out, q, q, q, torch.tensor([0, 6, 4, 10]), 0.25)
    with pytest.raises(RuntimeError, match="must rise"):
        KERNEL.varlen_attention(out, q, q, q, torch.tensor([0, 11]), 0.25)
    with pytest.raises(RuntimeError, match="differ in tokens"):
        KERNEL.varlen_attention(out, q, q[:9], q[:9], torch.tensor([0, 9]), 0.25)
    with pytest.raises(RuntimeError, match="multiple of 16"):
        narrow = q[..., :8].contiguous()
        KERNEL.varlen_attention(narrow.clone(), narrow, narrow, narrow, torch.tensor([0, 9]), 1.0)


@needs_kernel
def test_benchmark_smoke(tmp_path) -> None:
    from benchmark.vision_attention import main

    out = tmp_path / "vision_attention"
    result = main(["--heads", "2", "--dim", "72", "--layouts", "64x3,100", "--repeats", "1",
                   "--out", str(out)])  # fmt: skip
    assert len(result["rows"]) == 4 and all(r["kernel_gflops"] > 0 for r in result["rows"])
    assert out.with_suffix(".md").exists() and out.with_suffix(".json").exists()
