"""Weight-only int8 and int4 linears on a CPU, in the native kernel's own layouts.

A decode step reads every weight once, so its time is the weights' bytes over memory bandwidth:
int8 halves them and int4 quarters them, provided the product runs in the quantized domain and
does not first widen each weight to bfloat16 in memory (torchao's CPU int8 path does that on
every call). ``QuantizedLinear`` holds one copy of each weight, quantized:

- int8: per output channel, symmetric: ``W = scale[j] * q[j, k]``, ``q`` in -128..127,
  ``scale = max |W[j]| / 127`` (float32), stored in the native GEMM's panel order
  (``pack_int8``): for every panel of 64 output columns and pair of inputs, the two codes of each
  column side by side;
- int4: per group of ``group`` inputs, asymmetric: ``W = scale[j, g] * q[j, k] + min[j, g]``,
  ``q`` in 0..15, ``min`` the group's smallest weight, ``scale = (max - min) / 15`` (both
  bfloat16); two inputs per byte, in blocks of 64 inputs (``pack_int4``).

int8 runs every row count on ``linear_int8``, the native GEMM's tile over the codes (each
converted exactly to bfloat16 as it streams, or, for more than 16 rows, once per panel into a
buffer that stays in cache), the scale applied once per output: decode rows and prompt chunks
give the same bits. A 7B-shaped layer's seven products against the row-major codes' dot
products (AMD EPYC, 2 threads): 5.6 against 6.7 ms at one row, 7.8 against 19.1 at 8, 11.6
against 28.7 at 16. int4: inputs of at most ``MAX_ROWS`` rows (decode steps) run on the dot
products in the quantized domain; larger ones (prompt chunks) on the native GEMM's tile
(``gemm_int4``, where the CPU has AVX512-BF16), the weight dequantized one panel of 64 output
columns at a time into a buffer that stays in cache, so it is read once, quantized, and never
exists whole in bfloat16 (a 7B-shaped layer's 512-row chunk: 325 ms against 299 for bfloat16,
450 when each layer was dequantized into packed panels in memory first). Without the kernels,
both widths run on torch's product over the dequantized weight.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from sglang.srt.layers import packed_linear

MAX_ROWS = 16
PANEL_COLS = 64  # output columns per panel of the native GEMM's layout (gemm_tile.h)
INT4_BLOCK = 64  # inputs per packed block: byte b holds input b (low nibble) and 32 + b (high)


def quantize_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(q int8 (out, in), scale float32 (out)) of a weight (out, in)."""
    w = weight.detach().float()
    scale = (w.abs().amax(dim=1) / 127).clamp(min=torch.finfo(torch.float32).tiny)
    q = torch.round(w / scale[:, None]).clamp(-128, 127).to(torch.int8)
    return q.contiguous(), scale.contiguous()


def pack_int8(q: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Codes (out, in) and scales (out) -> the panel layout: codes (panels, pairs, 64, 2) with
    out and in zero-padded to whole panels and pairs, scales (panels * 64) zero-padded."""
    out_features, in_features = q.shape
    panels, pairs = -(-out_features // PANEL_COLS), -(-in_features // 2)
    padded = q.new_zeros(panels * PANEL_COLS, 2 * pairs)
    padded[:out_features, :in_features] = q
    codes = padded.reshape(panels, PANEL_COLS, pairs, 2).permute(0, 2, 1, 3).contiguous()
    scales = scale.new_zeros(panels * PANEL_COLS)
    scales[:out_features] = scale
    return codes, scales


def unpack_int8(codes: torch.Tensor, out_features: int, in_features: int) -> torch.Tensor:
    """``pack_int8``'s codes back to (out, in)."""
    panels, pairs = codes.shape[:2]
    rows = codes.permute(0, 2, 1, 3).reshape(panels * PANEL_COLS, 2 * pairs)
    return rows[:out_features, :in_features]


def quantize_int4(
    weight: torch.Tensor, group: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(packed q uint8 (out, in / 2), scale bf16 (out, in / group), min bf16 (out, in / group)).
    The codes are chosen against the bfloat16-rounded scale and min they will be used with."""
    out_features, in_features = weight.shape
    w = weight.detach().float().reshape(out_features, in_features // group, group)
    low, high = w.amin(dim=2), w.amax(dim=2)
    scale = ((high - low) / 15).to(torch.bfloat16)
    low = low.to(torch.bfloat16)
    step = scale.float().clamp(min=torch.finfo(torch.float32).tiny)[..., None]
    q = torch.round((w - low.float()[..., None]) / step).clamp(0, 15).to(torch.uint8)
    return pack_int4(q.reshape(out_features, in_features)), scale, low


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """Codes (out, in) in 0..15 -> bytes (out, in / 2) in blocks of ``INT4_BLOCK`` inputs."""
    out_features, in_features = q.shape
    blocks = q.reshape(out_features, in_features // INT4_BLOCK, 2, INT4_BLOCK // 2)
    return (blocks[:, :, 0] | (blocks[:, :, 1] << 4)).reshape(out_features, -1).contiguous()


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """``pack_int4``'s inverse: codes (out, in) in 0..15."""
    out_features = packed.shape[0]
    blocks = packed.reshape(out_features, -1, 1, INT4_BLOCK // 2)
    return torch.cat([blocks & 0x0F, blocks >> 4], dim=2).reshape(out_features, -1)


def int4_skip_reason(in_features: int, group: int) -> str | None:
    if in_features % group or in_features % INT4_BLOCK:
        return f"in_features {in_features} is not a multiple of 64 and of the group size {group}"
    return None


class QuantizedLinear(nn.Module):
    """An ``nn.Linear`` whose weight is stored int8 or int4 (see the module docstring)."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bits: int,
        group: int | None,
        tensors: dict[str, torch.Tensor],
        bias: torch.Tensor | None,
    ) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.bits, self.group = bits, group
        self.qweight = nn.Buffer(tensors["qweight"])
        self.scale = nn.Buffer(tensors["scale"])
        self.min = nn.Buffer(tensors["min"]) if "min" in tensors else None
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)
        self._kernel: Any = None
        self._gemm: Any = None

    @classmethod
    def from_linear(cls, linear: nn.Linear, bits: int, group: int | None) -> QuantizedLinear:
        if bits == 8:
            q, scale = pack_int8(*quantize_int8(linear.weight))
            tensors = {"qweight": q, "scale": scale}
        else:
            assert group is not None and int4_skip_reason(linear.in_features, group) is None
            q, scale, low = quantize_int4(linear.weight, group)
            tensors = {"qweight": q, "scale": scale, "min": low}
        bias = None if linear.bias is None else linear.bias.detach().to(torch.bfloat16)
        return cls(linear.in_features, linear.out_features, bits, group, tensors, bias)

    def use_kernel(self, kernel: Any, gemm: Any = None) -> None:
        """The compiled ``linear_quant`` module, or None for torch's product throughout; and
        the native bfloat16 GEMM (its presence says the kernel's fused GEMM may serve prompt
        rows), or None for torch's product over the dequantized weight."""
        self._kernel = kernel
        fused = kernel is not None and kernel.gemm_supported() and self.bits == 4
        self._gemm = gemm if fused else None

    def dequantized(self) -> torch.Tensor:
        """The bfloat16 weight (out, in) this layer stands for."""
        if self.bits == 8:
            q = unpack_int8(self.qweight, self.out_features, self.in_features)
            return (q.float() * self.scale[: self.out_features, None]).to(torch.bfloat16)
        if self._kernel is not None:
            return self._kernel.dequantize_int4(self.qweight, self.scale, self.min, self.group)
        codes = unpack_int4(self.qweight).float()
        assert self.group is not None and self.min is not None
        scale = self.scale.float().repeat_interleave(self.group, dim=1)
        low = self.min.float().repeat_interleave(self.group, dim=1)
        return torch.addcmul(low, codes, scale).to(torch.bfloat16)

    def dequantized_packed(self) -> torch.Tensor:
        """int4: ``dequantized()`` in the native GEMM's packed panels, written in one pass."""
        assert self.bits == 4
        return self._kernel.dequantize_int4_packed(self.qweight, self.scale, self.min, self.group)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // self.in_features
        native = self._kernel is not None and rows > 0 and x.dtype == torch.bfloat16
        if native and self.bits == 8:
            flat = x.reshape(rows, self.in_features)
            if self.in_features % 2:  # the codes' zero input pairs with a zero
                flat = F.pad(flat, (0, 1))
            out = self._kernel.linear_int8(
                flat.contiguous(), self.qweight, self.scale, self.bias, self.out_features
            )
            return out.reshape(*x.shape[:-1], self.out_features)
        if native and rows <= MAX_ROWS:
            flat = x.reshape(rows, self.in_features).contiguous()
            out = self._kernel.linear_int4(
                flat, self.qweight, self.scale, self.min, self.group, self.bias
            )
            return out.reshape(*x.shape[:-1], self.out_features)
        if native and self._gemm is not None:
            flat = x.reshape(rows, self.in_features).contiguous()
            out = self._kernel.gemm_int4(
                flat, self.qweight, self.scale, self.min, self.group, self.bias
            )
            return out.reshape(*x.shape[:-1], self.out_features)
        return F.linear(x.to(torch.bfloat16), self.dequantized(), self.bias)

    def extra_repr(self) -> str:
        group = f", group={self.group}" if self.bits == 4 else ""
        return f"in={self.in_features}, out={self.out_features}, int{self.bits}{group}"


def quantize(linear: nn.Linear, bits: int, group: int | None) -> QuantizedLinear:
    """``linear`` quantized, on the native kernels where they build."""
    from sglang.srt import kernels

    layer = QuantizedLinear.from_linear(linear, bits, group)
    layer.use_kernel(kernels.load("linear_quant"), packed_linear.native_gemm())
    return layer


def replace_linears(model: nn.Module, targets: set[nn.Linear], bits: int, group: int | None) -> int:
    """Swap every linear of ``targets`` under ``model`` for its ``QuantizedLinear``, in place;
    returns how many."""
    count = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if child in targets:
                setattr(parent, name, quantize(child, bits, group))
                count += 1
    return count
