"""The native elementwise kernels of bfloat16 models against HF's own modules: QuickGELU,
SiLU-and-mul, RMSNorm (Llama's and Gemma's) and rotary embeddings round where HF rounds (bit
for bit, or one unit in the last place), and each is installed only where the HF forward is, by
its syntax tree, the definition the kernel computes."""

from __future__ import annotations

import sys

import torch
from conftest import examples, needs_compiler
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang.srt import kernels

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
