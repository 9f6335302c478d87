"""bfloat16 linears of decode-sized inputs on the native CPU kernel.

A decode step multiplies a few rows (one per request) by every weight matrix of the language
model and its head: its cost is reading the weights. torch's bfloat16 matrix product reads them
well below memory bandwidth on CPUs without AMX, so linears whose input has at most
``MAX_ROWS`` rows run on ``kernels/csrc/linear_bf16.cpp`` (AVX512-BF16 dot products where the
CPU has them; up to 16 rows at least as fast as torch's product on the 2B-shaped model's
matrices, 1.4x faster at 8); larger inputs (prompt chunks) keep torch's GEMM. Weights stay
where they are: the kernel reads the module's own (out, in) bfloat16 weight. Linears that hold
only the native GEMM's packed weight (``packed_linear.install``) are not routed here: the GEMM
serves their decode rows too.

Prefill inputs of at least ``PAD_FROM_ROWS`` rows reach torch's GEMM padded with zero rows to a
multiple of ``ROW_MULTIPLE``: oneDNN's bfloat16 matmul (the kernel behind torch's CPU product)
runs some row counts far below its rate (451 x 1536 -> 8960 at 0.65 of 452's on AMD EPYC,
AVX512-BF16, 2 threads); over random counts of 256-2048 rows x the 2B-shaped MLP, padding to a
multiple of 16 measured 3-4% faster on average, over 5% faster for a quarter of the counts,
at most 5% slower for the rest. Each row's result does not depend on the others. Where the
module holds a packed copy of its weight beside the plain one (``packed_linear.add_packed_copies``,
``cpu_packed_lm_weights="on"``), inputs of more than ``MAX_ROWS`` rows run on that instead, padded
to a multiple of ``PACKED_ROW_MULTIPLE`` for oneDNN's: on packed weights some odd counts run slow
too (451 rows x 1536 -> 8960: 381-404 GFLOP/s), every multiple of 4 from 400 to 528 rows measured
within 1% of the best except two (440, 508: 3-7% slower), so the padding wastes less than a
multiple of 16's (433 rows: 436, not 448). The native GEMM's take any row count unpadded.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import nn

from sglang.srt.kernels import ops
from sglang.srt.layers.quantization import packed_linear
from sglang.srt.layers.quantization.base import LinearMethod, attach, attached, short_dtype_name

MAX_ROWS = 16
FLOAT32_MIN_ROWS = 2  # one float32 row: torch's matrix-vector product reads as fast
PAD_FROM_ROWS = 256
ROW_MULTIPLE = 16
PACKED_ROW_MULTIPLE = 4


class DecodeKernelMethod(LinearMethod):
    """The checkpoint's own (out, in) weight: decode-sized rows on the native kernel (the
    module's ``_decode_kernel``; None: torch's product, set so to compare the two), prompt
    chunks on torch's product with padded rows, or on a packed copy beside the weight."""

    names = {
        "{dtype}-decode-kernel": "the checkpoint's weight; decode-sized batches on the native "
        "kernel (linear_bf16.cpp), prompt chunks on torch's product",
        "bf16-decode-kernel+packed-copy": "as bf16-decode-kernel, prompt chunks on a packed copy",
        "{dtype}": "the checkpoint's weight; no native kernel built here: torch's product",
    }

    def process_weights_after_loading(self, layer: nn.Module) -> nn.Module:
        layer._decode_kernel = ops.linear_bf16()
        return attach(layer, self)

    def apply(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // x.shape[-1] if x.numel() else 0
        kernel = layer._decode_kernel
        packed = layer.__dict__.get("packed_weight")  # packed_linear.add_packed_copies
        flat = x.reshape(rows, x.shape[-1])
        if 0 < rows <= MAX_ROWS and kernel is not None and x.dtype == layer.weight.dtype:
            if x.dtype == torch.bfloat16:
                out = kernel.linear_bf16(flat.contiguous(), layer.weight, layer.bias)
                return out.reshape(*x.shape[:-1], layer.out_features)
            if rows >= FLOAT32_MIN_ROWS:
                out = kernel.linear_f32(flat.contiguous(), layer.weight, layer.bias)
                return out.reshape(*x.shape[:-1], layer.out_features)
        on_packed = packed is not None and rows > MAX_ROWS and x.dtype == torch.bfloat16
        if on_packed and layer.__dict__.get("packed_gemm") is not None:
            # the native GEMM: any row count runs at its rate
            return packed_linear.product(layer, x)
        if on_packed or rows >= PAD_FROM_ROWS:
            pad = -rows % (PACKED_ROW_MULTIPLE if on_packed else ROW_MULTIPLE)
            flat = _pad_rows(flat, pad) if pad else flat
        if on_packed:
            out = packed_linear.product(layer, flat)
        elif flat.shape[0] != rows:
            out = F.linear(flat, layer.weight, layer.bias)
        else:
            return F.linear(x, layer.weight, layer.bias)
        return out[:rows].reshape(*x.shape[:-1], layer.out_features)

    def name(self, layer: nn.Module) -> str:
        name = short_dtype_name(layer.weight.dtype)
        if layer.__dict__.get("_decode_kernel") is None:
            return name  # torch's product throughout
        name += "-decode-kernel"
        return name + "+packed-copy" if "packed_weight" in layer.__dict__ else name


DECODE_KERNEL = DecodeKernelMethod()


def install(modules: Iterable[nn.Module], dtype: torch.dtype = torch.bfloat16) -> int:
    """Serve every plain ``nn.Linear`` of ``dtype`` among ``modules`` with ``DECODE_KERNEL``:
    decode-sized calls on the native kernel, prompt-sized ones on torch's product with padded
    rows (also where the kernel cannot be built); returns how many linears reach the kernel (0
    where it cannot be built). float32 (a model served in float32 on a CPU without native
    bfloat16): 2-16 rows go to the kernel's ``linear_f32``, where torch's product read a
    7B-shaped layer at 1.2-5 GB/s against the kernel's 2.7-7 (AMD Zen 3, AVX2, 2 threads)."""
    count = 0
    for module in modules:
        if _eligible(module, dtype):
            DECODE_KERNEL.process_weights_after_loading(module)
            count += 1
    return count if ops.linear_bf16() is not None else 0


def routes_to_kernel(module: nn.Module) -> bool:
    """Whether ``install`` routed the module and its decode-sized calls reach the kernel."""
    routed = isinstance(attached(module), DecodeKernelMethod)
    return routed and module.__dict__.get("_decode_kernel") is not None


def _eligible(module: nn.Module, dtype: torch.dtype) -> bool:
    if not isinstance(module, nn.Linear) or attached(module) is not None:
        return False
    weight = module.weight
    plain = type(weight.data) is torch.Tensor  # not a quantized tensor subclass
    return plain and weight.dtype == dtype and weight.is_contiguous()


def _pad_rows(flat: torch.Tensor, pad: int) -> torch.Tensor:
    """flat with ``pad`` zero rows below (only the new rows are zeroed: half of F.pad's writes)."""
    rows = flat.shape[0]
    padded = flat.new_empty(rows + pad, flat.shape[1])
    padded[:rows].copy_(flat)
    padded[rows:].zero_()
    return padded
