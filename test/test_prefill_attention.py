"""The native prefill attention kernel against a float64 softmax reference on random batches:
1-3 requests with cached prefixes of 0-300 tokens and 1-200 new ones, 1-4 KV heads, GQA ratios
1/2/4/7, head dims 64/80/128, no or a small sliding window, shuffled pool slots; float32 and
bfloat16. Then the engine: prefill batches go through the kernel and greedy output matches the
torch path's.

Bounds. float32: the kernel differs from the reference only by float32 rounding (sums over at
most 500 keys and 128 dims, a polynomial exp within 2e-7), so 1e-4 relative to the output's
scale. bfloat16: the inputs are the same bfloat16 values in both, the scores accumulate in
float32, each softmax weight p is rounded to bfloat16 (relative error at most 2^-9) but
normalized by the float32 sum of the unrounded weights, so the weights w_j of the output
sum_j w_j v_j are each off by at most 2^-9 relative: 2^-9 sum_j w_j |v_j| <= 2^-9 max|v|; then
the output is rounded to bfloat16 (2^-9 |out| <= 2^-9 max|v|). The test allows 2^-8 max|v|
plus float32 noise."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang.srt import kernels

KERNEL = kernels.load("prefill_attention")
needs_kernel = pytest.mark.skipif(KERNEL is None, reason="no C++ toolchain to build the kernel")


def reference(q, k_buf, v_buf, table, rows, q_starts, prefixes, q_lens, scale, window):
    """Plain float64 softmax attention, one request at a time, with an explicit mask."""
    out = torch.zeros(q.shape, dtype=torch.float64)
    for row, start, prefix, n in zip(rows, q_starts, prefixes, q_lens):
        slots = table[row, : prefix + n]
        k = k_buf[slots].double().transpose(0, 1)  # (kv_heads, keys, dim)
        v = v_buf[slots].double().transpose(0, 1)
        qi = q[start : start + n].double().transpose(0, 1)  # (heads, n, dim)
        groups = qi.shape[0] // k.shape[0]
        k, v = k.repeat_interleave(groups, 0), v.repeat_interleave(groups, 0)
        q_pos = torch.arange(prefix, prefix + n)[:, None]
        kv_pos = torch.arange(prefix + n)[None, :]
        allowed = kv_pos <= q_pos
        if window > 0:
            allowed &= kv_pos > q_pos - window
        scores = (qi @ k.transpose(1, 2) * scale).masked_fill(~allowed, float("-inf"))
        out[start : start + n] = (scores.softmax(-1) @ v).transpose(0, 1)
    return out


def random_batch(gen, kv_heads, groups, dim, prefixes, q_lens, dtype):
    heads, size = kv_heads * groups, 2048
    k_buf = torch.randn(size, kv_heads, dim, generator=gen).to(dtype)
    v_buf = torch.randn(size, kv_heads, dim, generator=gen).to(dtype)
    table = torch.randperm(size, generator=gen)[: 4 * 512].reshape(4, 512)  # scattered slots
    rows = torch.randperm(4, generator=gen)[: len(prefixes)]
    q_lens_t = torch.tensor(q_lens)
    q_starts = torch.cumsum(q_lens_t, 0) - q_lens_t
    # q as the model hands it over: (heads, tokens, dim) storage viewed as (tokens, heads, dim)
    q = torch.randn(heads, int(q_lens_t.sum()), dim, generator=gen).to(dtype).transpose(0, 1)
    return q, k_buf, v_buf, table, rows, q_starts, torch.tensor(prefixes), q_lens_t


@needs_kernel
@settings(max_examples=30, deadline=None)
@given(
    requests=st.integers(1, 3),
    kv_heads=st.integers(1, 4),
    groups=st.sampled_from([1, 2, 4, 7]),
    dim=st.sampled_from([64, 80, 128]),
    prefixes=st.lists(st.integers(0, 300), min_size=3, max_size=3),
    q_lens=st.lists(st.integers(1, 200), min_size=3, max_size=3),
    window=st.sampled_from([-1, 1, 5, 70]),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    seed=st.integers(0, 2**16),
)
def test_prefill_kernel_matches_float64_attention(
    requests, kv_heads, groups, dim, prefixes, q_lens, window, dtype, seed
) -> None:
    gen = torch.Generator().manual_seed(seed)
    args = random_batch(gen, kv_heads, groups, dim, prefixes[:requests], q_lens[:requests], dtype)
    scale = dim**-0.5
    out = torch.empty(args[0].shape, dtype=dtype)
    KERNEL.prefill_attention(out, *args, scale, window)
    want = reference(*args, scale, window)
    v_max = args[2].double().abs().max()
    bound = 1e-4 * v_max if dtype == torch.float32 else (2**-8 + 1e-5) * v_max
    assert (out.double() - want).abs().max() <= bound


@needs_kernel
def test_prefill_kernel_leaves_rows_of_other_requests_and_checks_inputs() -> None:
    gen = torch.Generator().manual_seed(0)
    q, k_buf, v_buf, table, rows, starts, prefixes, lens = random_batch(
        gen, 2, 2, 64, [3, 0], [5, 4], torch.float32
    )
    out = torch.full(q.shape, 7.0)
    KERNEL.prefill_attention(
        out, q, k_buf, v_buf, table, rows[:1], starts[:1], prefixes[:1], lens[:1], 0.125, -1
    )
    assert (out[5:] == 7.0).all() and (out[:5] != 7.0).all()
    with pytest.raises(RuntimeError, match="share a dtype"):
        KERNEL.prefill_attention(
            out, q, k_buf.bfloat16(), v_buf, table, rows, starts, prefixes, lens, 0.125, -1
        )
    narrow = [t[..., :8] for t in (q, k_buf, v_buf)]
    with pytest.raises(RuntimeError, match="multiple of 16"):
        KERNEL.prefill_attention(
            out[..., :8].contiguous(), *narrow, table, rows, starts, prefixes, lens, 0.1, -1
        )
    with pytest.raises(RuntimeError, match="out of range"):
        KERNEL.prefill_attention(
            out, q, k_buf, v_buf, table, rows, starts, prefixes + 600, lens, 0.125, -1
        )
