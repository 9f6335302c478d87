"""The contract of a linear method: one object per way of holding a linear's weight and
computing its product, with the three duties SGLang's and vLLM's quantization methods have.

1. ``create_weights(layer)``: the module a checkpoint loads into in place of ``layer`` (the
   layer itself, for the methods that start from its dense weight; the format's tensors, for a
   checkpoint published quantized).
2. ``process_weights_after_loading(layer)``: once the weights are in, the repacking into the
   kernel's layout, done once; returns the module that serves (``layer`` itself, its weight's
   storage released where only the packed layout is read, or a ``QuantizedLinear`` holding the
   codes), with the method attached.
3. ``apply(layer, x)``: the product, choosing the kernel by the rows of ``x`` and the CPU.

Invariants of a served linear (``attach``): ``layer.linear_method`` is its method and
``layer.forward`` calls ``layer.linear_method.apply``; ``method_name(layer)`` says what runs.
A plain ``nn.Linear`` nobody attached a method to runs torch's ``F.linear`` and is named by its
weight's dtype.
"""

from __future__ import annotations

import types
from abc import ABC, abstractmethod
from collections import Counter
from typing import Any, ClassVar

import torch
from torch import nn

DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float32: "fp32", torch.float16: "fp16"}
# the names of linears no method was attached to
PLAIN_NAMES = {
    "{dtype}": "the checkpoint's weight, torch's F.linear",
    "torchao-{subclass}": "a torchao tensor subclass (CUDA)",
}


class LinearMethod(ABC):
    """One way of holding and applying a linear's weight (see the module docstring)."""

    # name patterns this method reports ({dtype}, {group} filled in) -> what they mean
    names: ClassVar[dict[str, str]] = {}

    def create_weights(self, layer: nn.Linear) -> nn.Module:
        """The module the checkpoint's tensors load into: by default ``layer`` and its weight."""
        return layer

    @abstractmethod
    def process_weights_after_loading(self, layer: nn.Module) -> nn.Module:
        """Repack ``layer``'s loaded weights once; the module that serves, method attached."""

    @abstractmethod
    def apply(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """``layer``'s output for ``x`` (any leading shape)."""

    @abstractmethod
    def name(self, layer: nn.Module) -> str:
        """What runs for ``layer``: one of ``names``, its fields filled in."""


def attach(layer: nn.Module, method: LinearMethod) -> nn.Module:
    """Serve ``layer`` with ``method``: its forward becomes ``method.apply``. Returns it."""
    layer.linear_method = method
    layer.forward = types.MethodType(_forward, layer)
    return layer


def _forward(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return self.linear_method.apply(self, x)


def attached(layer: nn.Module) -> LinearMethod | None:
    """The method ``attach`` gave ``layer``, or None."""
    method = layer.__dict__.get("linear_method")
    return method if isinstance(method, LinearMethod) else None


def short_dtype_name(dtype: torch.dtype) -> str:
    return DTYPE_NAMES.get(dtype, str(dtype).removeprefix("torch."))


def method_name(module: nn.Module) -> str | None:
    """The method of a linear by name, None for a module that is not a linear."""
    method = attached(module)
    if method is not None:
        return method.name(module)
    if not isinstance(module, nn.Linear):
        return None
    weight = module.weight
    if type(weight.data) is not torch.Tensor:
        return f"torchao-{type(weight.data).__name__}"
    return short_dtype_name(weight.dtype)


def linear_methods(model: nn.Module) -> dict[str, Any]:
    """Every linear of ``model`` by its qualified name, and how many take each method."""
    by_module = {}
    for name, module in model.named_modules():
        method = method_name(module)
        if method is not None:
            by_module[name] = method
    return {"counts": dict(Counter(by_module.values())), "by_module": by_module}


def serve_with(model: nn.Module, targets: set[nn.Module], method: LinearMethod) -> int:
    """Process every module of ``targets`` under ``model`` with ``method`` (one at a time, so
    a load holds one source weight beside the new layouts) and put the module that serves in
    its place, the old one's hooks (the towers' FLOP counters) with it; returns how many."""
    count = 0
    for parent in list(model.modules()):
        for child_name, child in list(parent.named_children()):
            if child not in targets:
                continue
            served = method.process_weights_after_loading(child)
            if served is not child:
                served._forward_pre_hooks.update(child._forward_pre_hooks)
                served._forward_hooks.update(child._forward_hooks)
                setattr(parent, child_name, served)
            count += 1
    return count


def keep_out_of_compile(model: nn.Module) -> int:
    """Call every linear under ``model`` that a method serves as it is from ``torch.compile``'d
    code (a graph break around it): the methods' products are native kernels and oneDNN-packed
    weights, which inductor cannot lower. Eager calls are left untouched elsewhere: the wrapper
    costs about half a microsecond a call. Returns how many."""
    count = 0
    for module in model.modules():
        if attached(module) is not None:
            module.forward = torch.compiler.disable(module.forward)
            count += 1
    return count


def stand_in(weight: torch.Tensor) -> torch.Tensor:
    """A tensor with ``weight``'s shape, dtype and device over a one-element storage: what a
    module keeps in place of a weight held in another layout (HF code reads those attributes,
    never the values)."""
    return torch.zeros((), dtype=weight.dtype, device=weight.device).expand(weight.shape)
