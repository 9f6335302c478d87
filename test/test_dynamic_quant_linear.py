"""The linears with int8 activations quantized per row at run time (``int8dq``: int8 weights;
``8da4w``: int4 weights, per group) over ``kernels/csrc/linear_int8dq.cpp``, against their
definitions: integer sums exact, then per-row and per-column scales, the same bits in any batch
and any span of a long input, the portable build and torch's fallback agreeing with the kernel,
and bounds that see a misread layout or the wrong rounding of activations."""

from __future__ import annotations

import pytest
import torch
from conftest import examples, needs_compiler
from hypothesis import given, settings
from hypothesis import strategies as st
from quant_reference import (
    GROUPS,
    dynamic_int4,
    dynamic_int8,
    exact_weight,
    int4_octet_codes,
    int8_quad_codes,
    per_column,
    weight_int8,
)
from torch import nn

from sglang.srt import kernels
from sglang.srt.layers.quantization.quant_layouts import (
    pack_int4_octets,
    pack_int8_quads,
    quantize_int4,
    quantize_int8,
    unpack_int4_octets,
)
from sglang.srt.layers.quantization.quantized_linear import (
    Int4Dynamic,
    Int8Dynamic,
    QuantizedLinear,
    quantize,
)

DQ_KERNEL = kernels.load("linear_int8dq")


def _assert_dynamic_exact(got: torch.Tensor, x: torch.Tensor, layer: QuantizedLinear) -> None:
    """``got`` is int8dq's product from its definition (``quant_reference.dynamic_int8``: the
    integer sums are exact) up to the kernel's float32 scaling and one rounding to x's dtype
    (bfloat16, or float32)."""
    assert got.dtype == x.dtype
    codes = int8_quad_codes(layer.qweight, layer.out_features, layer.in_features)
    want = dynamic_int8(x, codes, layer.scale[: layer.out_features])
    if layer.bias is not None:
        want = want + layer.bias.double()
    error = (got.double() - want).abs()
    relative = 2.0**-8 if x.dtype == torch.bfloat16 else 2.0**-20
    assert (error <= relative * want.abs() + 2.0**-22 * want.abs().amax() + 1e-30).all(), (
        (error / (relative * want.abs() + 1e-30)).max().item()
    )


def _dynamic_layer(out_features: int, in_features: int, bias: bool, seed: int) -> QuantizedLinear:
    torch.manual_seed(seed)
    linear = nn.Linear(in_features, out_features, bias=bias)
    return quantize(linear, 8, None, dynamic=True)


@settings(max_examples=examples(40), deadline=None)
@given(
    rows=st.integers(1, 120),
    out_features=st.integers(1, 150),
    in_features=st.integers(1, 300),
    bias=st.booleans(),
    seed=st.integers(0, 2**16),
    dtype=st.sampled_from([torch.bfloat16, torch.float32]),
)
def test_int8dq_is_its_definition_and_the_same_bits_in_any_batch(
    rows, out_features, in_features, bias, seed, dtype
) -> None:
    """Tile tails, inputs that are not whole quads, row blocks past one task: the kernel gives
    the definition's integer sums; a row's outputs are the same bits alone or in a batch.
    float32 rows (a model served with float32 activations) are quantized from their own values:
    from bfloat16 values they give the bfloat16 rows' results before the final rounding."""
    layer = _dynamic_layer(out_features, in_features, bias, seed)
    layer.use_kernel(DQ_KERNEL)
    x = torch.randn(rows, in_features, dtype=dtype) * torch.rand(rows, 1, dtype=dtype) * 4
    whole = layer(x)
    _assert_dynamic_exact(whole, x, layer)
    for row in {0, rows // 2, rows - 1}:
        assert torch.equal(layer(x[row : row + 1])[0], whole[row])
    if dtype == torch.float32:
        rounded = x.bfloat16()
        assert torch.equal(layer(rounded.float()).bfloat16(), layer(rounded))


def test_int8dq_spans_of_a_long_input_keep_the_sums_exact() -> None:
    """2,100 inputs are three of the spans each panel is taken by: decode batches of one to
    several tiles and a prompt block still give the definition's sums, a row the same bits in
    any of them."""
    layer = _dynamic_layer(70, 2100, True, seed=5)
    layer.use_kernel(DQ_KERNEL)
    x = torch.randn(110, 2100).bfloat16()
    whole = layer(x)
    _assert_dynamic_exact(whole, x, layer)
    for rows in (1, 5, 7, 13, 16, 99):
        assert torch.equal(layer(x[:rows]), whole[:rows])


@needs_compiler
def test_int8dq_portable_path_and_torch_fallback_agree_with_the_kernel() -> None:
    """The plain C++ loop (CPUs without AVX512-VNNI) gives the vector path's bits; without any
    kernel, torch's simulation is within rounding of the definition."""
    portable = kernels.load_portable("linear_int8dq")
    assert portable is not None and portable.isa() == "portable"
    assert portable.peak_ops(0.01) == 0  # no instruction to measure
    # the vector build's probe (vpdpbusd: 128 operations, ~1 per cycle per thread; AVX2's
    # vpmaddubsw chain: 64) or none (a CPU with neither gets the same portable build)
    if kernels.expected_isa("linear_int8dq") == "portable":
        assert DQ_KERNEL.isa() == "portable" and DQ_KERNEL.peak_ops(0.01) == 0
    else:
        assert DQ_KERNEL.peak_ops(0.02) > 1e10 * torch.get_num_threads()
    layer = _dynamic_layer(130, 301, True, seed=3)
    x = torch.randn(37, 301).bfloat16()
    x[5] = 0  # a row of zeros gives the bias alone
    outs = []
    for kernel in (DQ_KERNEL, portable, None):
        layer.use_kernel(kernel)
        outs.append(layer(x))
        _assert_dynamic_exact(outs[-1], x, layer)
    assert torch.equal(outs[0], outs[1])
    assert torch.equal(outs[0][5], layer.bias)


def test_int8dq_bound_sees_a_misread_layout_or_activation_rounding() -> None:
    """The check is tight enough to fail on the quads read in the other order, on activations
    rounded towards zero instead of to the nearest, and on weight-only int8's result."""
    layer = _dynamic_layer(64, 256, False, seed=5)
    layer.use_kernel(DQ_KERNEL)
    x = torch.randn(8, 256).bfloat16()
    got = layer(x)
    _assert_dynamic_exact(got, x, layer)
    swapped = QuantizedLinear(Int8Dynamic(), 256, 64, {
        "qweight": layer.qweight.flip(3), "scale": layer.scale, "offset": layer.offset,
    }, None)  # fmt: skip
    with pytest.raises(AssertionError):
        _assert_dynamic_exact(got, x, swapped)
    codes = int8_quad_codes(layer.qweight, 64, 256)
    largest = x.float().abs().amax(1, keepdim=True)
    truncated = torch.trunc(x.float() / (largest / 127)).double() @ codes.double().T
    with pytest.raises(AssertionError):
        want = truncated * (largest / 127).double() * layer.scale[:64].double()
        assert ((got.double() - want).abs() <= 2.0**-8 * want.abs() + 1e-30).all()
    weight_only = x.double() @ weight_int8(codes, layer.scale[:64]).T
    with pytest.raises(AssertionError):
        assert ((got.double() - weight_only).abs() <= 2.0**-8 * weight_only.abs()).all()


def test_int8dq_packing_round_trips() -> None:
    q, scale = quantize_int8(torch.randn(70, 13))
    codes, offset, padded = pack_int8_quads(q, scale)
    assert codes.shape == (2, 4, 64, 4) and codes.dtype == torch.int8
    assert torch.equal(int8_quad_codes(codes, 70, 13), q.long())
    assert torch.equal(offset[:70], 128 * q.long().sum(1).int()) and not offset[70:].any()
    assert torch.equal(padded[:70], scale) and not padded[70:].any()


# 8da4w: int4 weights times int8 activations, integer sums per group --------------------------
def _assert_dynamic_int4_exact(got: torch.Tensor, x: torch.Tensor, layer: QuantizedLinear) -> None:
    """``got`` is 8da4w's product from its definition (``quant_reference.dynamic_int4``: exact
    integer sums per group) up to the float32 steps that apply the groups' scales and mins (two
    roundings per group, of at most the terms' magnitude) and one rounding to x's dtype."""
    assert got.dtype == x.dtype
    codes = int4_octet_codes(layer.qweight, layer.out_features, layer.in_features)
    scale, low = (per_column(t, layer.out_features) for t in (layer.scale, layer.min))
    want, magnitude = dynamic_int4(x, codes, scale, low, layer.group)
    if layer.bias is not None:
        want = want + layer.bias.double()
        magnitude = magnitude + layer.bias.double().abs()
    groups = layer.in_features // layer.group
    relative = 2.0**-8 if x.dtype == torch.bfloat16 else 2.0**-23
    bound = relative * want.abs() + (2 * groups + 2) * 2.0**-24 * magnitude + 1e-30
    error = (got.double() - want).abs()
    assert (error <= bound).all(), (error / bound).max().item()


def _dynamic_int4_layer(
    out_features: int, in_features: int, group: int, bias: bool, seed: int
) -> QuantizedLinear:
    torch.manual_seed(seed)
    linear = nn.Linear(in_features, out_features, bias=bias)
    return quantize(linear, 4, group, dynamic=True)


@settings(max_examples=examples(40), deadline=None)
@given(
    rows=st.integers(1, 120),
    out_features=st.integers(1, 150),
    groups=st.integers(1, 4),
    group=st.sampled_from(GROUPS),
    bias=st.booleans(),
    seed=st.integers(0, 2**16),
    dtype=st.sampled_from([torch.bfloat16, torch.float32]),
)
def test_8da4w_is_its_definition_and_the_same_bits_in_any_batch(
    rows, out_features, groups, group, bias, seed, dtype
) -> None:
    """Column tails, every group size, spans and row blocks: the kernel gives the definition's
    integer sums per group; a row's outputs are the same bits alone or in a batch."""
    layer = _dynamic_int4_layer(out_features, groups * group, group, bias, seed)
    layer.use_kernel(DQ_KERNEL)
    x = torch.randn(rows, groups * group, dtype=dtype) * torch.rand(rows, 1, dtype=dtype) * 4
    whole = layer(x)
    _assert_dynamic_int4_exact(whole, x, layer)
    for row in {0, rows // 2, rows - 1}:
        assert torch.equal(layer(x[row : row + 1])[0], whole[row])


def test_8da4w_spans_of_a_long_input_keep_the_sums_exact() -> None:
    """2,048 inputs are four of the spans a row takes a panel by: decode batches and a prompt
    block still give the definition's sums, a row the same bits in any of them."""
    layer = _dynamic_int4_layer(70, 2048, 128, True, seed=5)
    layer.use_kernel(DQ_KERNEL)
    x = torch.randn(110, 2048).bfloat16()
    whole = layer(x)
    _assert_dynamic_int4_exact(whole, x, layer)
    for rows in (1, 5, 16, 99):
        assert torch.equal(layer(x[:rows]), whole[:rows])


@needs_compiler
def test_8da4w_portable_path_and_torch_fallback_agree_with_the_kernel() -> None:
    """The plain C++ loop gives the vector path's bits (the same integer sums and the same
    fused steps in the same order); torch's simulation is within rounding of the definition."""
    portable = kernels.load_portable("linear_int8dq")
    assert portable.int4_isa() == "portable"
    # Where the int8 product has its VNNI tile, 8da4w takes vpdpbusd too.
    assert DQ_KERNEL.int4_isa() == kernels.expected_isa("linear_int8dq")
    layer = _dynamic_int4_layer(130, 320, 64, True, seed=3)
    x = torch.randn(37, 320)
    x[5] = 0  # a row of zeros gives the bias alone
    outs = []
    for kernel in (DQ_KERNEL, portable, None):
        layer.use_kernel(kernel)
        outs.append(layer(x))
        _assert_dynamic_int4_exact(outs[-1], x, layer)
    assert torch.equal(outs[0], outs[1])
    assert torch.equal(outs[0][5], layer.bias.float())


def test_8da4w_bound_sees_a_misread_layout_or_weight_only_int4() -> None:
    """The check fails on the two nibbles of each byte swapped, and on weight-only int4's
    result (the activations not quantized)."""
    layer = _dynamic_int4_layer(64, 256, 32, False, seed=5)
    layer.use_kernel(DQ_KERNEL)
    x = torch.randn(8, 256)
    got = layer(x)
    _assert_dynamic_int4_exact(got, x, layer)
    swapped = QuantizedLinear(Int4Dynamic(32), 256, 64, {
        "qweight": (layer.qweight << 4) | (layer.qweight >> 4), "scale": layer.scale,
        "min": layer.min,
    }, None)  # fmt: skip
    with pytest.raises(AssertionError):
        _assert_dynamic_int4_exact(got, x, swapped)
    weight_only = x.double() @ exact_weight(layer).T
    with pytest.raises(AssertionError):
        assert ((got.double() - weight_only).abs() <= 2.0**-20 * weight_only.abs()).all()


def test_8da4w_packing_round_trips() -> None:
    codes, scale, low = quantize_int4(torch.randn(70, 96), 32)
    packed, scales, mins = pack_int4_octets(codes, scale, low)
    assert packed.shape == (2, 3, 8, 4, 32) and packed.dtype == torch.uint8
    assert torch.equal(int4_octet_codes(packed, 70, 96), codes.long())
    assert torch.equal(unpack_int4_octets(packed, 70, 96), codes)
    assert torch.equal(per_column(scales, 70), scale) and not scales[1, :, 6:].any()
    assert torch.equal(per_column(mins, 70), low)
