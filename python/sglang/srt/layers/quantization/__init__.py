"""Linear methods by name: one class per way of holding a linear's weight (the contract, with
its three duties and its invariants: ``base.py``), imported when first asked for.

The names of the quantized methods are SGLang's ``--torchao-config`` spellings. A checkpoint
published quantized (AWQ, GPTQ, compressed-tensors) loads through its format's
``checkpoint_formats.FormatLoader`` into one of these methods' layouts and reports that method.
Every linear of a served model reports what runs (``base.method_name``, ``/server_info``):
int4wo on a CPU without AVX512-BF16 reports ``8da4w-<group>``, the int8-activation method it
is served with.
"""

from __future__ import annotations

import importlib
from typing import Any

from sglang.srt.layers.quantization.base import PLAIN_NAMES, LinearMethod

# name -> "module:class" under this package
REGISTRY: dict[str, str] = {
    "bf16-packed": "packed_linear:PackedMethod",
    "decode-kernel": "decode_linear:DecodeKernelMethod",
    "bf16-widened": "bf16_weights:WidenedMethod",
    "int8wo": "quantized_linear:Int8WeightOnly",
    "int4wo": "quantized_linear:Int4WeightOnly",
    "int8dq": "quantized_linear:Int8Dynamic",
    "8da4w": "quantized_linear:Int4Dynamic",
}


def method_class(name: str) -> type[LinearMethod]:
    """The class registered under ``name``; a KeyError names the registered ones."""
    if name not in REGISTRY:
        raise KeyError(f"no linear method {name!r}; registered: {', '.join(REGISTRY)}")
    module, _, cls = REGISTRY[name].partition(":")
    return getattr(importlib.import_module(f"{__name__}.{module}"), cls)


def get_linear_method(name: str, *args: Any, **kwargs: Any) -> LinearMethod:
    """An instance of the method registered under ``name`` (its options as its class takes
    them: ``group`` for int4)."""
    return method_class(name)(*args, **kwargs)


def method_names() -> dict[str, str]:
    """Every name a linear can report (fields in braces: {dtype}, {group}, {subclass}) -> what
    runs."""
    names = dict(PLAIN_NAMES)
    for name in REGISTRY:
        names.update(method_class(name).names)
    return names
