"""Activations of bfloat16 CPU models on native one-pass kernels.

- QuickGELU of the encoders (CLIP-style towers, Qwen2-VL's vision MLP): HF's
  ``QuickGELUActivation`` computes ``x * sigmoid(1.702 * x)`` in three tensor passes
  (``kernels/csrc/quick_gelu.cpp``).
- The SiLU-gated MLPs (``down_proj(act_fn(gate_proj(x)) * up_proj(x))`` with a SiLU: the
  language models of the Qwen, Llama and Mistral families, Qwen2.5-VL's vision MLP): the SiLU
  and the product in one pass (``kernels/csrc/silu_and_mul.cpp``).

Each kernel rounds to bfloat16 where HF's passes round: results equal HF's except, rarely, by
one unit in the last place where the two exponentials differ in their last float bits
(``test/test_cpu_kernels.py``). Installed for bfloat16 CPU models only: float32, the exact
mode, keeps HF's code.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn
from transformers.activations import QuickGELUActivation, SiLUActivation

from sglang.srt.kernels import ops
from sglang.srt.layers import hf_code


class NativeQuickGELU(nn.Module):
    """QuickGELU on the kernel for bfloat16 CPU tensors, as HF computes it otherwise."""

    def __init__(self, kernel: Any) -> None:
        super().__init__()
        self.kernel = kernel

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.bfloat16 and x.device.type == "cpu":
            return self.kernel.quick_gelu(x)
        return x * torch.sigmoid(1.702 * x)


def install(modules: Iterable[nn.Module]) -> int:
    """Swap every ``QuickGELUActivation`` child of ``modules`` for ``NativeQuickGELU`` (in
    place); returns how many were swapped (none where the kernel does not build)."""
    kernel = ops.quick_gelu()
    if kernel is None:
        return 0
    count = 0
    for module in modules:
        for name, child in list(module.named_children()):
            if type(child) is QuickGELUActivation:
                setattr(module, name, NativeQuickGELU(kernel))
                count += 1
    return count


def install_gated_silu(modules: Iterable[nn.Module]) -> int:
    """Route every SiLU-gated MLP among ``modules`` through ``silu_and_mul`` (in place);
    returns how many (none where the kernel does not build)."""
    kernel = ops.silu_and_mul()
    if kernel is None:
        return 0
    count = 0
    for module in modules:
        if _is_gated_silu_mlp(module):
            module._silu_and_mul = kernel
            module.forward = types.MethodType(_gated_silu_forward, module)
            count += 1
    return count


def _is_gated_silu_mlp(module: nn.Module) -> bool:
    """Whether ``module``'s forward is exactly HF's gated MLP and its activation a SiLU: a class
    whose forward does more (dropout, scaling, another order) keeps it."""
    if not all(isinstance(getattr(module, n, None), nn.Module) for n in _GATED_PARTS):
        return False
    if type(getattr(module, "act_fn", None)) not in (SiLUActivation, nn.SiLU):
        return False
    return _forward_is_gated_mlp(type(module))


_GATED_PARTS = ("gate_proj", "up_proj", "down_proj")


@functools.cache  # one parse per class, not per layer
def _forward_is_gated_mlp(cls: type) -> bool:
    """Whether ``cls.forward(self, x)`` is ``return down_proj(act_fn(gate_proj(x)) * up_proj(x))``
    (or the same through a local), by its syntax tree."""
    node = hf_code.definition(cls.forward)
    if node is None or len(node.args.args) != 2:
        return False
    x = node.args.args[1].arg
    code = hf_code.body_code(node)
    formula = f"self.down_proj(self.act_fn(self.gate_proj({x})) * self.up_proj({x}))"
    return code in (f"return {formula}", f"down_proj = {formula}\nreturn down_proj")


def _gated_silu_forward(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
    gate, up = self.gate_proj(x), self.up_proj(x)
    if gate.dtype == up.dtype == torch.bfloat16 and gate.device.type == "cpu":
        return self.down_proj(self._silu_and_mul.silu_and_mul(gate, up))
    return self.down_proj(self.act_fn(gate) * up)
