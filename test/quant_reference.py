"""The weights of the int8 / int4 layouts (``layers/quantized_linear.py``), read from their
definition in float64, independently of the package's own unpacking: the reference for the
kernel tests and for the engine-vs-HF tolerance tests."""

from __future__ import annotations

import torch


def int4_codes(packed: torch.Tensor, out_features: int, in_features: int) -> torch.Tensor:
    """Codes (out, in) of the int4 panel layout: in panel j, pair p, byte t of half h holds
    output 64 j + 32 h + t // 2 (low nibble) and 64 j + 32 h + 16 + t // 2 (high nibble), both
    for input 2 p + t % 2."""
    codes = torch.zeros(out_features, in_features, dtype=torch.int64)
    panels, pairs = packed.shape[:2]
    for j in range(panels):
        for h in range(2):
            for t in range(32):
                column = 64 * j + 32 * h + t // 2
                inputs = torch.arange(pairs) * 2 + t % 2
                keep = inputs < in_features
                byte = packed[j, :, 32 * h + t].long()[keep]
                if column < out_features:
                    codes[column, inputs[keep]] = byte & 0x0F
                if column + 16 < out_features:
                    codes[column + 16, inputs[keep]] = byte >> 4
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
    if layer.bits == 8:
        codes = int8_codes(layer.qweight, out_features, in_features)
        return weight_int8(codes, layer.scale[:out_features])
    codes = int4_codes(layer.qweight, out_features, in_features)
    scale, low = (per_column(t, out_features) for t in (layer.scale, layer.min))
    return weight_int4(codes, scale, low, layer.group)
