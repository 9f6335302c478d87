"""The native CPU kernels against float64 references on random shapes. Decode attention: batch,
GQA ratios, head dims 64/80/128, sequence lengths, scattered slots, sliding windows,
soft-capping, float32 and bfloat16. bfloat16 linears of decode-sized inputs: rows, in / out
features that are and are not multiples of the vector width, bias or none. The engine uses both
for decode steps."""

from __future__ import annotations

import sys

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
    from sglang.srt.layers import decode_linear

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
    from sglang.srt.layers import decode_linear

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
    from sglang.srt.layers import packed_linear

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
    from sglang.srt.layers import decode_linear

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


QUICK_GELU = kernels.load("quick_gelu")
needs_quick_gelu = needs_compiler


@needs_quick_gelu
@settings(max_examples=examples(60), deadline=None)
@given(
    shape=st.sampled_from([(1,), (17,), (3, 33), (64, 80), (2, 5, 48)]),
    scale=st.sampled_from([0.01, 1.0, 8.0, 100.0]),
    seed=st.integers(0, 2**16),
)
def test_quick_gelu_rounds_where_hf_rounds(shape, scale, seed) -> None:
    """bfloat16 x * sigmoid(1.702 x): HF's result, or one unit in the last place from it."""
    from transformers.activations import QuickGELUActivation

    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(shape, generator=gen) * scale).bfloat16()
    specials = torch.tensor([0.0, -0.0, 88.0, -88.0, float("inf"), float("-inf"), float("nan")])
    x = torch.cat([x.flatten(), specials.bfloat16()])
    want = QuickGELUActivation()(x)
    got = QUICK_GELU.quick_gelu(x)
    assert got.dtype == torch.bfloat16 and got.shape == x.shape
    same = (got == want) | (got.isnan() & want.isnan())
    ulp = want.float().abs().clamp_min(2.0**-126) * 2.0**-7
    assert ((got.float() - want.float()).abs()[~same] <= ulp[~same]).all()
    assert same.float().mean() >= 0.99


@needs_quick_gelu
def test_bf16_models_swap_activations_and_float32_keeps_hf() -> None:
    from conftest import model_dir
    from transformers.activations import QuickGELUActivation

    import sglang
    from sglang.srt.layers.native_activation import NativeQuickGELU

    def kinds(engine):
        return {type(m) for m in engine.runner.model.modules()}

    bf16 = sglang.Engine(model_path=model_dir("qwen2_vl"), dtype="bfloat16")
    assert NativeQuickGELU in kinds(bf16) and QuickGELUActivation not in kinds(bf16)
    fp32 = sglang.Engine(model_path=model_dir("qwen2_vl"), dtype="float32")
    assert QuickGELUActivation in kinds(fp32) and NativeQuickGELU not in kinds(fp32)
    for name in ("_silu_and_mul", "_rms_norm"):  # the gated MLPs and the norms likewise
        assert any(hasattr(m, name) for m in bf16.runner.adapter.language_model.modules())
        assert not any(hasattr(m, name) for m in fp32.runner.model.modules())
    for engine in (bf16, fp32):
        engine.shutdown()


SILU_AND_MUL = kernels.load("silu_and_mul")
needs_silu_and_mul = needs_compiler


@needs_silu_and_mul
@settings(max_examples=examples(60), deadline=None)
@given(
    shape=st.sampled_from([(1,), (17,), (3, 33), (64, 80), (2, 5, 48)]),
    scale=st.sampled_from([0.01, 1.0, 8.0, 100.0]),
    seed=st.integers(0, 2**16),
)
def test_silu_and_mul_rounds_where_hf_rounds(shape, scale, seed) -> None:
    """bfloat16 silu(gate) * up: HF's result, or one unit in the last place from it."""
    from transformers.activations import SiLUActivation

    gen = torch.Generator().manual_seed(seed)
    specials = torch.tensor([0.0, -0.0, 88.0, -88.0, -100.0, float("inf"), float("-inf")])
    gate = torch.cat([(torch.randn(shape, generator=gen) * scale).flatten(), specials])
    up = torch.cat([torch.randn(shape, generator=gen).flatten(), torch.ones(7)])
    gate, up = gate.bfloat16(), up.bfloat16()
    want = SiLUActivation()(gate) * up
    got = SILU_AND_MUL.silu_and_mul(gate, up)
    assert got.dtype == torch.bfloat16 and got.shape == gate.shape
    same = (got == want) | (got.isnan() & want.isnan())
    ulp = want.float().abs().clamp_min(2.0**-126) * 2.0**-7
    assert ((got.float() - want.float()).abs()[~same] <= ulp[~same]).all()
    assert same.float().mean() >= 0.99


class _GatedMLP(torch.nn.Module):
    def __init__(self, act: torch.nn.Module) -> None:
        super().__init__()
        self.gate_proj, self.up_proj = torch.nn.Linear(8, 16), torch.nn.Linear(8, 16)
        self.down_proj, self.act_fn = torch.nn.Linear(16, 8), act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """HF's gated MLP."""
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class _ScaledGatedMLP(_GatedMLP):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x) * 2)


@needs_silu_and_mul
def test_gated_silu_mlps_are_routed_only_where_the_forward_is_hfs() -> None:
    """HF's formula with a SiLU reaches the kernel (bfloat16: the same output as HF's, within a
    rounding; float32 input: HF's path); another activation or another formula stays HF's."""
    from transformers.activations import GELUActivation, SiLUActivation

    from sglang.srt.layers import native_activation

    routed = _GatedMLP(SiLUActivation()).bfloat16()
    others = [_GatedMLP(GELUActivation()), _ScaledGatedMLP(torch.nn.SiLU())]
    x = torch.randn(5, 8).bfloat16()
    want = routed(x)
    assert native_activation.install_gated_silu([routed, *others]) == 1
    calls = []
    real = routed._silu_and_mul

    class Spy:
        def silu_and_mul(self, gate, up):
            calls.append(gate.shape)
            return real.silu_and_mul(gate, up)

    routed._silu_and_mul = Spy()
    got = routed(x)
    assert calls == [(5, 16)]
    assert (got.float() - want.float()).abs().max() <= 2**-6 * want.float().abs().max()
    routed.float()
    assert torch.equal(routed(x.float()), _GatedMLP.forward(routed, x.float()))
    assert calls == [(5, 16)]  # float32: HF's path
    assert all("forward" not in vars(m) for m in others)


RMS_NORM = kernels.load("rms_norm")
needs_rms_norm = needs_compiler


def _hf_norm(gemma: bool, width: int, eps: float, gen: torch.Generator) -> torch.nn.Module:
    from transformers.models.gemma3.modeling_gemma3 import Gemma3RMSNorm
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    norm = (Gemma3RMSNorm if gemma else LlamaRMSNorm)(width, eps=eps).bfloat16()
    norm.weight.data = (torch.randn(width, generator=gen) * 2).bfloat16()
    return norm


@needs_rms_norm
@settings(max_examples=examples(60), deadline=None)
@given(
    gemma=st.booleans(),
    shape=st.sampled_from([(1, 16), (3, 33), (64, 80), (2, 5, 48), (7, 1536), (1, 3584)]),
    scale=st.sampled_from([1e-3, 1.0, 8.0, 300.0]),
    eps=st.sampled_from([1e-6, 1e-5]),
    seed=st.integers(0, 2**16),
)
def test_rms_norm_rounds_where_hf_rounds(gemma, shape, scale, eps, seed) -> None:
    """bfloat16 rows through HF's RMSNorm and the kernel, a row of zeros among them: HF's
    result, or near it where the sum of squares, added in another order, moves a rounding.
    Gemma's form rounds once: one unit in the last place. Llama's rounds x / rms, then its
    product with the weight: one unit of the first can become two of the result."""
    gen = torch.Generator().manual_seed(seed)
    norm = _hf_norm(gemma, shape[-1], eps, gen)
    x = (torch.randn(shape, generator=gen) * scale).bfloat16()
    x[(0,) * (x.dim() - 1)] = 0.0
    want = norm(x)
    kernel = RMS_NORM.rms_norm_offset if gemma else RMS_NORM.rms_norm
    got = kernel(x, norm.weight, eps)
    assert got.dtype == torch.bfloat16 and got.shape == x.shape
    same = got == want
    ulp = want.float().abs().clamp_min(2.0**-126) * 2.0**-7
    units = 1 if gemma else 2
    assert ((got.float() - want.float()).abs()[~same] <= units * ulp[~same]).all()
    assert same.float().mean() >= 0.99


class _ShiftedNorm(torch.nn.Module):
    """A Llama RMSNorm with one change (a shifted weight): not HF's definition."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(width))
        self.variance_epsilon = 1e-6

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return (1 + self.weight) * hidden_states.to(input_dtype)


class _ScaledGemmaNorm(torch.nn.Module):
    """Gemma's RMSNorm with one change (the result doubled): not HF's definition."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(width))
        self.eps = 1e-6

    def _norm(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)

    def forward(self, x):
        output = self._norm(x.float())
        output = output * (1.0 + self.weight.float()) * 2
        return output.type_as(x)


@needs_rms_norm
def test_rms_norms_are_routed_only_where_the_forward_is_hfs() -> None:
    """Llama's norms (another argument name too) and Gemma's reach the kernel, within a
    rounding of HF in bfloat16 and by HF's own path in float32; a changed formula of either
    keeps its code."""
    from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLRMSNorm

    from sglang.srt.layers import native_norm

    gen = torch.Generator().manual_seed(0)
    llama = _hf_norm(False, 64, 1e-6, gen)
    qwen = Qwen2VLRMSNorm(64).bfloat16()
    gemma = _hf_norm(True, 64, 1e-6, gen)
    others = [_ShiftedNorm(64).bfloat16(), _ScaledGemmaNorm(64).bfloat16()]
    x = (torch.randn(5, 64, generator=gen) * 4).bfloat16()
    want = [m(x) for m in (llama, qwen, gemma, *others)]
    assert native_norm.install_rms_norms([llama, qwen, gemma, *others]) == 3
    assert all("forward" not in vars(m) for m in others)
    got = gemma(x)
    assert (got.float() - want[2].float()).abs().max() <= 2**-7 * want[2].float().abs().max()

    calls = []
    real = llama._rms_norm

    def spy(x, weight, eps):
        calls.append((x.shape, eps))
        return real(x, weight, eps)

    llama._rms_norm = spy
    for module, expected in zip((llama, qwen), want):
        got = module(x)
        assert (got.float() - expected.float()).abs().max() <= 2**-7 * expected.float().abs().max()
    assert calls == [((5, 64), 1e-6)]
    llama.float()
    assert torch.equal(llama(x.float()), type(llama).forward(llama, x.float()))
    assert len(calls) == 1  # float32: HF's path


@needs_rms_norm
def test_a_bfloat16_gemma_serves_its_norms_on_the_kernel() -> None:
    """Gemma 3's language model (its per-head q and k norms too) in bfloat16: every RMSNorm
    goes through the kernel's Gemma form."""
    from conftest import model_dir

    import sglang

    engine = sglang.Engine(model_path=model_dir("gemma3"), dtype="bfloat16")
    try:
        model = engine.runner.adapter.language_model
        norms = [m for m in model.modules() if type(m).__name__.endswith("RMSNorm")]
        assert norms and all(hasattr(m, "_rms_norm") for m in norms)
        assert any(n.endswith("q_norm") for n, m in model.named_modules() if m in norms)
    finally:
        engine.shutdown()


ROTARY = kernels.load("rotary")
needs_rotary = needs_compiler


@needs_rotary
@settings(max_examples=examples(60), deadline=None)
@given(
    batch=st.integers(1, 2),
    heads=st.integers(1, 4),
    kv_heads=st.integers(1, 2),
    tokens=st.integers(1, 40),
    dim=st.sampled_from([2, 16, 40, 64, 80, 128]),
    transposed=st.booleans(),
    scale=st.sampled_from([1e-3, 1.0, 100.0]),
    seed=st.integers(0, 2**16),
)
def test_rotary_is_hfs_bit_for_bit(
    batch, heads, kv_heads, tokens, dim, transposed, scale, seed
) -> None:
    """bfloat16 q and k (the transposed views HF's attention hands over, or contiguous) rotated
    by the kernel: exactly HF's apply_rotary_pos_emb, infinities and NaNs included."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    gen = torch.Generator().manual_seed(seed)

    def states(h: int) -> torch.Tensor:
        if transposed:
            return (torch.randn(batch, tokens, h, dim, generator=gen) * scale).transpose(1, 2)
        return torch.randn(batch, h, tokens, dim, generator=gen) * scale

    q, k = states(heads).bfloat16(), states(kv_heads).bfloat16()
    q[0, 0, 0, 0], k[-1, -1, -1, -1] = float("inf"), float("nan")
    angles = torch.rand(batch, tokens, dim, generator=gen) * 100
    cos, sin = angles.cos().bfloat16(), angles.sin().bfloat16()
    want = apply_rotary_pos_emb(q, k, cos, sin)
    got = ROTARY.rotary_pair(q, k, cos, sin)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == torch.bfloat16 and g.shape == w.shape
        assert torch.equal(g.isnan(), w.isnan()) and torch.equal(g.nan_to_num(), w.nan_to_num())


def test_rotary_is_routed_only_where_the_function_is_hfs() -> None:
    """HF's Llama-style function is recognised (through its decorator); one with another formula
    or another signature is not; a bfloat16 engine's language model rotates through the kernel,
    which returns HF's tensors."""
    from conftest import model_dir
    from transformers.models.llama import modeling_llama

    import sglang
    from sglang.srt.layers import native_rotary

    def shifted(q, k, cos, sin, unsqueeze_dim=1):
        cos = cos.unsqueeze(unsqueeze_dim)
        sin = sin.unsqueeze(unsqueeze_dim)
        q_embed = q * cos + modeling_llama.rotate_half(q) * sin
        k_embed = k * cos - modeling_llama.rotate_half(k) * sin
        return (q_embed, k_embed)

    def positional(q, k, cos, sin, position_ids=None, unsqueeze_dim=1):
        return modeling_llama.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim)

    hf = getattr(modeling_llama.apply_rotary_pos_emb, "hf_function", None)
    assert native_rotary.is_llama_rotary(hf or modeling_llama.apply_rotary_pos_emb)
    assert not native_rotary.is_llama_rotary(shifted)
    assert not native_rotary.is_llama_rotary(positional)
    if ROTARY is None:
        return
    engine = sglang.Engine(model_path=model_dir("qwen2_vl"), dtype="bfloat16")
    try:
        model = engine.runner.adapter.language_model
        namespace = sys.modules[type(next(iter(model.layers)).self_attn).__module__]
        routed = namespace.apply_rotary_pos_emb
        assert native_rotary.is_llama_rotary(routed.hf_function)
        q, k = torch.randn(1, 4, 3, 16).bfloat16(), torch.randn(1, 2, 3, 16).bfloat16()
        cos, sin = torch.randn(1, 3, 16).bfloat16(), torch.randn(1, 3, 16).bfloat16()
        assert native_rotary._kernel_takes(q, k, cos, sin)  # these go to the kernel
        for args in ((q, k, cos, sin), tuple(t.float() for t in (q, k, cos, sin))):
            got, want = routed(*args), routed.hf_function(*args)
            assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))
    finally:
        engine.shutdown()
