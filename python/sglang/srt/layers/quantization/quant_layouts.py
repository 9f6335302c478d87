"""The int8 and int4 weight layouts of the native kernels: the quantizers (native, with torch's
definitions beside them) and the packers into the native GEMM's panel order, with their inverses.

- int8: per output channel, symmetric: ``W = scale[j] * q[j, k]``, ``q`` in -128..127,
  ``scale = max |W[j]| / 127`` (float32; ``pack_int8``), or in quads of inputs for the int8
  dynamic kernel (``pack_int8_quads``);
- int4: per group of ``group`` inputs, asymmetric: ``W = scale[j, g] * q[j, k] + min[j, g]``,
  ``q`` in 0..15, ``min`` the group's smallest weight, ``scale = (max - min) / 15`` (both
  bfloat16); two codes per byte (``pack_int4``), or in octets for int8 activations
  (``pack_int4_octets``).
"""

from __future__ import annotations

from typing import Any

import torch

from sglang.srt.kernels import ops

PANEL_COLS = ops.PANEL  # output columns per panel of the native GEMM's layout (gemm_tile.h)


def _native_quantizer(weight: torch.Tensor) -> Any:
    """The native kernel's quantizers, where they build and take ``weight``; else None."""
    if weight.device.type != "cpu" or weight.dtype not in (torch.bfloat16, torch.float32):
        return None
    return ops.linear_quant()


def quantize_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(q int8 (out, in), scale float32 (out)) of a weight (out, in): ``quantize_int8_torch``'s
    codes, from the native kernel where it builds (rows in parallel, no float32 copy)."""
    native = _native_quantizer(weight)
    if native is None:
        return quantize_int8_torch(weight)
    q, scale = native.quantize_int8(weight.detach().contiguous())
    return q, scale


def quantize_int8_torch(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The definition: symmetric per row, ``scale = max |W[j]| / 127``, codes rounded half to
    even. One float32 copy of the weight, worked in place."""
    low, high = torch.aminmax(weight.detach(), dim=1)
    largest = torch.maximum(high.float().abs(), low.float().abs())
    scale = (largest / 127).clamp(min=torch.finfo(torch.float32).tiny)
    w = weight.detach().float()
    w.div_(scale[:, None]).round_().clamp_(-128, 127)
    return w.to(torch.int8).contiguous(), scale.contiguous()


def _panels(rows: torch.Tensor) -> torch.Tensor:
    """(out, in) -> (panels, in / 2, 64, 2): out and in zero-padded to whole panels and pairs."""
    out_features, in_features = rows.shape
    panels, pairs = -(-out_features // PANEL_COLS), -(-in_features // 2)
    padded = rows.new_zeros(panels * PANEL_COLS, 2 * pairs)
    padded[:out_features, :in_features] = rows
    return padded.reshape(panels, PANEL_COLS, pairs, 2).permute(0, 2, 1, 3)


def _rows(panels: torch.Tensor, out_features: int, in_features: int) -> torch.Tensor:
    """``_panels``' inverse."""
    count, pairs = panels.shape[:2]
    rows = panels.permute(0, 2, 1, 3).reshape(count * PANEL_COLS, 2 * pairs)
    return rows[:out_features, :in_features]


def _per_column(values: torch.Tensor) -> torch.Tensor:
    """(out, groups) -> (panels, groups, 64), zero past out."""
    out_features, groups = values.shape
    panels = -(-out_features // PANEL_COLS)
    padded = values.new_zeros(panels * PANEL_COLS, groups)
    padded[:out_features] = values
    return padded.reshape(panels, PANEL_COLS, groups).transpose(1, 2).contiguous()


def pack_int8(q: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Codes (out, in) and scales (out) -> codes (panels, pairs, 64, 2), scales (panels * 64)."""
    return _panels(q).contiguous(), _per_column(scale[:, None]).reshape(-1)


def unpack_int8(codes: torch.Tensor, out_features: int, in_features: int) -> torch.Tensor:
    """``pack_int8``'s codes back to (out, in)."""
    return _rows(codes, out_features, in_features)


def pack_int8_quads(
    q: torch.Tensor, scale: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """int8dq's layout (``linear_int8dq.cpp``): codes (out, in) -> (panels, quads, 64, 4), for
    each quad of inputs the four codes of a column side by side; 128 times each column's code
    sum (int32, the unsigned activations' offset); scales (panels * 64). Zero past out and in."""
    out_features, in_features = q.shape
    panels, quads = -(-out_features // PANEL_COLS), -(-in_features // 4)
    padded = q.new_zeros(panels * PANEL_COLS, 4 * quads)
    padded[:out_features, :in_features] = q
    codes = padded.reshape(panels, PANEL_COLS, quads, 4).permute(0, 2, 1, 3).contiguous()
    offset = 128 * padded.sum(dim=1, dtype=torch.int32)
    return codes, offset, _per_column(scale[:, None]).reshape(-1)


def unpack_int8_quads(codes: torch.Tensor, out_features: int, in_features: int) -> torch.Tensor:
    """``pack_int8_quads``' codes back to (out, in)."""
    count, quads = codes.shape[:2]
    rows = codes.permute(0, 2, 1, 3).reshape(count * PANEL_COLS, 4 * quads)
    return rows[:out_features, :in_features]


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """int8dq's activations: (codes (rows, in) as float32 integers in -127..127, scale (rows)
    float32, 0 for a row of zeros), as the kernel makes them (IEEE division, half to even)."""
    xf = x.float()
    largest = xf.abs().amax(dim=-1)
    step = torch.where(largest > 0, largest / 127, torch.ones_like(largest))
    codes = torch.round(xf / step[..., None]).clamp_(-127, 127)
    return codes, torch.where(largest > 0, step, torch.zeros_like(step))


def quantize_int4(
    weight: torch.Tensor, group: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``quantize_int4_torch``'s codes, scales and mins, from the native kernel where it
    builds."""
    native = _native_quantizer(weight)
    if native is None:
        return quantize_int4_torch(weight, group)
    codes, scale, low = native.quantize_int4(weight.detach().contiguous(), group)
    return codes, scale, low


def quantize_int4_torch(
    weight: torch.Tensor, group: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(codes uint8 (out, in) in 0..15, scale bf16 (out, in / group), min bf16 (out, in / group)).
    The codes are chosen against the bfloat16-rounded scale and min they will be used with."""
    out_features, in_features = weight.shape
    groups = weight.detach().reshape(out_features, in_features // group, group)
    low, high = (t.float() for t in torch.aminmax(groups, dim=2))
    scale = ((high - low) / 15).to(torch.bfloat16)
    low = low.to(torch.bfloat16)
    step = scale.float().clamp(min=torch.finfo(torch.float32).tiny)[..., None]
    w = groups.float()
    w.sub_(low.float()[..., None]).div_(step).round_().clamp_(0, 15)
    return w.to(torch.uint8).reshape(out_features, in_features), scale, low


def pack_int4(
    codes: torch.Tensor, scale: torch.Tensor, low: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Codes (out, in), scale and min (out, groups) -> the kernel's layout: codes uint8
    (panels, pairs, 64), where for each pair the 64 bytes are 16 little-endian 32-bit words and
    word l holds column 16 v + l's code of input 2 pair in bits 4 v .. 4 v + 3 and of input
    2 pair + 1 in bits 16 + 4 v .. (v = 0..3: one shift and mask per panel vector); scale and
    min (panels, groups, 64)."""
    out_features, in_features = codes.shape
    count, pairs = -(-out_features // PANEL_COLS), -(-in_features // 2)
    padded = codes.new_zeros(count * PANEL_COLS, 2 * pairs)
    padded[:out_features, :in_features] = codes
    by_vector = padded.view(count, 4, 16, pairs, 2)  # column 64 j + 16 v + l, input 2 p + t
    packed = by_vector[:, 0::2] | (by_vector[:, 1::2] << 4)  # (j, b, l, p, t): v = 2 b + high
    return (
        packed.permute(0, 3, 2, 4, 1).reshape(count, pairs, PANEL_COLS),  # byte 4 l + 2 t + b
        _per_column(scale),
        _per_column(low),
    )


def unpack_int4(packed: torch.Tensor, out_features: int, in_features: int) -> torch.Tensor:
    """``pack_int4``'s codes back to (out, in)."""
    count, pairs = packed.shape[:2]
    nibbles = torch.stack((packed & 0x0F, packed >> 4), dim=-1)  # (.., 64 bytes, 2)
    by_word = nibbles.reshape(count, pairs, 16, 2, 4)  # (.., l, t, v)
    panels = by_word.permute(0, 1, 4, 2, 3).reshape(count, pairs, PANEL_COLS, 2)
    return _rows(panels, out_features, in_features)


def pack_int4_octets(
    codes: torch.Tensor, scale: torch.Tensor, low: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """8da4w's layout (``linear_int8dq.cpp``): codes (out, in), ``in`` a multiple of 32 ->
    uint8 (panels, in / 32, 8, 4, 32): for each 32 inputs, block b of 8 columns and octet o of
    inputs, byte 4 e + i holds column 8 b + e's code of input 8 o + i (low nibble) and of input
    8 o + 4 + i (high nibble); scale and min (panels, groups, 64) as ``pack_int4``'s."""
    out_features, in_features = codes.shape
    assert in_features % 32 == 0
    count = -(-out_features // PANEL_COLS)
    padded = codes.new_zeros(count * PANEL_COLS, in_features)
    padded[:out_features] = codes
    by_octet = padded.view(count, 8, 8, in_features // 32, 4, 2, 4)  # j, b, e, s, o, half, i
    packed = by_octet[..., 0, :] | (by_octet[..., 1, :] << 4)  # j, b, e, s, o, i
    return (
        packed.permute(0, 3, 1, 4, 2, 5).reshape(count, in_features // 32, 8, 4, 32).contiguous(),
        _per_column(scale),
        _per_column(low),
    )


def unpack_int4_octets(packed: torch.Tensor, out_features: int, in_features: int) -> torch.Tensor:
    """``pack_int4_octets``' codes back to (out, in)."""
    count, subs = packed.shape[:2]
    by_byte = packed.view(count, subs, 8, 4, 8, 4)  # j, s, b, o, e, i
    nibbles = torch.stack((by_byte & 0x0F, by_byte >> 4), dim=-2)  # j, s, b, o, e, half, i
    rows = nibbles.permute(0, 2, 4, 1, 3, 5, 6).reshape(count * PANEL_COLS, 32 * subs)
    return rows[:out_features, :in_features]


def int4_skip_reason(in_features: int, group: int) -> str | None:
    if in_features % group:
        return f"in_features {in_features} is not a multiple of the group size {group}"
    return None
