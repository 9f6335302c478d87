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
from quant_reference import exact_weight, int4_codes, int8_codes, weight_int4, weight_int8
from torch import nn

from sglang.srt import kernels
from sglang.srt.layers.packed_linear import native_gemm
from sglang.srt.layers.quantized_linear import (
    MAX_ROWS,
    QuantizedLinear,
    pack_int4,
    pack_int8,
    quantize_int4,
    quantize_int8,
    unpack_int4,
    unpack_int8,
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


def _int8_product(kernel, x, q, scale, bias=None):
    """``linear_int8`` on row-major codes: packed into panels, x padded to whole input pairs."""
    codes, scales = pack_int8(q, scale)
    if x.shape[1] % 2:
        x = torch.nn.functional.pad(x, (0, 1))
    return kernel.linear_int8(x.contiguous(), codes, scales, bias, q.shape[0])


@settings(max_examples=examples(40), deadline=None)
@given(
    rows=st.integers(1, 64),
    out_features=st.integers(1, 150),
    in_features=st.integers(1, 300),
    bias=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_int8_matches_float64(rows, out_features, in_features, bias, seed) -> None:
    x, q, scale = _random_int8(rows, out_features, in_features, seed)
    b = torch.randn(out_features).bfloat16() if bias else None
    got = _int8_product(KERNEL, x, q, scale, b)
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
    within rounding of float64, and its dequantized int4 weights bit for bit the vector
    path's."""
    portable = kernels.load_portable("linear_quant")
    assert portable is not None and portable.isa() == "portable"
    for rows, out_features, seed in ((1, 33, 7), (5, 70, 8), (20, 9, 9)):
        if bits == 8:
            x, q, scale = _random_int8(rows, out_features, 300, seed)
            b = torch.randn(out_features).bfloat16()
            got = _int8_product(portable, x, q, scale, b)
            _assert_within_rounding(got, x, weight_int8(q, scale), b)
            same = True
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
    each byte swapped, int8 codes taken unsigned, or int8 panels read with the two inputs of
    each pair swapped, fail it."""
    x, q, scale, low = _random_int4(4, 48, 256, 64, seed=1)
    got = KERNEL.linear_int4(x, q, scale, low, 64)
    swapped = ((q & 0x0F) << 4) | (q >> 4)
    with pytest.raises(AssertionError):
        _assert_within_rounding(got, x, weight_int4(swapped, scale, low, 64))
    x, q, scale = _random_int8(4, 48, 256, seed=2)
    got = _int8_product(KERNEL, x, q, scale)
    _assert_within_rounding(got, x, weight_int8(q, scale))
    with pytest.raises(AssertionError):
        _assert_within_rounding(got, x, weight_int8((q.long() & 0xFF).to(torch.uint8), scale))
    pairs_swapped = q.reshape(48, 128, 2).flip(2).reshape(48, 256)
    with pytest.raises(AssertionError):
        _assert_within_rounding(got, x, weight_int8(pairs_swapped, scale))


@pytest.mark.parametrize("bits, group", [(8, None), *[(4, g) for g in GROUPS]])
def test_dequantized_weight_is_the_layouts_weight_in_bfloat16(bits, group) -> None:
    if bits == 8:
        _, q, scale = _random_int8(1, 40, 519, seed=3)
        layer = QuantizedLinear(519, 40, 8, None, dict(zip(("qweight", "scale"),
                                pack_int8(q, scale))), None)  # fmt: skip
        got, want = layer.dequantized(), weight_int8(q, scale)
        assert torch.equal(unpack_int8(layer.qweight, 40, 519), q)
        assert torch.equal(int8_codes(layer.qweight, 40, 519), q.long())
    else:
        _, q, scale, low = _random_int4(1, 40, 512, group, seed=3)
        got, want = KERNEL.dequantize_int4(q, scale, low, group), weight_int4(q, scale, low, group)
    assert got.dtype == torch.bfloat16
    assert ((got.double() - want).abs() <= 2.0**-8 * want.abs() + 1e-30).all()


@pytest.mark.parametrize("bits, group", [(4, 32), (4, 128)])
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
    group=st.sampled_from([32, 64, 128]),
    bias=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_int4_prompt_rows_run_the_gemm_on_panels_dequantized_in_cache(
    rows, out_features, in_blocks, group, bias, seed
) -> None:
    """int4 prompt-sized inputs: the layer's fused GEMM (each panel of 64 output columns
    dequantized into a buffer, then the GEMM's tile over every row) gives bit for bit the
    native GEMM's product over the whole weight dequantized into packed panels; tile tails, a
    masked last panel, every group size."""
    gemm = native_gemm()
    if gemm is None or KERNEL is None or not KERNEL.gemm_supported():
        pytest.skip("the native bfloat16 GEMM runs on CPUs with AVX512-BF16 and no AMX only")
    torch.manual_seed(seed)
    linear = nn.Linear(128 * in_blocks, out_features, bias=bias).bfloat16()
    layer = QuantizedLinear.from_linear(linear, 4, group)
    layer.use_kernel(KERNEL, gemm)
    x = torch.randn(rows, 128 * in_blocks).bfloat16()
    want = gemm.linear(x, layer.dequantized_packed(), layer.bias, out_features)
    assert torch.equal(layer(x), want)


@settings(max_examples=examples(30), deadline=None)
@given(
    rows=st.integers(1, 60),
    out_features=st.integers(1, 150),
    in_features=st.integers(1, 200),
    bias=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_int8_rows_are_the_same_bits_alone_or_in_any_batch(
    rows, out_features, in_features, bias, seed
) -> None:
    """int8 decode rows (codes converted in registers) and prompt chunks (each panel converted
    once into a buffer) multiply the same exact codes in the same order: a row's outputs are
    the same bits alone or in a batch of any size, tile tails and odd sizes included."""
    torch.manual_seed(seed)
    layer = QuantizedLinear.from_linear(nn.Linear(in_features, out_features, bias=bias), 8, None)
    layer.use_kernel(KERNEL)
    x = torch.randn(rows, in_features).bfloat16()
    whole = layer(x)
    _assert_within_rounding(whole, x, exact_weight(layer), layer.bias)
    for row in {0, rows // 2, rows - 1}:
        assert torch.equal(layer(x[row : row + 1])[0], whole[row])
    wider = torch.cat([x, torch.randn(30, in_features).bfloat16()])  # past the decode rows
    assert torch.equal(layer(wider)[:rows], whole)


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
    """int8 runs every row count on its kernel; int4 decode-sized inputs on its kernel, larger
    ones on a GEMM (the native one where the CPU has it, else torch's) over the dequantized
    weight; torch's path (no kernel) is the last. Each is within rounding of float64."""
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
            # torch's path and int4's GEMM multiply the bfloat16-rounded weight: bound them
            # against that; int8's kernel multiplies the exact codes at every row count
            rounded = kernel is None or (bits == 4 and rows > MAX_ROWS)
            reference = weight if rounded else exact_weight(layer)
            _assert_within_rounding(got, x.reshape(-1, 256), reference, bias)
