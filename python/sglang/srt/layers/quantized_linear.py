"""Weight-only int8 and int4 linears on a CPU, in the native kernel's own layouts.

A decode step reads every weight once, so its time is the weights' bytes over memory bandwidth:
int8 halves them and int4 quarters them, provided the product runs in the quantized domain and
does not first widen each weight to bfloat16 in memory (torchao's CPU int8 path does that on
every call). ``QuantizedLinear`` holds one copy of each weight, quantized, in the native GEMM's
panel order (for every panel of 64 output columns and pair of inputs, the codes of each column
side by side):

- int8: per output channel, symmetric: ``W = scale[j] * q[j, k]``, ``q`` in -128..127,
  ``scale = max |W[j]| / 127`` (float32; ``pack_int8``);
- int4: per group of ``group`` inputs, asymmetric: ``W = scale[j, g] * q[j, k] + min[j, g]``,
  ``q`` in 0..15, ``min`` the group's smallest weight, ``scale = (max - min) / 15`` (both
  bfloat16); two codes per byte (``pack_int4``).

Every row count runs on ``kernels/csrc/linear_quant.cpp``: the native GEMM's tile over the codes,
each converted exactly to bfloat16 as it streams (or, for more than 16 rows, once per panel into
a buffer that stays in cache), the scales and mins applied to float32 sums: decode rows and
prompt chunks give the same bits, and no weight is ever rounded to bfloat16. A 7B-shaped
layer's seven products (AMD EPYC, 2 threads): int8 4.3 ms at one row, 7.7 at 8, 304 for a
512-row chunk (bfloat16 6.6, 10.4, 293). On CPUs with AVX2 and no AVX512-BF16 the same
panels are read by float32 FMAs (``linear_quant_avx2.h``), and x may be float32: there a
quantized model runs with float32 activations (``dtypes.resolve_launch_dtypes``), since torch's
bfloat16 products run ~40x slower than its float32 ones on such CPUs. Without the kernel,
torch's product runs over the weight dequantized to bfloat16 (float32 for float32 x).
"""

from __future__ import annotations

import functools
import types
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from sglang.srt.layers import packed_linear, page_release

PANEL_COLS = 64  # output columns per panel of the native GEMM's layout (gemm_tile.h)


def _native_quantizer(weight: torch.Tensor) -> Any:
    """The native kernel's quantizers, where they build and take ``weight``; else None."""
    if weight.device.type != "cpu" or weight.dtype not in (torch.bfloat16, torch.float32):
        return None
    from sglang.srt import kernels

    return kernels.load("linear_quant")


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


class QuantizedLinear(nn.Module):
    """An ``nn.Linear`` whose weight is stored int8 or int4 (see the module docstring). With
    ``dynamic`` (SGLang's int8dq with int8 weights, 8da4w-<group> with int4), each row of the
    input is quantized to int8 as it arrives and the product runs in integers
    (``linear_int8dq.cpp``)."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bits: int,
        group: int | None,
        tensors: dict[str, torch.Tensor],
        bias: torch.Tensor | None,
        dynamic: bool = False,
    ) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.bits, self.group, self.dynamic = bits, group, dynamic
        self.qweight = nn.Buffer(tensors["qweight"])
        self.scale = nn.Buffer(tensors["scale"])
        self.min = nn.Buffer(tensors["min"]) if "min" in tensors else None
        self.offset = nn.Buffer(tensors["offset"]) if "offset" in tensors else None
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)
        self._kernel: Any = None
        self._kernel_takes_float32 = False

    @classmethod
    def from_linear(
        cls, linear: nn.Linear, bits: int, group: int | None, dynamic: bool = False
    ) -> QuantizedLinear:
        bias = None if linear.bias is None else linear.bias.detach().to(torch.bfloat16)
        if bits == 8:
            return cls.from_codes(*quantize_int8(linear.weight), bias, 8, dynamic=dynamic)
        assert group is not None and int4_skip_reason(linear.in_features, group) is None
        codes, scale, low = quantize_int4(linear.weight, group)
        return cls.from_codes(codes, scale, bias, 4, group, low, dynamic)

    @classmethod
    def from_codes(
        cls,
        codes: torch.Tensor,
        scale: torch.Tensor,
        bias: torch.Tensor | None,
        bits: int,
        group: int | None = None,
        low: torch.Tensor | None = None,
        dynamic: bool = False,
    ) -> QuantizedLinear:
        """The layer of codes (out, in) and their scales: int8 with a float32 scale per row;
        int4 with a scale and min per row and group (bfloat16, or float32 for a published
        checkpoint's exact values)."""
        out_features, in_features = codes.shape
        if dynamic and bits == 4:
            assert group is not None and low is not None and scale.dtype == torch.bfloat16
            q, scales, mins = pack_int4_octets(codes, scale, low)
            tensors = {"qweight": q, "scale": scales, "min": mins}
        elif dynamic:
            q, offset, scales = pack_int8_quads(codes, scale)
            tensors = {"qweight": q, "scale": scales, "offset": offset}
        elif bits == 8:
            q, scales = pack_int8(codes, scale)
            tensors = {"qweight": q, "scale": scales}
        else:
            assert group is not None and low is not None and scale.dtype == low.dtype
            q, scales, mins = pack_int4(codes, scale, low)
            tensors = {"qweight": q, "scale": scales, "min": mins}
        return cls(in_features, out_features, bits, group, tensors, bias, dynamic)

    def use_kernel(self, kernel: Any) -> None:
        """The compiled ``linear_quant`` (``linear_int8dq`` when dynamic) module, or None for
        torch's product throughout."""
        self._kernel = kernel
        takes = getattr(kernel, "takes_float32", None)  # weight-only builds without AVX512-BF16
        self._kernel_takes_float32 = bool(takes is not None and takes())

    def codes(self) -> torch.Tensor:
        """The codes (out, in)."""
        if self.dynamic:
            unpack = unpack_int8_quads if self.bits == 8 else unpack_int4_octets
        else:
            unpack = unpack_int8 if self.bits == 8 else unpack_int4
        return unpack(self.qweight, self.out_features, self.in_features)

    def _dynamic_product(self, x: torch.Tensor) -> torch.Tensor:
        """The kernel's result without it: integer sums (exact in float64), then its float32
        steps (the roundings left are where the kernel fuses a multiply and an add)."""
        codes, step = quantize_rows(x)
        if self.bits == 8:
            sums = (codes.double() @ self.codes().double().T).float()
            out = sums * (step[:, None] * self.scale[: self.out_features])
        else:
            assert self.group is not None
            rows, groups = codes.shape[0], self.in_features // self.group
            by_group = codes.double().reshape(rows, groups, self.group)
            weight = self.codes().double().reshape(self.out_features, groups, self.group)
            products = torch.einsum("rgk,cgk->rgc", by_group, weight).float()
            scale, low = (t.T.float() for t in self._group_scales())
            partial = products * scale + by_group.sum(-1, keepdim=True).float() * low
            out = partial.sum(1) * step[:, None]
        return (out if self.bias is None else out + self.bias.float()).to(x.dtype)

    def dequantized(self, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        """The weight (out, in) this layer stands for, rounded to ``dtype``."""
        if self.bits == 8:
            scale = self.scale[: self.out_features, None]
            return (self.codes().float() * scale).to(dtype)
        assert self.group is not None
        scale, low = (t.float().repeat_interleave(self.group, dim=1) for t in self._group_scales())
        return torch.addcmul(low, self.codes().float(), scale).to(dtype)

    def _group_scales(self) -> tuple[torch.Tensor, torch.Tensor]:
        """int4: the scale and min (out, groups) from their (panels, groups, 64) layout."""
        assert self.min is not None
        return tuple(
            t.transpose(1, 2).reshape(-1, t.shape[1])[: self.out_features]
            for t in (self.scale, self.min)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """y in bfloat16, or in float32 for float32 x (a model served in float32 on a CPU
        without native bfloat16)."""
        rows = x.numel() // self.in_features
        float32_in = x.dtype == torch.float32
        out_dtype = torch.float32 if float32_in else torch.bfloat16
        if self.dynamic:  # rows quantized from x's own values, float32 ones included
            flat = x.to(out_dtype).reshape(rows, self.in_features).contiguous()
            if self._kernel is None:
                out = self._dynamic_product(flat)
            elif self.bits == 8:
                out = self._kernel.linear(
                    flat, self.qweight, self.offset, self.scale, self.bias, self.out_features
                )
            else:
                out = self._kernel.linear_int4(
                    flat,
                    self.qweight,
                    self.scale,
                    self.min,
                    self.group,
                    self.bias,
                    self.out_features,
                )
            return out.reshape(*x.shape[:-1], self.out_features)
        native = x.dtype == torch.bfloat16 or (float32_in and self._kernel_takes_float32)
        if self._kernel is None or rows == 0 or not native:
            bias = None if self.bias is None else self.bias.to(out_dtype)
            return F.linear(x.to(out_dtype), self.dequantized(out_dtype), bias)
        flat = x.reshape(rows, self.in_features)
        if self.in_features % 2:  # the codes' zero input pairs with a zero
            flat = F.pad(flat, (0, 1))
        flat = flat.contiguous()
        if self.bits == 8:
            out = self._kernel.linear_int8(
                flat, self.qweight, self.scale, self.bias, self.out_features
            )
        else:
            out = self._kernel.linear_int4(
                flat, self.qweight, self.scale, self.min, self.group, self.bias, self.out_features
            )
        return out.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        group = f", group={self.group}" if self.bits == 4 else ""
        kind = ", int8 activations" if self.dynamic else ""
        return f"in={self.in_features}, out={self.out_features}, int{self.bits}{group}{kind}"


def quantize_embedding(embedding: nn.Module) -> bool:
    """Store a plain ``nn.Embedding``'s table in int8 per row (``quantize_int8``: a row is one
    token's vector, so its scale is the row's), in place; returns whether it did. A lookup
    returns the rows as the table would hold them dequantized (each value ``scale * q``
    rounded once to the table's dtype). The ``weight`` keeps its shape, dtype and device over a
    one-element storage (HF code reads them). Subclasses (Gemma's scaled embeddings), tables
    with ``max_norm`` and tables another module shares (a tied LM head) are left as they are."""
    weight = getattr(embedding, "weight", None)
    if type(embedding) is not nn.Embedding or embedding.max_norm is not None:
        return False
    if weight is None or weight.device.type != "cpu" or not weight.is_floating_point():
        return False
    q, scale = quantize_int8(weight)
    embedding.register_buffer("qweight", q)
    embedding.register_buffer("scale", scale)
    weight.data = packed_linear.stand_in(weight)
    embedding.forward = types.MethodType(_quantized_lookup, embedding)
    return True


def _quantized_lookup(self: nn.Embedding, ids: torch.Tensor) -> torch.Tensor:
    rows = self.qweight[ids].double() * self.scale[ids].double()[..., None]  # exact
    return rows.to(self.weight.dtype)


def serve_lookups_from_head(embedding: nn.Embedding, head: QuantizedLinear) -> None:
    """``embedding``'s lookups read rows of ``head``'s int8 codes, and its own table goes: for a
    table tied to the head, quantized per output channel (one token's row), whose codes and
    scales are those ``quantize_embedding`` would give the table."""
    assert head.bits == 8  # int8dq's quads are read per column as the pairs are
    embedding.weight.data = packed_linear.stand_in(embedding.weight)
    embedding.forward = functools.partial(_lookup_in_head, embedding, head)


def _lookup_in_head(embedding: nn.Embedding, head: QuantizedLinear, ids: torch.Tensor):
    codes = packed_linear.panel_rows(head.qweight, ids)[..., : head.in_features]
    rows = codes.double() * head.scale[ids].double()[..., None]  # exact
    return rows.to(embedding.weight.dtype)


def quantize(
    linear: nn.Linear, bits: int, group: int | None, dynamic: bool = False
) -> QuantizedLinear:
    """``linear`` quantized, on the native kernel where it builds."""
    return with_kernel(QuantizedLinear.from_linear(linear, bits, group, dynamic))


def with_kernel(layer: QuantizedLinear) -> QuantizedLinear:
    """``layer`` on the native kernel where it builds."""
    from sglang.srt import kernels

    layer.use_kernel(kernels.load("linear_int8dq" if layer.dynamic else "linear_quant"))
    return layer


def replace_linears(
    model: nn.Module,
    targets: set[nn.Linear],
    bits: int,
    group: int | None,
    stand_in: bool = False,
    dynamic: bool = False,
) -> int:
    """Swap every linear of ``targets`` under ``model`` for its ``QuantizedLinear``, in place;
    returns how many. ``stand_in``: each keeps a ``weight`` buffer with the old weight's shape,
    dtype and device over a one-element storage, for code that reads them (never the values).
    A weight on a checkpoint's mapping has its file pages released once quantized: a quantizing
    load holds the codes and one source weight, not the whole checkpoint beside them (a later
    read of the weight would fault its bytes in from the file again)."""
    count = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if child in targets:
                layer = quantize(child, bits, group, dynamic)
                page_release.release_file_pages(child.weight)
                # hooks on the layer (the towers' FLOP counters) stay with it
                layer._forward_pre_hooks.update(child._forward_pre_hooks)
                layer._forward_hooks.update(child._forward_hooks)
                if stand_in:
                    weight = packed_linear.stand_in(child.weight)
                    layer.register_buffer("weight", weight, persistent=False)
                setattr(parent, name, layer)
                count += 1
    return count
