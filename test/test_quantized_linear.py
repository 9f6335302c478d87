"""The int8 / int4 weight-only linears (``layers/quantization/quantized_linear.py`` over
``kernels/csrc/linear_quant.cpp``) against a float64 reference.

The reference reads the layouts from their definition (``quant_reference``, its own unpacking of
the panels), so a kernel and a packer that agreed on a wrong layout would still fail. Each
output is bounded by its own rounding: float32 sums over ``in`` products (int4: of the codes and
of the inputs, per group, then scaled), then one rounding to bfloat16."""

from __future__ import annotations

import pytest
import torch
from conftest import examples, needs_compiler
from hypothesis import given, settings
from hypothesis import strategies as st
from quant_reference import (
    GROUPS,
    exact_weight,
    int4_codes,
    int8_codes,
    per_column,
    weight_int4,
    weight_int8,
)
from torch import nn

from sglang.srt import kernels
from sglang.srt.layers.quantization.quant_layouts import (
    pack_int4,
    pack_int8,
    quantize_int4,
    quantize_int4_torch,
    quantize_int8,
    quantize_int8_torch,
    unpack_int4,
    unpack_int8,
)
from sglang.srt.layers.quantization.quantized_linear import (
    Int4WeightOnly,
    Int8WeightOnly,
    QuantizedLinear,
    quantize,
)

KERNEL = kernels.load("linear_quant")


def _assert_within_rounding(
    got: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    magnitude_weight: torch.Tensor | None = None,
) -> None:
    """|got - (x W^T + b)| <= bfloat16's rounding of the result + float32 sums' error, the sums'
    terms bounded by ``magnitude_weight`` (default |W|; int4: |scale q| + |min|)."""
    reference = x.double() @ weight.T + (0 if bias is None else bias.double())
    terms = weight.abs() if magnitude_weight is None else magnitude_weight
    magnitude = x.double().abs() @ terms.T
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


def _random_int4(
    rows: int, out_features: int, in_features: int, group: int, seed: int, published: bool = False
):
    """x, codes, scale and min: bfloat16 scales and mins as quantized here, or (``published``)
    float32 ones that hold a published checkpoint's float16 scale and integer zero point
    exactly (min = -scale zero)."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, in_features, generator=generator).bfloat16()
    codes = torch.randint(0, 16, (out_features, in_features), generator=generator)
    groups = (out_features, in_features // group)
    if published:
        scale = (torch.rand(groups, generator=generator) * 0.02).half().float()
        low = -scale * torch.randint(0, 16, groups, generator=generator)
    else:
        scale = (torch.rand(groups, generator=generator) * 0.02).bfloat16()
        low = (torch.randn(groups, generator=generator) * 0.1).bfloat16()
    return x, codes.to(torch.uint8), scale, low


def _pad_pairs(x: torch.Tensor) -> torch.Tensor:
    return (torch.nn.functional.pad(x, (0, 1)) if x.shape[1] % 2 else x).contiguous()


def _int8_product(kernel, x, q, scale, bias=None):
    """``linear_int8`` on row-major codes: packed into panels, x padded to whole input pairs."""
    codes, scales = pack_int8(q, scale)
    return kernel.linear_int8(_pad_pairs(x), codes, scales, bias, q.shape[0])


def _int4_product(kernel, x, codes, scale, low, group, bias=None):
    packed, scales, mins = pack_int4(codes, scale, low)
    return kernel.linear_int4(x, packed, scales, mins, group, bias, codes.shape[0])


def _int4_terms(codes, scale, low, group) -> torch.Tensor:
    """The size of the terms the int4 kernel sums, per weight: |scale| (128 + q) (its sums run
    over the codes as bfloat16 128 + q), |scale| 128 (the offset taken off per group) and
    |min|."""
    offset_codes = codes.double() + 256
    return weight_int4(offset_codes, scale.abs(), low.abs(), group)


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
    _assert_within_rounding(got, x, weight_int8(q, scale), b)


@settings(max_examples=examples(40), deadline=None)
@given(
    rows=st.integers(1, 64),
    out_features=st.integers(1, 150),
    groups=st.integers(1, 6),
    group=st.sampled_from(GROUPS),
    bias=st.booleans(),
    seed=st.integers(0, 2**16),
    published=st.booleans(),
)
def test_int4_matches_float64(rows, out_features, groups, group, bias, seed, published) -> None:
    x, codes, scale, low = _random_int4(rows, out_features, group * groups, group, seed, published)
    b = torch.randn(out_features).bfloat16() if bias else None
    got = _int4_product(KERNEL, x, codes, scale, low, group, b)
    weight = weight_int4(codes, scale, low, group)
    _assert_within_rounding(got, x, weight, b, _int4_terms(codes, scale, low, group))


@needs_compiler
@pytest.mark.parametrize("bits, group", [(8, None), (4, 32), (4, 64), (4, 256)])
def test_the_portable_path_matches_float64_too(bits, group) -> None:
    """The plain C++ path (CPUs without AVX512-BF16), built here with SGLANG_PORTABLE_KERNELS:
    within rounding of float64."""
    portable = kernels.load_portable("linear_quant")
    assert portable is not None and portable.isa() == "portable" and not portable.supported()
    for rows, out_features, seed in ((1, 33, 7), (5, 70, 8), (20, 9, 9)):
        b = torch.randn(out_features).bfloat16()
        if bits == 8:
            x, q, scale = _random_int8(rows, out_features, 301, seed)
            got = _int8_product(portable, x, q, scale, b)
            _assert_within_rounding(got, x, weight_int8(q, scale), b)
        else:
            published = rows == 5  # float32 scales and mins
            x, codes, scale, low = _random_int4(rows, out_features, 512, group, seed, published)
            got = _int4_product(portable, x, codes, scale, low, group, b)
            terms = _int4_terms(codes, scale, low, group)
            _assert_within_rounding(got, x, weight_int4(codes, scale, low, group), b, terms)


def test_a_misread_layout_falls_outside_the_bound() -> None:
    """The bound is tight enough to see the layout: int4 codes read with the two nibbles of
    each byte swapped (columns c and c + 16), int8 codes taken unsigned, or either read with
    the two inputs of each pair swapped, fail it."""
    x, codes, scale, low = _random_int4(4, 64, 256, 64, seed=1)
    got = _int4_product(KERNEL, x, codes, scale, low, 64)
    terms = _int4_terms(codes, scale, low, 64)
    _assert_within_rounding(got, x, weight_int4(codes, scale, low, 64), None, terms)
    misread = codes[torch.arange(64) ^ 16]  # columns c and c + 16 of each 32 exchanged
    pairs_swapped = codes.reshape(64, 128, 2).flip(2).reshape(64, 256)
    for wrong in (misread, pairs_swapped):
        with pytest.raises(AssertionError):
            _assert_within_rounding(got, x, weight_int4(wrong, scale, low, 64), None, terms)
    x, q, scale = _random_int8(4, 48, 256, seed=2)
    got = _int8_product(KERNEL, x, q, scale)
    _assert_within_rounding(got, x, weight_int8(q, scale))
    unsigned = (q.long() & 0xFF).to(torch.uint8)
    pairs_swapped = q.reshape(48, 128, 2).flip(2).reshape(48, 256)
    for wrong in (unsigned, pairs_swapped):
        with pytest.raises(AssertionError):
            _assert_within_rounding(got, x, weight_int8(wrong, scale))


@pytest.mark.parametrize("bits, group", [(8, None), *[(4, g) for g in GROUPS]])
@pytest.mark.parametrize("out_features", [1, 40, 64, 130])
def test_packing_round_trips_and_matches_the_layouts_definition(bits, group, out_features):
    """The packers' panels read back to the codes (by the package's own unpacking and by the
    reference's reading of the definition); the dequantized weight is the layout's weight in
    bfloat16."""
    in_features = 512
    if bits == 8:
        _, q, scale = _random_int8(1, out_features, in_features - 1, seed=3)
        codes, scales = pack_int8(q, scale)
        layer = QuantizedLinear(Int8WeightOnly(), in_features - 1, out_features,
                                {"qweight": codes, "scale": scales}, None)  # fmt: skip
        assert torch.equal(unpack_int8(codes, out_features, in_features - 1), q)
        assert torch.equal(int8_codes(codes, out_features, in_features - 1), q.long())
        want = weight_int8(q, scale)
    else:
        _, q, scale, low = _random_int4(1, out_features, in_features, group, seed=3)
        packed, scales, mins = pack_int4(q, scale, low)
        tensors = {"qweight": packed, "scale": scales, "min": mins}
        layer = QuantizedLinear(Int4WeightOnly(group), in_features, out_features, tensors, None)
        assert torch.equal(unpack_int4(packed, out_features, in_features), q)
        assert torch.equal(int4_codes(packed, out_features, in_features), q.long())
        assert torch.equal(per_column(scales, out_features), scale)
        want = weight_int4(q, scale, low, group)
    assert torch.equal(exact_weight(layer), want)
    got = layer.dequantized()
    assert got.dtype == torch.bfloat16
    assert ((got.double() - want).abs() <= 2.0**-8 * want.abs() + 1e-30).all()


@settings(max_examples=examples(30), deadline=None)
@given(
    rows=st.integers(1, 60),
    out_features=st.integers(1, 150),
    in_features=st.integers(1, 200),
    spec=st.sampled_from([(8, None), (4, 32), (4, 64), (4, 128)]),
    bias=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_rows_are_the_same_bits_alone_or_in_any_batch(
    rows, out_features, in_features, spec, bias, seed
) -> None:
    """Decode rows and prompt chunks multiply the same exact codes in the same order (tile by
    tile over spans of each panel): a row's outputs are the same bits alone or in a batch of
    any size, tile tails and odd sizes included; all within rounding of float64."""
    bits, group = spec
    if bits == 4:
        in_features = max(group, in_features // group * group)
    torch.manual_seed(seed)
    linear = nn.Linear(in_features, out_features, bias=bias)
    layer = quantize(linear, bits, group)
    layer.use_kernel(KERNEL)
    x = torch.randn(rows, in_features).bfloat16()
    whole = layer(x)
    weight = exact_weight(layer)
    terms = None
    if bits == 4:
        scale, low = (per_column(t, out_features) for t in (layer.scale, layer.min))
        terms = _int4_terms(layer.codes(), scale, low, group)
    _assert_within_rounding(whole, x, weight, layer.bias, terms)
    for row in {0, rows // 2, rows - 1}:
        assert torch.equal(layer(x[row : row + 1])[0], whole[row])
    wider = torch.cat([x, torch.randn(30, in_features).bfloat16()])  # past the decode rows
    assert torch.equal(layer(wider)[:rows], whole)


@pytest.mark.parametrize("bits, group", [(8, None), (4, 32), (4, 128), (4, 512)])
def test_spans_of_a_long_input_keep_a_rows_bits(bits: int, group: int | None) -> None:
    """Rows take each panel by spans of 128 input pairs, every tile of rows over a span in
    turn, their sums carried between spans: 2,048 inputs are eight spans (int4 group 512: one
    group a span). One row alone, batches of one, two and three tiles, 40 rows, and 1,100 rows
    (three blocks of rows, tasks from a shared counter) give a row the same bits, within
    rounding of float64."""
    torch.manual_seed(3)
    layer = quantize(nn.Linear(2048, 70, bias=True), bits, group)
    layer.use_kernel(KERNEL)
    x = torch.randn(40, 2048).bfloat16()
    whole = layer(x)
    terms = None
    if bits == 4:
        scale, low = (per_column(t, 70) for t in (layer.scale, layer.min))
        terms = _int4_terms(layer.codes(), scale, low, group)
    _assert_within_rounding(whole, x, exact_weight(layer), layer.bias, terms)
    for rows in (1, 6, 7, 8, 13, 16):
        assert torch.equal(layer(x[:rows]), whole[:rows])
    long = torch.cat([x, torch.randn(1060, 2048).bfloat16()])
    assert torch.equal(layer(long)[:40], whole)


@settings(max_examples=examples(40), deadline=None)
@given(
    out_features=st.integers(1, 70),
    groups=st.integers(1, 5),
    group=st.sampled_from(GROUPS),
    dtype=st.sampled_from([torch.bfloat16, torch.float32]),
    magnitude=st.sampled_from([1e-30, 1e-3, 1.0, 1e4]),
    seed=st.integers(0, 2**16),
)
def test_native_quantizers_give_the_torch_definitions_codes(
    out_features, groups, group, dtype, magnitude, seed
) -> None:
    """The kernel's quantizers (what loading runs) against the torch definitions, bit for bit:
    codes, scales and mins, with zero rows, constant groups and scales near float32's
    smallest normal."""
    generator = torch.Generator().manual_seed(seed)
    weight = torch.randn(out_features, groups * group, generator=generator) * magnitude
    weight[0] = 0
    weight[-1, :group] = magnitude
    weight = weight.to(dtype)
    assert KERNEL is not None
    for got, want in zip(KERNEL.quantize_int8(weight), quantize_int8_torch(weight)):
        assert torch.equal(got, want)
    for got, want in zip(KERNEL.quantize_int4(weight, group), quantize_int4_torch(weight, group)):
        assert torch.equal(got, want)


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
    in_features = group * blocks
    generator = torch.Generator().manual_seed(seed)
    weight = torch.randn(out_features, in_features, generator=generator).bfloat16()
    q, scale = quantize_int8(weight)
    error = (weight.double() - weight_int8(q, scale)).abs()
    assert (error <= scale.double()[:, None] / 2 * (1 + 2.0**-15)).all()  # float32 scale
    assert (q.abs().amax(dim=1) == 127).all()
    codes, scale4, low = quantize_int4(weight, group)
    assert codes.dtype == torch.uint8 and int(codes.max()) <= 15
    step = scale4.double().repeat_interleave(group, 1)
    error = (weight.double() - weight_int4(codes, scale4, low, group)).abs()
    # half a step, plus the top of a group that the rounded scale and min may miss slightly
    assert (error <= step / 2 + 2.0**-8 * weight.double().abs().amax() + 1e-12).all()


@pytest.mark.parametrize("bits, group", [(8, None), (4, 32), (4, 128)])
def test_the_layer_agrees_on_both_of_its_paths(bits: int, group: int | None) -> None:
    """The kernel at every row count (the exact codes) and torch's product over the weight
    rounded to bfloat16 (no kernel): each within rounding of float64."""
    torch.manual_seed(4)
    linear = nn.Linear(256, 72, bias=True).bfloat16()
    layer = quantize(linear, bits, group)
    rounded = layer.dequantized().double()
    exact = exact_weight(layer)
    terms = None
    if bits == 4:
        scale, low = (per_column(t, 72) for t in (layer.scale, layer.min))
        terms = _int4_terms(layer.codes(), scale, low, group)
    for rows in (1, 16, 17, 40):
        x = torch.randn(rows, 1, 256).bfloat16()  # leading dims reshaped: rows in all
        for kernel in (KERNEL, None):
            layer.use_kernel(kernel)
            got = layer(x).reshape(-1, 72)
            reference = exact if kernel is not None else rounded
            magnitude = terms if kernel is not None else None
            _assert_within_rounding(got, x.reshape(-1, 256), reference, layer.bias, magnitude)


# int8dq: activations quantized per row at run time, integer products ------------------------
