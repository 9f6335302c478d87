"""The method of every linear of a served model, by name: how its weight is held and which
product serves which rows. The installers (``packed_linear``, ``decode_linear``,
``quantized_linear``, and the published formats loaded into its layouts) leave each linear in
one of the states below; ``method_of`` reads that state back, so ``/server_info`` reports what
runs, not what was asked for (int4wo on a CPU without AVX512-BF16 reports ``8da4w-<group>``,
the int8-activation kernel it runs on).

The names of the quantized methods are SGLang's ``--torchao-config`` spellings.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch
from torch import nn

from sglang.srt.layers import bf16_weights, decode_linear, packed_linear
from sglang.srt.layers.quantized_linear import QuantizedLinear

_DTYPES = {torch.bfloat16: "bf16", torch.float32: "fp32", torch.float16: "fp16"}

# name (a dtype prefix for the unquantized ones) -> what it is
METHODS: dict[str, str] = {
    "{dtype}": "the checkpoint's weight, torch's F.linear",
    "{dtype}-decode-kernel": "the checkpoint's weight; decode-sized batches on the native kernel "
    "(linear_bf16.cpp), prompt chunks on torch's product",
    "bf16-decode-kernel+packed-copy": "as bf16-decode-kernel, prompt chunks on a packed copy",
    "bf16-widened": "a bfloat16 weight under float32 compute, widened as it is read: decode "
    "rows on the native kernel (linear_mixed), prompt chunks on torch's float32 GEMM by blocks",
    "bf16-packed-gemm": "held only in the native GEMM's panels (gemm_bf16.cpp): every row count",
    "bf16-packed-onednn": "held only oneDNN-packed: oneDNN's product for every row count",
    "int8wo": "int8 weights per output channel, bfloat16 or float32 activations (linear_quant)",
    "int4wo-{group}": "int4 weights per group, bfloat16 or float32 activations (linear_quant)",
    "int8dq": "int8 weights, int8 activations quantized per row (linear_int8dq)",
    "8da4w-{group}": "int4 weights per group, int8 activations per row (linear_int8dq)",
    "torchao-{subclass}": "a torchao tensor subclass (CUDA)",
}


def quantized_method(layer: QuantizedLinear) -> str:
    if layer.bits == 8:
        return "int8dq" if layer.dynamic else "int8wo"
    return f"8da4w-{layer.group}" if layer.dynamic else f"int4wo-{layer.group}"


def method_of(module: nn.Module) -> str | None:
    """The method of a linear (see ``METHODS``), None for a module that is not one."""
    if isinstance(module, QuantizedLinear):
        return quantized_method(module)
    if not isinstance(module, nn.Linear):
        return None
    weight = module.weight
    if type(weight.data) is not torch.Tensor:
        return f"torchao-{type(weight.data).__name__}"
    if bf16_weights.stores_bfloat16(module):
        return "bf16-widened"
    if packed_linear.holds_only_packed(module):
        native = module.__dict__.get("packed_gemm") is not None
        return "bf16-packed-gemm" if native else "bf16-packed-onednn"
    name = _DTYPES.get(weight.dtype, str(weight.dtype).removeprefix("torch."))
    if decode_linear.routes_to_kernel(module):
        name += "-decode-kernel"
        if "packed_weight" in module.__dict__:
            name += "+packed-copy"
    return name


def linear_methods(model: nn.Module) -> dict[str, Any]:
    """Every linear of ``model`` by its qualified name, and how many take each method."""
    by_module = {}
    for name, module in model.named_modules():
        method = method_of(module)
        if method is not None:
            by_module[name] = method
    return {"counts": dict(Counter(by_module.values())), "by_module": by_module}
