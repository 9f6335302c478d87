"""The native CPU kernels against float64 references on random shapes. Decode attention: batch,
GQA ratios, head dims 64/80/128, sequence lengths, scattered slots, sliding windows,
soft-capping, float32 and bfloat16. bfloat16 linears of decode-sized inputs: rows, in / out
features that are and are not multiples of the vector width, bias or none. The engine uses both
for decode steps."""

from __future__ import annotations

import pytest
import torch
from attention_bounds import excess
from conftest import NATIVE_GEMM_EXPECTED, examples, needs_compiler
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang.srt import kernels
from sglang.srt.model_executor.dtypes import cpu_bfloat16_isa

KERNEL = kernels.load("decode_attention")
LINEAR = kernels.load("linear_bf16")
needs_kernel = needs_compiler


def _reference(q, k_buf, v_buf, table, rows, lens, scale, window, softcap, drop=None):
    """float64 attention of each request's query over its keys, and each output element's
    spread (``attention_bounds``); ``drop``: a key position no query sees."""
    out, spread = [], []
    for b in range(q.shape[0]):
        n = int(lens[b])
        first = max(0, n - window) if window > 0 else 0
        slots = table[rows[b], first:n]
        k = k_buf[slots].double().transpose(0, 1)  # (kv_heads, n, dim)
        v = v_buf[slots].double().transpose(0, 1)
        qb = q[b].double().reshape(k.shape[0], -1, q.shape[2])  # (kv_heads, groups, dim)
        scores = qb @ k.transpose(1, 2) * scale
        if softcap > 0:
            scores = torch.tanh(scores / softcap) * softcap
        if drop is not None and first <= drop < n:
            scores[..., drop - first] = float("-inf")
        weights = scores.softmax(-1)
        out.append((weights @ v).reshape(q.shape[1], q.shape[2]))
        spread.append((weights @ v.abs()).reshape(q.shape[1], q.shape[2]))
    return torch.stack(out), torch.stack(spread)


@needs_kernel
@settings(max_examples=examples(60), deadline=None)
@given(
    batch=st.integers(1, 5),
    kv_heads=st.integers(1, 3),
    groups=st.sampled_from([1, 2, 4, 6]),
    dim=st.sampled_from([64, 80, 128, 20]),
    lengths=st.lists(st.integers(1, 300), min_size=5, max_size=5),
    window=st.sampled_from([-1, 1, 7, 64]),
    softcap=st.sampled_from([0.0, 30.0]),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    seed=st.integers(0, 2**16),
)
def test_decode_kernel_matches_attention_over_gathered_keys(
    batch, kv_heads, groups, dim, lengths, window, softcap, dtype, seed
) -> None:
    gen = torch.Generator().manual_seed(seed)
    heads, size = kv_heads * groups, 1600
    k_buf = torch.randn(size, kv_heads, dim, generator=gen).to(dtype)
    v_buf = torch.randn(size, kv_heads, dim, generator=gen).to(dtype)
    table = torch.randperm(size, generator=gen).reshape(5, 320)  # scattered slots per row
    rows = torch.randperm(5, generator=gen)[:batch]
    lens = torch.tensor(lengths[:batch])
    q = torch.randn(batch, heads, dim, generator=gen).to(dtype)
    scale = dim**-0.5
    got = KERNEL.decode_attention(q, k_buf, v_buf, table, rows, lens, scale, window, softcap)
    assert got.dtype == dtype and got.shape == q.shape
    reference = _reference(q, k_buf, v_buf, table, rows, lens, scale, window, softcap)
    assert excess(got, *reference, dtype) <= 1


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("seed", range(4))
def test_decode_bound_catches_one_key_left_out(dtype, seed) -> None:
    """Against a reference that leaves one key of a 300-token context out (a one-key masking
    error), the kernel's output is outside the bound."""
    gen = torch.Generator().manual_seed(seed)
    k_buf, v_buf = (torch.randn(640, 2, 64, generator=gen).to(dtype) for _ in range(2))
    table = torch.randperm(640, generator=gen).reshape(2, 320)
    rows, lens = torch.tensor([1, 0]), torch.tensor([300, 300])
    q = torch.randn(2, 8, 64, generator=gen).to(dtype)
    got = KERNEL.decode_attention(q, k_buf, v_buf, table, rows, lens, 0.125, -1, 0.0)
    args = (q, k_buf, v_buf, table, rows, lens, 0.125, -1, 0.0)
    assert excess(got, *_reference(*args), dtype) <= 1
    assert excess(got, *_reference(*args, drop=150), dtype) > 1


@needs_kernel
def test_decode_kernel_rejects_what_it_cannot_take() -> None:
    q, kv = torch.randn(1, 4, 8), torch.randn(16, 2, 8)
    table, rows, lens = torch.arange(16)[None], torch.tensor([0]), torch.tensor([3])
    with pytest.raises(RuntimeError, match="share a dtype"):
        KERNEL.decode_attention(q, kv.bfloat16(), kv.bfloat16(), table, rows, lens, 1.0, -1, 0.0)
    with pytest.raises(RuntimeError, match="multiple of KV heads"):
        KERNEL.decode_attention(torch.randn(1, 3, 8), kv, kv, table, rows, lens, 1.0, -1, 0.0)
    with pytest.raises(RuntimeError, match="int64"):
        KERNEL.decode_attention(q, kv, kv, table.int(), rows, lens, 1.0, -1, 0.0)


@needs_kernel
def test_engine_decodes_through_the_kernel(monkeypatch) -> None:
    """Decode steps call the kernel once per layer for the whole batch, and greedy output is
    the same as with the per-request path."""
    from conftest import make_image, model_dir, placeholder

    import sglang

    prompts = [f"Describe {placeholder('qwen2_5_vl')} briefly.", "Only text, a bit longer."]
    images = [[make_image(1)], []]
    params = {"temperature": 0, "max_new_tokens": 8}
    calls = []
    engine = sglang.Engine(dtype="float32", model_path=model_dir("qwen2_5_vl"))
    backend = engine.runner.attn_backend
    real = backend.decode_kernel

    class Counting:
        def decode_attention(self, q, *args):
            calls.append(q.shape[0])
            return real.decode_attention(q, *args)

    monkeypatch.setattr(backend, "decode_kernel", Counting())
    with_kernel = engine.generate(prompts, params, image_data=images)
    layers = engine.runner.text_config.num_hidden_layers
    assert len(calls) >= layers * 7 and max(calls) == 2  # both requests in one call
    monkeypatch.setattr(backend, "decode_kernel", None)
    engine.flush_cache()
    without = engine.generate(prompts, params, image_data=images)
    assert [o["output_ids"] for o in with_kernel] == [o["output_ids"] for o in without]


@needs_kernel
@settings(max_examples=examples(60), deadline=None)
@given(
    rows=st.integers(1, 20),
    in_features=st.sampled_from([1, 31, 32, 33, 64, 200, 1536]),
    out_features=st.sampled_from([1, 15, 16, 17, 100, 513]),
    with_bias=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_bf16_linear_matches_float64_product(
    rows, in_features, out_features, with_bias, seed
) -> None:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, in_features, generator=gen).bfloat16()
    weight = torch.randn(out_features, in_features, generator=gen).bfloat16()
    bias = torch.randn(out_features, generator=gen).bfloat16() if with_bias else None
    got = LINEAR.linear_bf16(x, weight, bias)
    want = x.double() @ weight.double().t() + (bias.double() if with_bias else 0)
    assert got.dtype == torch.bfloat16 and got.shape == (rows, out_features)
    # float32 accumulation, then one bfloat16 rounding of the result (2^-8 relative)
    scale = x.double().abs() @ weight.double().abs().t() + 1
    scale += bias.double().abs() if with_bias else 0
    assert ((got.double() - want).abs() / scale).max() < 2**-8


@needs_kernel
@settings(max_examples=examples(40), deadline=None)
@given(
    rows=st.integers(1, 20),
    in_features=st.sampled_from([1, 15, 16, 17, 200, 1536]),
    out_features=st.sampled_from([1, 15, 16, 17, 100, 513]),
    with_bias=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_float32_linear_matches_float64_product(
    rows, in_features, out_features, with_bias, seed
) -> None:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, in_features, generator=gen)
    weight = torch.randn(out_features, in_features, generator=gen)
    bias = torch.randn(out_features, generator=gen) if with_bias else None
    got = LINEAR.linear_f32(x, weight, bias)
    want = x.double() @ weight.double().t() + (bias.double() if with_bias else 0)
    assert got.dtype == torch.float32 and got.shape == (rows, out_features)
    # float32 sums over in_features products: each step rounds by at most 2^-24 of the terms
    scale = x.double().abs() @ weight.double().abs().t() + (bias.double().abs() if with_bias else 0)
    bound = (in_features + 2) * 2**-24 * scale + 1e-30
    assert ((got.double() - want).abs() <= bound).all()
    flipped = LINEAR.linear_f32(x, -weight, bias)  # a wrong sign must fail the same bound
    if (want.abs() > 2 * bound).any():
        assert not ((flipped.double() - want).abs() <= bound).all()


@needs_kernel
@pytest.mark.skipif(cpu_bfloat16_isa() is not None, reason="float32 serving: CPUs without bf16")
def test_float32_engine_routes_decode_batches_to_the_kernel(monkeypatch) -> None:
    """On a CPU without native bfloat16 (which serves float32), decode batches of 2-16 rows run
    the language model's linears and the head on ``linear_f32``; one row and prompts stay on
    torch; greedy output equals the torch-only run's."""
    from conftest import model_dir

    import sglang
    from sglang.srt.layers.quantization import decode_linear

    engine = sglang.Engine(model_path=model_dir("qwen2_5_vl"), dtype="float32")
    routed = [m for m in engine.runner.model.modules() if hasattr(m, "_decode_kernel")]
    lm = engine.runner.adapter.language_model
    assert len(routed) == len([m for m in lm.modules() if isinstance(m, torch.nn.Linear)]) + 1
    rows_seen = []
    real = routed[0]._decode_kernel

    class Counting:
        def linear_f32(self, x, *args):
            rows_seen.append(x.shape[0])
            return real.linear_f32(x, *args)

    for module in routed:
        monkeypatch.setattr(module, "_decode_kernel", Counting())
    params = {"temperature": 0, "max_new_tokens": 6}
    prompts = ["Tell me about the weather today.", "Another request in the same batch."]
    with_kernel = engine.generate(prompts, params)
    low, high = decode_linear.FLOAT32_MIN_ROWS, decode_linear.MAX_ROWS
    assert rows_seen and all(low <= rows <= high for rows in rows_seen)
    for module in routed:
        monkeypatch.setattr(module, "_decode_kernel", None)
    engine.flush_cache()
    without = engine.generate(prompts, params)
    engine.shutdown()
    assert [o["output_ids"] for o in with_kernel] == [o["output_ids"] for o in without]


@needs_kernel
def test_bf16_engine_routes_decode_linears_and_keeps_prefill_on_torch(monkeypatch) -> None:
    """With plain weights (``cpu_packed_lm_weights=off``, and every CPU without the native
    GEMM) every linear of the language model and the head runs inputs of at most ``MAX_ROWS``
    rows on the kernel, larger ones on torch; output equals the torch-only run's."""
    from conftest import model_dir

    import sglang
    from sglang.srt.layers.quantization import decode_linear

    engine = sglang.Engine(
        model_path=model_dir("qwen2_5_vl"), dtype="bfloat16", cpu_packed_lm_weights="off"
    )
    routed = [m for m in engine.runner.model.modules() if hasattr(m, "_decode_kernel")]
    lm = engine.runner.adapter.language_model
    lm_linears = [m for m in lm.modules() if isinstance(m, torch.nn.Linear)]
    assert len(routed) == len(lm_linears) + 1  # and the head
    rows_seen = []
    real = routed[0]._decode_kernel

    class Counting:
        def linear_bf16(self, x, *args):
            rows_seen.append(x.shape[0])
            return real.linear_bf16(x, *args)

    for module in routed:
        monkeypatch.setattr(module, "_decode_kernel", Counting())
    params = {"temperature": 0, "max_new_tokens": 6}
    prompts = ["Tell me about the weather today.", "Another request in the same batch."]
    with_kernel = engine.generate(prompts, params)
    assert rows_seen and max(rows_seen) <= decode_linear.MAX_ROWS
    for module in routed:
        monkeypatch.setattr(module, "_decode_kernel", None)
    engine.flush_cache()
    without = engine.generate(prompts, params)
    assert [o["output_ids"] for o in with_kernel] == [o["output_ids"] for o in without]


@pytest.mark.skipif(not NATIVE_GEMM_EXPECTED, reason="the native GEMM: AVX512-BF16, no AMX")
def test_bf16_engine_runs_prompts_and_decode_steps_on_one_packed_layout(monkeypatch) -> None:
    """By default on CPUs with the native GEMM, the language model's linears and its head hold
    only the GEMM's packed weight and run every row count on it (decode steps' rows and prompt
    chunks' alike); greedy output equals the plain-weight engine's (decode kernel and torch)."""
    from conftest import model_dir

    import sglang
    from sglang.srt.layers.quantization import packed_linear

    params = {"temperature": 0, "max_new_tokens": 6}
    prompts = ["Tell me about the weather today.", "Another request in the same batch."]
    plain = sglang.Engine(
        model_path=model_dir("qwen2_5_vl"), dtype="bfloat16", cpu_packed_lm_weights="off"
    )
    want = [o["output_ids"] for o in plain.generate(prompts, params)]
    plain.shutdown()
    engine = sglang.Engine(model_path=model_dir("qwen2_5_vl"), dtype="bfloat16")
    runner = engine.runner
    lm = runner.adapter.language_model
    linears = [m for m in lm.modules() if isinstance(m, torch.nn.Linear)]
    linears.append(runner.model.get_output_embeddings())
    assert all(packed_linear.holds_only_packed(m) for m in linears)
    assert not any(hasattr(m, "_decode_kernel") for m in runner.model.modules())
    rows_seen = []
    real = linears[0].packed_gemm

    class Counting:
        def linear(self, x, *args):
            rows_seen.append(x.shape[0])
            return real.linear(x, *args)

    for module in linears:
        monkeypatch.setattr(module, "packed_gemm", Counting())
    got = [o["output_ids"] for o in engine.generate(prompts, params)]
    assert min(rows_seen) <= len(prompts) < max(rows_seen)  # decode steps and the prompts
    assert got == want
    engine.shutdown()


@needs_kernel
@settings(max_examples=examples(40), deadline=None)
@given(
    rows=st.integers(200, 700),
    leading=st.sampled_from([(), (1,)]),
    with_bias=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_bf16_prefill_linear_pads_rows_for_the_gemm(rows, leading, with_bias, seed) -> None:
    """Prefill-sized inputs reach torch's product with their rows padded to a multiple of
    ``ROW_MULTIPLE`` (from ``PAD_FROM_ROWS`` rows on); the result is the unpadded product's."""
    from sglang.srt.layers.quantization import decode_linear

    gen = torch.Generator().manual_seed(seed)
    linear = torch.nn.Linear(48, 40, bias=with_bias).bfloat16()
    assert decode_linear.install([linear]) == 1
    x = torch.randn(*leading, rows, 48, generator=gen).bfloat16()
    seen = []
    real_linear = decode_linear.F.linear

    def spy(inp, *args):
        seen.append(inp.shape[0] if inp.dim() == 2 else inp.shape[-2])
        return real_linear(inp, *args)

    decode_linear.F.linear = spy
    try:
        got = linear(x)
    finally:
        decode_linear.F.linear = real_linear
    want = real_linear(x, linear.weight, linear.bias)
    assert got.shape == want.shape == (*leading, rows, 40)
    padded = rows >= decode_linear.PAD_FROM_ROWS
    multiple = decode_linear.ROW_MULTIPLE
    assert seen == [-(-rows // multiple) * multiple if padded else rows]
    scale = x.float().abs() @ linear.weight.float().abs().t() + 1
    assert ((got.float() - want.float()).abs() / scale).max() < 2**-8
