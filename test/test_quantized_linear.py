"""The int8 / int4 weight-only linears (``layers/quantized_linear.py`` over
``kernels/csrc/linear_quant.cpp``) against a float64 reference.

The reference reads the layouts from their definition (``quant_reference``, its own nibble
unpacking), so a kernel and a quantizer that agreed on a wrong layout would still fail. Each
output is bounded by its own rounding: float32 sums over ``in`` products, then one rounding to
bfloat16."""

from __future__ import annotations

import pytest
import torch
from conftest import examples, needs_compiler
from hypothesis import given, settings
from hypothesis import strategies as st
from quant_reference import int4_codes, weight_int4, weight_int8
from torch import nn

from sglang.srt import kernels
from sglang.srt.layers.packed_linear import native_gemm
from sglang.srt.layers.quantized_linear import (
    MAX_ROWS,
    QuantizedLinear,
    pack_int4,
    quantize_int4,
    quantize_int8,
    unpack_int4,
)

KERNEL = kernels.load("linear_quant")
GROUPS = (32, 64, 128, 256)


def _assert_within_rounding(
    got: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> None:
    """|got - (x W^T + b)| <= bfloat16's rounding of the result + float32 sums' error."""
    reference = x.double() @ weight.T + (0 if bias is None else bias.double())
    magnitude = x.double().abs() @ weight.abs().T
    in_features = x.shape[1]
    bound = 2.0**-8 * reference.abs() + 4 * in_features * 2.0**-24 * magnitude + 1e-30
    error = (got.double() - reference).abs()
    assert (error <= bound).all(), (error / bound).max().item()


def _random_int8(rows: int, out_features: int, in_features: int, seed: int):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, in_features, generator=generator).bfloat16()
    q = torch.randint(-128, 128, (out_features, in_features), generator=generator).to(torch.int8)
    scale = torch.rand(out_features, generator=generator) * 0.02 + 1e-4
    return x, q, scale


def _random_int4(rows: int, out_features: int, in_features: int, group: int, seed: int):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, in_features, generator=generator).bfloat16()
    q = torch.randint(0, 256, (out_features, in_features // 2), generator=generator)
    groups = (out_features, in_features // group)
    scale = (torch.rand(groups, generator=generator) * 0.02).bfloat16()
    low = (torch.randn(groups, generator=generator) * 0.1).bfloat16()
    return x, q.to(torch.uint8), scale, low


@settings(max_examples=examples(40), deadline=None)
@given(
    rows=st.integers(1, 64),
    out_features=st.integers(1, 80),
    in_features=st.integers(1, 300),
    bias=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_int8_matches_float64(rows, out_features, in_features, bias, seed) -> None:
    x, q, scale = _random_int8(rows, out_features, in_features, seed)
    b = torch.randn(out_features).bfloat16() if bias else None
    got = KERNEL.linear_int8(x, q, scale, b)
    weight = weight_int8(q, scale)
    _assert_within_rounding(got, x, weight, b)


@settings(max_examples=examples(40), deadline=None)
@given(
    rows=st.integers(1, 64),
    out_features=st.integers(1, 80),
    blocks=st.integers(1, 8),
    group=st.sampled_from(GROUPS),
    bias=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_int4_matches_float64(rows, out_features, blocks, group, bias, seed) -> None:
    in_features = max(group, 64) * blocks
    x, q, scale, low = _random_int4(rows, out_features, in_features, group, seed)
    b = torch.randn(out_features).bfloat16() if bias else None
    got = KERNEL.linear_int4(x, q, scale, low, group, b)
    weight = weight_int4(q, scale, low, group)
    _assert_within_rounding(got, x, weight, b)


@needs_compiler
@pytest.mark.parametrize("bits, group", [(8, None), (4, 32), (4, 64), (4, 256)])
def test_the_portable_path_matches_float64_too(bits, group) -> None:
    """The plain C++ path (CPUs without AVX512-BF16), built here with SGLANG_PORTABLE_KERNELS:
    within rounding of float64, and its dequantized weights bit for bit the vector path's."""
    portable = kernels.load_portable("linear_quant")
    assert portable is not None and portable.isa() == "portable"
    for rows, out_features, seed in ((1, 33, 7), (5, 70, 8), (20, 9, 9)):
        if bits == 8:
            x, q, scale = _random_int8(rows, out_features, 300, seed)
            b = torch.randn(out_features).bfloat16()
            got = portable.linear_int8(x, q, scale, b)
            _assert_within_rounding(got, x, weight_int8(q, scale), b)
            same = torch.equal(portable.dequantize_int8(q, scale), KERNEL.dequantize_int8(q, scale))
        else:
            x, q, scale, low = _random_int4(rows, out_features, 512, group, seed)
            got = portable.linear_int4(x, q, scale, low, group)
            _assert_within_rounding(got, x, weight_int4(q, scale, low, group))
            same = torch.equal(
                portable.dequantize_int4(q, scale, low, group),
                KERNEL.dequantize_int4(q, scale, low, group),
            )
        assert same


def test_a_misread_layout_falls_outside_the_bound() -> None:
    """The bound is tight enough to see the layout: the same codes read with the nibbles of
    each byte swapped, or the int8 high nibble taken unsigned, fail it."""
    x, q, scale, low = _random_int4(4, 48, 256, 64, seed=1)
    got = KERNEL.linear_int4(x, q, scale, low, 64)
    swapped = ((q & 0x0F) << 4) | (q >> 4)
    with pytest.raises(AssertionError):
        _assert_within_rounding(got, x, weight_int4(swapped, scale, low, 64))
    x, q, scale = _random_int8(4, 48, 256, seed=2)
    got = KERNEL.linear_int8(x, q, scale)
    with pytest.raises(AssertionError):
        _assert_within_rounding(got, x, weight_int8((q.long() & 0xFF).to(torch.uint8), scale))


@pytest.mark.parametrize("bits, group", [(8, None), *[(4, g) for g in GROUPS]])
def test_dequantized_weight_is_the_layouts_weight_in_bfloat16(bits, group) -> None:
    if bits == 8:
        _, q, scale = _random_int8(1, 40, 520, seed=3)
        got, want = KERNEL.dequantize_int8(q, scale), weight_int8(q, scale)
    else:
        _, q, scale, low = _random_int4(1, 40, 512, group, seed=3)
        got, want = KERNEL.dequantize_int4(q, scale, low, group), weight_int4(q, scale, low, group)
    assert got.dtype == torch.bfloat16
    assert ((got.double() - want).abs() <= 2.0**-8 * want.abs() + 1e-30).all()


@pytest.mark.parametrize("bits, group", [(8, None), (4, 32), (4, 128)])
@pytest.mark.parametrize("out_features", [1, 64, 130])
def test_packed_dequantization_is_the_gemms_own_packing(bits, group, out_features) -> None:
    """The prompt path writes the dequantized weight straight into the native GEMM's panels:
    bit for bit what the GEMM's own pack() makes of the dequantized weight."""
    gemm = native_gemm()
    if gemm is None:
        pytest.skip("the native bfloat16 GEMM runs on CPUs with AVX512-BF16 and no AMX only")
    torch.manual_seed(5)
    layer = QuantizedLinear.from_linear(nn.Linear(256, out_features).bfloat16(), bits, group)
    layer.use_kernel(KERNEL, gemm)
    assert torch.equal(layer.dequantized_packed(), gemm.pack(layer.dequantized()))


@settings(max_examples=examples(30), deadline=None)
@given(
    rows=st.integers(MAX_ROWS + 1, 120),
    out_features=st.integers(1, 200),
    in_blocks=st.integers(1, 6),
    spec=st.sampled_from([(8, None), (4, 32), (4, 64), (4, 128)]),
    bias=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_prompt_rows_run_the_gemm_on_panels_dequantized_in_cache(
    rows, out_features, in_blocks, spec, bias, seed
) -> None:
    """Prompt-sized inputs: the layer's fused GEMM (each panel of 64 output columns dequantized
    into a buffer, then the GEMM's tile over every row) gives bit for bit the native GEMM's
    product over the whole weight dequantized into packed panels; tile tails, a masked last
    panel, every group size."""
    gemm = native_gemm()
    if gemm is None or KERNEL is None or not KERNEL.gemm_supported():
        pytest.skip("the native bfloat16 GEMM runs on CPUs with AVX512-BF16 and no AMX only")
    bits, group = spec
    torch.manual_seed(seed)
    in_features = 128 * in_blocks + (2 if bits == 8 and seed % 2 else 0)  # int8: any even size
    linear = nn.Linear(in_features, out_features, bias=bias).bfloat16()
    layer = QuantizedLinear.from_linear(linear, bits, group)
    layer.use_kernel(KERNEL, gemm)
    x = torch.randn(rows, in_features).bfloat16()
    want = gemm.linear(x, layer.dequantized_packed(), layer.bias, out_features)
    assert torch.equal(layer(x), want)


@settings(max_examples=examples(25), deadline=None)
@given(
    out_features=st.integers(1, 40),
    blocks=st.integers(1, 4),
    group=st.sampled_from(GROUPS),
    seed=st.integers(0, 2**16),
)
def test_quantizers_round_to_the_nearest_code(out_features, blocks, group, seed) -> None:
    """Every weight is within half a step of its code (int4: the bfloat16-rounded scale and min
    it is stored with; int8: the float32 scale), and the codes use their whole range."""
    in_features = max(group, 64) * blocks
    generator = torch.Generator().manual_seed(seed)
    weight = torch.randn(out_features, in_features, generator=generator).bfloat16()
    q, scale = quantize_int8(weight)
    error = (weight.double() - weight_int8(q, scale)).abs()
    assert (error <= scale.double()[:, None] / 2 * (1 + 2.0**-15)).all()  # float32 scale
    assert (q.abs().amax(dim=1) == 127).all()
    packed, scale4, low = quantize_int4(weight, group)
    assert torch.equal(unpack_int4(packed), int4_codes(packed).to(torch.uint8))
    assert torch.equal(pack_int4(unpack_int4(packed)), packed)
    step = scale4.double().repeat_interleave(group, 1)
    error = (weight.double() - weight_int4(packed, scale4, low, group)).abs()
    # half a step, plus the top of a group that the rounded scale and min may miss slightly
    assert (error <= step / 2 + 2.0**-8 * weight.double().abs().amax() + 1e-12).all()


@pytest.mark.parametrize("bits, group", [(8, None), (4, 32), (4, 128)])
def test_the_layer_agrees_on_both_of_its_paths(bits: int, group: int | None) -> None:
    """Decode-sized inputs run on the kernel, larger ones on a GEMM (the native one where the CPU
    has it, else torch's) over the dequantized weight; torch's path (no kernel) is the last.
    Each is within rounding of float64."""
    torch.manual_seed(4)
    linear = nn.Linear(256, 72, bias=True).bfloat16()
    layer = QuantizedLinear.from_linear(linear, bits, group)
    layer.use_kernel(KERNEL)
    weight = layer.dequantized().double()  # the kernel's own dequantization, checked above
    bias = layer.bias
    for rows in (1, MAX_ROWS, MAX_ROWS + 1, 40):
        x = torch.randn(rows, 1, 256).bfloat16()  # leading dims reshaped: rows in all
        for kernel, gemm in ((KERNEL, native_gemm()), (KERNEL, None), (None, None)):
            layer.use_kernel(kernel, gemm)
            got = layer(x).reshape(-1, 72)
            # the GEMM path multiplies the bfloat16-rounded weight: bound it against that
            exact = (
                weight_int8(layer.qweight, layer.scale)
                if bits == 8
                else weight_int4(layer.qweight, layer.scale, layer.min, group)
            )
            reference = weight if (rows > MAX_ROWS or kernel is None) else exact
            _assert_within_rounding(got, x.reshape(-1, 256), reference, bias)
