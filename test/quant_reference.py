"""The weights of the int8 / int4 layouts (``layers/quantized_linear.py``), read from their
definition in float64, independently of the package's own unpacking: the reference for the
kernel tests and for the engine-vs-HF tolerance tests."""

from __future__ import annotations

import torch


def int4_codes(packed: torch.Tensor) -> torch.Tensor:
    """Codes (out, in): in block b of 64 inputs, byte t holds input 64b + t (low nibble) and
    64b + 32 + t (high nibble)."""
    out_features, half = packed.shape
    codes = torch.empty(out_features, half * 2, dtype=torch.int64)
    for t in range(half):
        block, at = divmod(t, 32)
        codes[:, 64 * block + at] = (packed[:, t] & 0x0F).long()
        codes[:, 64 * block + 32 + at] = (packed[:, t] >> 4).long()
    return codes


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
    q: torch.Tensor, scale: torch.Tensor, low: torch.Tensor, group: int
) -> torch.Tensor:
    """W = bfloat16(scale[j, g] q[j, k] + min[j, g]), g = k // group: the sum is exact in
    float64, then rounded to float32 (as one fma rounds) and to bfloat16."""
    per_input_scale = scale.double().repeat_interleave(group, 1)
    exact = int4_codes(q).double() * per_input_scale + low.double().repeat_interleave(group, 1)
    return exact.float().bfloat16().double()


def exact_weight(layer: torch.nn.Module) -> torch.Tensor:
    """The float64 weight (out, in) a ``QuantizedLinear`` stands for."""
    if layer.bits == 8:
        codes = int8_codes(layer.qweight, layer.out_features, layer.in_features)
        return weight_int8(codes, layer.scale[: layer.out_features])
    return weight_int4(layer.qweight, layer.scale, layer.min, layer.group)
