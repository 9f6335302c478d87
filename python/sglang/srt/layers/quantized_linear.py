"""Weight-only int8 and int4 linears on a CPU, in the native kernel's own layouts.

A decode step reads every weight once, so its time is the weights' bytes over memory bandwidth:
int8 halves them and int4 quarters them, provided the product runs in the quantized domain and
does not first widen each weight to bfloat16 in memory (torchao's CPU int8 path does that on
every call). ``QuantizedLinear`` holds one copy of each weight, quantized, in the native GEMM's
panel order (the layouts, their quantizers and packers: ``quant_layouts``).

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

from sglang.srt.kernels import ops
from sglang.srt.layers import packed_linear, page_release
from sglang.srt.layers.quant_layouts import (
    int4_skip_reason,
    pack_int4,
    pack_int4_octets,
    pack_int8,
    pack_int8_quads,
    quantize_int4,
    quantize_int8,
    quantize_rows,
    unpack_int4,
    unpack_int4_octets,
    unpack_int8,
    unpack_int8_quads,
)


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
    layer.use_kernel(ops.linear_int8_dynamic() if layer.dynamic else ops.linear_quant())
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
