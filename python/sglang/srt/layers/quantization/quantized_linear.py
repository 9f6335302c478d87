"""Weight-only int8 and int4 linears on a CPU, and int8 / int4 weights times int8 activations,
in the native kernels' own layouts: one method object per layout (``Int8WeightOnly``,
``Int4WeightOnly``, ``Int8Dynamic``, ``Int4Dynamic``; the contract: ``base.py``), each layer a
``QuantizedLinear`` holding one copy of its weight, quantized, in the native GEMM's panel order
(the layouts, their quantizers and packers: ``quant_layouts``).

A decode step reads every weight once, so its time is the weights' bytes over memory bandwidth:
int8 halves them and int4 quarters them, provided the product runs in the quantized domain and
does not first widen each weight to bfloat16 in memory (torchao's CPU int8 path does that on
every call).

Every row count of the weight-only methods runs on ``kernels/csrc/linear_quant.cpp``: the native
GEMM's tile over the codes, each converted exactly to bfloat16 as it streams (or, for more than
16 rows, once per panel into a buffer that stays in cache), the scales and mins applied to
float32 sums: decode rows and prompt chunks give the same bits, and no weight is ever rounded to
bfloat16. A 7B-shaped layer's seven products (AMD EPYC, 2 threads): int8 4.3 ms at one row, 7.7
at 8, 304 for a 512-row chunk (bfloat16 6.6, 10.4, 293). On CPUs with AVX2 and no AVX512-BF16
the same panels are read by float32 FMAs (``linear_quant_avx2.h``), and x may be float32: there
a quantized model runs with float32 activations (``dtypes.resolve_launch_dtypes``), since
torch's bfloat16 products run ~40x slower than its float32 ones on such CPUs. Without the
kernel, torch's product runs over the weight dequantized to bfloat16 (float32 for float32 x).
The dynamic methods (SGLang's int8dq, 8da4w-<group>) quantize each input row to int8 as it
arrives and run the product in integers (``linear_int8dq.cpp``).
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from sglang.srt.kernels import ops
from sglang.srt.layers import page_release
from sglang.srt.layers.quantization.base import LinearMethod, stand_in
from sglang.srt.layers.quantization.quant_layouts import (
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
    """A linear whose weight is held int8 or int4 in the native kernels' layouts. Its
    ``linear_method`` (one of the four methods below) made the codes and computes the product;
    ``kernel`` is the compiled module the method calls (None: torch's product throughout)."""

    def __init__(
        self,
        method: QuantizedMethod,
        in_features: int,
        out_features: int,
        tensors: dict[str, torch.Tensor],
        bias: torch.Tensor | None,
    ) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.linear_method = method
        self.qweight = nn.Buffer(tensors["qweight"])
        self.scale = nn.Buffer(tensors["scale"])
        self.min = nn.Buffer(tensors["min"]) if "min" in tensors else None
        self.offset = nn.Buffer(tensors["offset"]) if "offset" in tensors else None
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)
        self.kernel: Any = None
        self.kernel_takes_float32 = False

    @property
    def bits(self) -> int:
        return self.linear_method.bits

    @property
    def group(self) -> int | None:
        return self.linear_method.group

    @property
    def dynamic(self) -> bool:
        return self.linear_method.dynamic

    def use_kernel(self, kernel: Any) -> None:
        """The compiled module the method calls, or None for torch's product throughout."""
        self.kernel = kernel
        takes = getattr(kernel, "takes_float32", None)  # weight-only builds without AVX512-BF16
        self.kernel_takes_float32 = bool(takes is not None and takes())

    def codes(self) -> torch.Tensor:
        """The codes (out, in)."""
        return self.linear_method.unpack(self.qweight, self.out_features, self.in_features)

    def dequantized(self, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        """The weight (out, in) this layer stands for, rounded to ``dtype``."""
        return self.linear_method.dequantized(self, dtype)

    def group_scales(self) -> tuple[torch.Tensor, torch.Tensor]:
        """int4: the scale and min (out, groups) from their (panels, groups, 64) layout."""
        assert self.min is not None
        return tuple(
            t.transpose(1, 2).reshape(-1, t.shape[1])[: self.out_features]
            for t in (self.scale, self.min)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """y in bfloat16, or in float32 for float32 x (a model served in float32 on a CPU
        without native bfloat16)."""
        return self.linear_method.apply(self, x)

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, {self.linear_method.name(self)}"


class QuantizedMethod(LinearMethod):
    """What the four int8 / int4 methods share: the dense weight quantized and packed into the
    method's layout once loaded (``process_weights_after_loading``), or codes a checkpoint
    published (``from_codes``). ``stand_in``: the layer keeps a ``weight`` buffer with the old
    weight's shape, dtype and device over a one-element storage, for model code that reads them
    (the towers': Gemma 4's patch embedder casts its input to them), never the values."""

    bits: ClassVar[int]
    dynamic: ClassVar[bool]

    def __init__(self, group: int | None = None, stand_in: bool = False) -> None:
        assert (group is not None) == (self.bits == 4), "int4 takes a group; int8 none"
        self.group, self.stand_in = group, stand_in

    def process_weights_after_loading(self, layer: nn.Module) -> QuantizedLinear:
        """The ``QuantizedLinear`` of a dense ``nn.Linear``. A weight on a checkpoint's mapping
        has its file pages released once quantized: a quantizing load holds the codes and one
        source weight, not the whole checkpoint beside them."""
        bias = None if layer.bias is None else layer.bias.detach().to(torch.bfloat16)
        codes, scale, low = self.quantize(layer.weight)
        quantized = self.from_codes(codes, scale, bias, low)
        page_release.release_file_pages(layer.weight)
        if self.stand_in:
            weight = stand_in(layer.weight)
            quantized.register_buffer("weight", weight, persistent=False)
        return quantized

    def from_codes(
        self,
        codes: torch.Tensor,
        scale: torch.Tensor,
        bias: torch.Tensor | None,
        low: torch.Tensor | None = None,
    ) -> QuantizedLinear:
        """The layer of codes (out, in) and their scales: int8 with a float32 scale per row;
        int4 with a scale and min per row and group (bfloat16, or float32 for a published
        checkpoint's exact values), on the native kernel where it builds."""
        out_features, in_features = codes.shape
        tensors = self.pack(codes, scale, low)
        layer = QuantizedLinear(self, in_features, out_features, tensors, bias)
        layer.use_kernel(self.kernel())
        return layer

    @abstractmethod
    def quantize(
        self, weight: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(codes (out, in), scale, min or None) of a dense weight."""

    @abstractmethod
    def pack(
        self, codes: torch.Tensor, scale: torch.Tensor, low: torch.Tensor | None
    ) -> dict[str, torch.Tensor]:
        """The layer's buffers in the kernel's layout."""

    @abstractmethod
    def unpack(self, qweight: torch.Tensor, out_features: int, in_features: int) -> torch.Tensor:
        """``pack``'s codes back to (out, in)."""

    @abstractmethod
    def kernel(self) -> Any:
        """The compiled module the product runs on, None where it does not build."""

    @abstractmethod
    def dequantized(self, layer: QuantizedLinear, dtype: torch.dtype) -> torch.Tensor:
        """The weight (out, in) the layer stands for, rounded to ``dtype``."""

    def name(self, layer: nn.Module) -> str:
        (pattern,) = self.names
        return pattern.format(group=self.group)


class _Int8Codes(QuantizedMethod):
    bits = 8

    def quantize(self, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
        return (*quantize_int8(weight), None)

    def dequantized(self, layer: QuantizedLinear, dtype: torch.dtype) -> torch.Tensor:
        return (layer.codes().float() * layer.scale[: layer.out_features, None]).to(dtype)


class _Int4Codes(QuantizedMethod):
    bits = 4

    def quantize(self, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        assert self.group is not None and int4_skip_reason(weight.shape[1], self.group) is None
        return quantize_int4(weight, self.group)

    def dequantized(self, layer: QuantizedLinear, dtype: torch.dtype) -> torch.Tensor:
        scale, low = (t.float().repeat_interleave(self.group, dim=1) for t in layer.group_scales())
        return torch.addcmul(low, layer.codes().float(), scale).to(dtype)

    def product(self, layer: QuantizedLinear, flat: torch.Tensor) -> torch.Tensor:
        """Both int4 kernels (weight-only and int8-activation) take the same arguments."""
        return layer.kernel.linear_int4(
            flat, layer.qweight, layer.scale, layer.min, self.group, layer.bias,
            layer.out_features,
        )  # fmt: skip


class _WeightOnly(QuantizedMethod):
    """bfloat16 (or float32) activations times the codes, each converted exactly as it streams
    (``linear_quant``); without the kernel, or for an input it does not take, torch's product
    over the weight dequantized to the output's dtype."""

    dynamic = False

    def kernel(self) -> Any:
        return ops.linear_quant()

    def apply(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // layer.in_features
        float32_in = x.dtype == torch.float32
        out_dtype = torch.float32 if float32_in else torch.bfloat16
        native = x.dtype == torch.bfloat16 or (float32_in and layer.kernel_takes_float32)
        if layer.kernel is None or rows == 0 or not native:
            bias = None if layer.bias is None else layer.bias.to(out_dtype)
            return F.linear(x.to(out_dtype), layer.dequantized(out_dtype), bias)
        flat = x.reshape(rows, layer.in_features)
        if layer.in_features % 2:  # the codes' zero input pairs with a zero
            flat = F.pad(flat, (0, 1))
        out = self.product(layer, flat.contiguous())
        return out.reshape(*x.shape[:-1], layer.out_features)

    @abstractmethod
    def product(self, layer: QuantizedLinear, flat: torch.Tensor) -> torch.Tensor:
        """The kernel's product of contiguous rows (rows, in padded to pairs)."""


class _Dynamic(QuantizedMethod):
    """Each row of the input quantized to int8 as it arrives (its own values, float32 ones
    included) and the product run in integers (``linear_int8dq.cpp``)."""

    dynamic = True

    def kernel(self) -> Any:
        return ops.linear_int8_dynamic()

    def apply(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // layer.in_features
        out_dtype = torch.float32 if x.dtype == torch.float32 else torch.bfloat16
        flat = x.to(out_dtype).reshape(rows, layer.in_features).contiguous()
        if layer.kernel is None:
            out = self.reference_product(layer, *quantize_rows(flat))
            out = (out if layer.bias is None else out + layer.bias.float()).to(flat.dtype)
        else:
            out = self.product(layer, flat)
        return out.reshape(*x.shape[:-1], layer.out_features)

    @abstractmethod
    def product(self, layer: QuantizedLinear, flat: torch.Tensor) -> torch.Tensor:
        """The kernel's product of contiguous rows."""

    @abstractmethod
    def reference_product(
        self, layer: QuantizedLinear, codes: torch.Tensor, step: torch.Tensor
    ) -> torch.Tensor:
        """The kernel's result without it, but the bias, for rows quantized to ``codes`` and
        ``step``: integer sums (exact in float64), then its float32 steps (the roundings left
        are where the kernel fuses a multiply and an add)."""


class Int8WeightOnly(_Int8Codes, _WeightOnly):
    """int8wo: int8 weights per output channel (``quant_layouts.pack_int8``)."""

    names = {"int8wo": "int8 weights per output channel, bfloat16 or float32 activations "
             "(linear_quant)"}  # fmt: skip

    def pack(
        self, codes: torch.Tensor, scale: torch.Tensor, low: torch.Tensor | None
    ) -> dict[str, torch.Tensor]:
        qweight, scales = pack_int8(codes, scale)
        return {"qweight": qweight, "scale": scales}

    def unpack(self, qweight: torch.Tensor, out_features: int, in_features: int) -> torch.Tensor:
        return unpack_int8(qweight, out_features, in_features)

    def product(self, layer: QuantizedLinear, flat: torch.Tensor) -> torch.Tensor:
        return layer.kernel.linear_int8(
            flat, layer.qweight, layer.scale, layer.bias, layer.out_features
        )


class Int4WeightOnly(_Int4Codes, _WeightOnly):
    """int4wo-<group>: int4 weights per group with a scale and min (``pack_int4``)."""

    names = {"int4wo-{group}": "int4 weights per group, bfloat16 or float32 activations "
             "(linear_quant)"}  # fmt: skip

    def pack(
        self, codes: torch.Tensor, scale: torch.Tensor, low: torch.Tensor | None
    ) -> dict[str, torch.Tensor]:
        assert low is not None and scale.dtype == low.dtype
        qweight, scales, mins = pack_int4(codes, scale, low)
        return {"qweight": qweight, "scale": scales, "min": mins}

    def unpack(self, qweight: torch.Tensor, out_features: int, in_features: int) -> torch.Tensor:
        return unpack_int4(qweight, out_features, in_features)


class Int8Dynamic(_Int8Codes, _Dynamic):
    """int8dq: int8 weights in quads of inputs (``pack_int8_quads``) times int8 rows."""

    names = {"int8dq": "int8 weights, int8 activations quantized per row (linear_int8dq)"}

    def pack(
        self, codes: torch.Tensor, scale: torch.Tensor, low: torch.Tensor | None
    ) -> dict[str, torch.Tensor]:
        qweight, offset, scales = pack_int8_quads(codes, scale)
        return {"qweight": qweight, "scale": scales, "offset": offset}

    def unpack(self, qweight: torch.Tensor, out_features: int, in_features: int) -> torch.Tensor:
        return unpack_int8_quads(qweight, out_features, in_features)

    def product(self, layer: QuantizedLinear, flat: torch.Tensor) -> torch.Tensor:
        return layer.kernel.linear(
            flat, layer.qweight, layer.offset, layer.scale, layer.bias, layer.out_features
        )

    def reference_product(
        self, layer: QuantizedLinear, codes: torch.Tensor, step: torch.Tensor
    ) -> torch.Tensor:
        sums = (codes.double() @ layer.codes().double().T).float()
        return sums * (step[:, None] * layer.scale[: layer.out_features])


class Int4Dynamic(_Int4Codes, _Dynamic):
    """8da4w-<group>: int4 weights in octets of inputs (``pack_int4_octets``) times int8 rows,
    torchao's Int8DynamicActivationInt4Weight."""

    names = {"8da4w-{group}": "int4 weights per group, int8 activations per row "
             "(linear_int8dq)"}  # fmt: skip

    def pack(
        self, codes: torch.Tensor, scale: torch.Tensor, low: torch.Tensor | None
    ) -> dict[str, torch.Tensor]:
        assert low is not None and scale.dtype == torch.bfloat16
        qweight, scales, mins = pack_int4_octets(codes, scale, low)
        return {"qweight": qweight, "scale": scales, "min": mins}

    def unpack(self, qweight: torch.Tensor, out_features: int, in_features: int) -> torch.Tensor:
        return unpack_int4_octets(qweight, out_features, in_features)

    def reference_product(
        self, layer: QuantizedLinear, codes: torch.Tensor, step: torch.Tensor
    ) -> torch.Tensor:
        assert self.group is not None
        rows, groups = codes.shape[0], layer.in_features // self.group
        by_group = codes.double().reshape(rows, groups, self.group)
        weight = layer.codes().double().reshape(layer.out_features, groups, self.group)
        products = torch.einsum("rgk,cgk->rgc", by_group, weight).float()
        scale, low = (t.T.float() for t in layer.group_scales())
        partial = products * scale + by_group.sum(-1, keepdim=True).float() * low
        return partial.sum(1) * step[:, None]


def quantized_method(
    bits: int, group: int | None, dynamic: bool = False, stand_in: bool = False
) -> QuantizedMethod:
    """The method of int``bits`` weights (int4: in groups of ``group``), with int8 activations
    where ``dynamic``."""
    if bits == 8:
        return (Int8Dynamic if dynamic else Int8WeightOnly)(stand_in=stand_in)
    return (Int4Dynamic if dynamic else Int4WeightOnly)(group, stand_in=stand_in)


def quantize(
    linear: nn.Linear, bits: int, group: int | None, dynamic: bool = False
) -> QuantizedLinear:
    """``linear`` quantized, on the native kernel where it builds."""
    return quantized_method(bits, group, dynamic).process_weights_after_loading(linear)
