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
from attention_bounds import excess
from conftest import examples, needs_compiler
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang.srt import kernels

KERNEL = kernels.load("prefill_attention")
needs_kernel = needs_compiler


def reference(q, k_buf, v_buf, table, rows, q_starts, prefixes, q_lens, scale, window, drop=None):
    """Plain float64 softmax attention, one request at a time, with an explicit mask, and the
    spread of each output element (``attention_bounds``); ``drop``: a position no query sees
    (a deliberate masking error)."""
    out = torch.zeros(q.shape, dtype=torch.float64)
    spread = torch.zeros(q.shape, dtype=torch.float64)
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
        if drop is not None:
            allowed &= kv_pos != drop
        scores = (qi @ k.transpose(1, 2) * scale).masked_fill(~allowed, float("-inf"))
        weights = scores.softmax(-1)
        out[start : start + n] = (weights @ v).transpose(0, 1)
        spread[start : start + n] = (weights @ v.abs()).transpose(0, 1)
    return out, spread


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
@settings(max_examples=examples(30), deadline=None)
@given(
    requests=st.integers(1, 3),
    kv_heads=st.integers(1, 4),
    groups=st.sampled_from([1, 2, 3, 4, 6, 7]),
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
    assert excess(out, *reference(*args, scale, window), dtype) <= 1


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("seed", range(4))
def test_bound_catches_one_key_left_out(dtype, seed) -> None:
    """The kernel's output against a reference that leaves one key of a long request out of the
    softmax (a one-key masking error): outside the bound."""
    gen = torch.Generator().manual_seed(seed)
    args = random_batch(gen, 2, 3, 64, [290, 0], [40, 7], dtype)
    out = torch.empty(args[0].shape, dtype=dtype)
    KERNEL.prefill_attention(out, *args, 0.125, -1)
    assert excess(out, *reference(*args, 0.125, -1), dtype) <= 1
    assert excess(out, *reference(*args, 0.125, -1, drop=145), dtype) > 1


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


@needs_kernel
@pytest.mark.parametrize("window", [None, 6])
def test_backend_splits_requests_between_kernel_and_torch(window) -> None:
    """A batch whose first request has a bidirectional span: the others go through the kernel
    in one call, the first through torch, and the output equals the torch-only backend's."""
    from sglang.srt.core.forward_batch import ForwardBatch
    from sglang.srt.layers.attention.cpu_native import CpuNativeAttnBackend
    from sglang.srt.mem_cache.memory_pool import KVPool, ReqToTokenPool

    torch.manual_seed(0)
    heads, kv_heads, dim = 6, 2, 32
    pool = KVPool(512, [(kv_heads, dim)], torch.float32, "cpu")
    rows = ReqToTokenPool(4, 128, "cpu")
    reqs = [(5, 9, [(3, 8)]), (0, 17, []), (40, 3, [])]  # prefix, extend, spans
    out_locs, row_ids = [], []
    for prefix, extend, _ in reqs:
        row, slots = rows.alloc(), pool.alloc(prefix + extend)[torch.randperm(prefix + extend)]
        rows.req_to_token[row, : prefix + extend] = slots
        kv = torch.randn(prefix, kv_heads, dim)
        pool.set_kv(0, slots[:prefix], kv, kv.flip(0))
        out_locs.append(slots[prefix:])
        row_ids.append(row)
    n = sum(e for _, e, _ in reqs)
    batch = ForwardBatch(
        reqs=[],
        input_ids=torch.zeros(n, dtype=torch.int64),
        positions=torch.zeros(n),
        out_cache_loc=torch.cat(out_locs),
        req_pool_indices=row_ids,
        prefix_lens=[p for p, _, _ in reqs],
        extend_lens=[e for _, e, _ in reqs],
        bidirectional_spans=[s for _, _, s in reqs],
        is_decode=False,
    )
    q = torch.randn(1, n, heads, dim).transpose(1, 2)
    k, v = torch.randn(1, kv_heads, n, dim), torch.randn(1, kv_heads, n, dim)
    calls = []

    class Counting:
        def prefill_attention(self, out, q, k_buf, v_buf, table, rows, *args):
            calls.append(rows.tolist())
            return KERNEL.prefill_attention(out, q, k_buf, v_buf, table, rows, *args)

    outputs = []
    for kernel in (Counting(), None):
        backend = CpuNativeAttnBackend(pool, rows)
        backend.prefill_kernel = kernel
        backend.prepare_metadata(batch)
        outputs.append(backend.forward(q, k, v, 0, batch, scaling=0.2, sliding_window=window))
    assert calls == [row_ids[1:]]
    torch.testing.assert_close(outputs[0], outputs[1], rtol=1e-5, atol=1e-5)


@needs_kernel
def test_engine_prefills_through_the_kernel(monkeypatch) -> None:
    """Prefill batches call the kernel once per layer; greedy output equals the torch path's."""
    from conftest import make_image, model_dir, placeholder

    import sglang

    prompts = [f"Describe {placeholder('qwen2_5_vl')} briefly.", "Only text, a bit longer."]
    images = [[make_image(1)], []]
    params = {"temperature": 0, "max_new_tokens": 6}
    calls = []
    engine = sglang.Engine(dtype="float32", model_path=model_dir("qwen2_5_vl"))
    backend = engine.runner.attn_backend
    assert type(backend).__name__ == "CpuNativeAttnBackend"  # the default on a CPU
    real = backend.prefill_kernel

    class Counting:
        def prefill_attention(self, out, q, *args):
            calls.append(q.shape[0])
            return real.prefill_attention(out, q, *args)

    monkeypatch.setattr(backend, "prefill_kernel", Counting())
    with_kernel = engine.generate(prompts, params, image_data=images)
    assert len(calls) >= engine.runner.text_config.num_hidden_layers and max(calls) > 1
    monkeypatch.setattr(backend, "prefill_kernel", None)
    engine.flush_cache()
    without = engine.generate(prompts, params, image_data=images)
    assert [o["output_ids"] for o in with_kernel] == [o["output_ids"] for o in without]
    engine.shutdown()


@needs_kernel
def test_benchmark_smoke(tmp_path) -> None:
    from benchmark.prefill_attention import main

    out = tmp_path / "prefill_attention"
    result = main(["--heads", "4", "--kv-heads", "2", "--dim", "64", "--q-lens", "40",
                   "--prefixes", "0,70", "--repeats", "1", "--out", str(out)])  # fmt: skip
    assert len(result["rows"]) == 4 and all(r["kernel_gflops"] > 0 for r in result["rows"])
    assert out.with_suffix(".png").exists() and out.with_suffix(".json").exists()
