"""The weights of the int8 / int4 layouts (``layers/quantization/quantized_linear.py``), read
from their definition in float64, independently of the package's own unpacking: the reference
for the kernel tests and for the engine-vs-HF tolerance tests."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from sglang.srt.layers.quantization.quantized_linear import QuantizedLinear

GROUPS = (32, 64, 128, 256)  # the group sizes the int4 layouts take


def stored_quantized(module: nn.Module) -> bool:
    """A linear stored quantized: the native kernel's layer on a CPU, torchao's tensor on CUDA."""
    weight = getattr(module, "weight", None)
    return isinstance(module, QuantizedLinear) or (
        weight is not None and is_traceable_wrapper_subclass(weight)
    )


def int4_codes(packed: torch.Tensor, out_features: int, in_features: int) -> torch.Tensor:
    """Codes (out, in) of the int4 panel layout: in panel j, pair p, the 64 bytes are 16
    little-endian 32-bit words; word l holds output 64 j + 16 v + l (v = 0..3) for input 2 p in
    bits 4 v .. 4 v + 3 and for input 2 p + 1 in bits 16 + 4 v .. 16 + 4 v + 3."""
    codes = torch.zeros(out_features, in_features, dtype=torch.int64)
    panels, pairs = packed.shape[:2]
    words = packed.reshape(panels, pairs, 16, 4).long()
    words = words[..., 0] | words[..., 1] << 8 | words[..., 2] << 16 | words[..., 3] << 24
    for j in range(panels):
        for v in range(4):
            for lane in range(16):
                column = 64 * j + 16 * v + lane
                if column >= out_features:
                    continue
                for t in range(2):
                    inputs = torch.arange(pairs) * 2 + t
                    keep = inputs < in_features
                    code = (words[j, :, lane] >> (16 * t + 4 * v)) & 0x0F
                    codes[column, inputs[keep]] = code[keep]
    return codes


def per_column(values: torch.Tensor, out_features: int) -> torch.Tensor:
    """(panels, groups, 64) -> (out, groups)."""
    return values.transpose(1, 2).reshape(-1, values.shape[1])[:out_features]


def weight_int8(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """W = scale[j] q[j, k] for codes (out, in)."""
    return q.double() * scale.double()[:, None]


def int8_codes(panels: torch.Tensor, out_features: int, in_features: int) -> torch.Tensor:
    """Codes (out, in) of the panel layout: panel j, pair p, column c, t holds the code of
    output 64 j + c for input 2 p + t."""
    codes = torch.zeros(out_features, in_features, dtype=torch.int64)
    for j in range(panels.shape[0]):
        for c in range(64):
            if 64 * j + c < out_features:
                codes[64 * j + c] = panels[j, :, c, :].reshape(-1)[:in_features].long()
    return codes


def weight_int4(
    codes: torch.Tensor, scale: torch.Tensor, low: torch.Tensor, group: int
) -> torch.Tensor:
    """W = scale[j, g] q[j, k] + min[j, g], g = k // group, exact (codes, scale, min per row)."""
    per_input_scale = scale.double().repeat_interleave(group, 1)
    return codes.double() * per_input_scale + low.double().repeat_interleave(group, 1)


def exact_weight(layer: torch.nn.Module) -> torch.Tensor:
    """The float64 weight (out, in) a ``QuantizedLinear`` stands for, read from its layout."""
    out_features, in_features = layer.out_features, layer.in_features
    if layer.dynamic and layer.bits == 8:
        codes = int8_quad_codes(layer.qweight, out_features, in_features)
        return weight_int8(codes, layer.scale[:out_features])
    if layer.bits == 8:
        codes = int8_codes(layer.qweight, out_features, in_features)
        return weight_int8(codes, layer.scale[:out_features])
    unpack = int4_octet_codes if layer.dynamic else int4_codes
    codes = unpack(layer.qweight, out_features, in_features)
    scale, low = (per_column(t, out_features) for t in (layer.scale, layer.min))
    return weight_int4(codes, scale, low, layer.group)


def exact_embedding(embedding: torch.nn.Module) -> torch.Tensor:
    """The float64 table (vocab, dim) an int8 embedding stands for: row r is scale[r] q[r]."""
    return weight_int8(embedding.qweight, embedding.scale)


def int8_quad_codes(panels: torch.Tensor, out_features: int, in_features: int) -> torch.Tensor:
    """Codes (out, in) of int8dq's layout: panel j, quad i, column c, t holds the code of output
    64 j + c for input 4 i + t (read as ``int8_codes`` reads pairs: a column's inputs in turn)."""
    return int8_codes(panels, out_features, in_features)


def quantized_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The dynamic modes' activations from their definition: each row of x quantized
    symmetrically to -127..127 by max |row| / 127 (in float32, as torch divides); (codes, step
    (rows, 1), 0 for a row of zeros), float64."""
    xf = x.float()
    largest = xf.abs().amax(dim=-1, keepdim=True)
    step = torch.where(largest > 0, largest / 127, torch.ones_like(largest))
    p = torch.round(xf / step).clamp(-127, 127).double()
    return p, torch.where(largest > 0, step, torch.zeros_like(step)).double()


def dynamic_int8(x: torch.Tensor, codes: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """int8dq's product in float64, from its definition: rows quantized (``quantized_rows``),
    integer sums, dequantized."""
    p, step = quantized_rows(x)
    return (p @ codes.double().T) * step * scale.double()


def int4_octet_codes(packed: torch.Tensor, out_features: int, in_features: int) -> torch.Tensor:
    """Codes (out, in) of 8da4w's layout: in panel j, block s of 32 inputs, column block b and
    octet o, byte 4 e + i holds output 64 j + 8 b + e's code of input 32 s + 8 o + i in its low
    nibble and of input 32 s + 8 o + 4 + i in its high one (each byte's place computed from its
    flat index)."""
    panels, blocks = packed.shape[:2]
    index = torch.arange(packed.numel())
    e, i = index % 32 // 4, index % 4
    o, b = index // 32 % 4, index // 128 % 8
    s, j = index // 1024 % blocks, index // (1024 * blocks)
    column, first = 64 * j + 8 * b + e, 32 * s + 8 * o + i
    values = packed.reshape(-1).long()
    codes = torch.zeros(panels * 64, blocks * 32, dtype=torch.int64)
    codes[column, first] = values & 0x0F
    codes[column, first + 4] = values >> 4
    return codes[:out_features, :in_features]


def dynamic_int4(
    x: torch.Tensor, codes: torch.Tensor, scale: torch.Tensor, low: torch.Tensor, group: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """8da4w's product in float64, from its definition: rows quantized (``quantized_rows``),
    per group the integer sums of codes times activation codes and of activation codes, times
    the group's scale and min (out, groups); and the magnitude of its terms, sum over groups of
    |scale I| + |min P| times the row's step (for rounding bounds)."""
    p, step = quantized_rows(x)
    rows, groups = p.shape[0], p.shape[1] // group
    by_group = p.reshape(rows, groups, group)
    products = torch.einsum("rgk,cgk->rgc", by_group, codes.double().reshape(-1, groups, group))
    sums = by_group.sum(-1, keepdim=True)
    scale, low = scale.double().T[None], low.double().T[None]
    terms = products * scale, sums * low
    value = (terms[0] + terms[1]).sum(1) * step
    magnitude = (terms[0].abs() + terms[1].abs()).sum(1) * step
    return value, magnitude


class DynamicReference(nn.Module):
    """HF's linear replaced by the dynamic modes' product in float64 (``dynamic_int8``,
    ``dynamic_int4``), in x's dtype: the reference for the engine's int8dq and 8da4w. Like the
    engine's quantized layers it keeps the linear's sizes and a stand-in ``weight`` of the
    model's ``dtype`` (code that calls a linear reads them)."""

    def __init__(self, layer: nn.Module, dtype: torch.dtype) -> None:
        super().__init__()
        out_features, in_features = layer.out_features, layer.in_features
        self.out_features, self.in_features = out_features, in_features
        self.weight = torch.zeros((), dtype=dtype).expand(out_features, in_features)
        self.bits, self.group = layer.bits, layer.group
        if layer.bits == 8:
            self.codes = int8_quad_codes(layer.qweight, out_features, in_features)
            self.scale = layer.scale[:out_features].double()
        else:
            self.codes = int4_octet_codes(layer.qweight, out_features, in_features)
            self.scale, self.low = (per_column(t, out_features) for t in (layer.scale, layer.min))
        self.bias = None if layer.bias is None else layer.bias.double()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        if self.bits == 8:
            y = dynamic_int8(flat, self.codes, self.scale)
        else:
            y = dynamic_int4(flat, self.codes, self.scale, self.low, self.group)[0]
        if self.bias is not None:
            y = y + self.bias
        return y.to(x.dtype).reshape(*x.shape[:-1], -1)
