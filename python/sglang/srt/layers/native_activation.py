"""QuickGELU of the encoders on a native one-pass kernel in bfloat16 (CLIP-style towers and
Qwen2-VL's vision MLP use it).

HF's ``QuickGELUActivation`` computes ``x * sigmoid(1.702 * x)`` in three tensor passes. The
kernel (``kernels/csrc/quick_gelu.cpp``) rounds to bfloat16 where those passes round, in one
pass: results equal HF's except, rarely, by one unit in the last place where the two
exponentials differ in their last float bits (``test/test_cpu_kernels.py``). Installed for
bfloat16 CPU encoders only: float32, the exact mode, keeps HF's activation.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn
from transformers.activations import QuickGELUActivation

from sglang.srt import kernels


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
    kernel = kernels.load("quick_gelu")
    if kernel is None:
        return 0
    count = 0
    for module in modules:
        for name, child in list(module.named_children()):
            if type(child) is QuickGELUActivation:
                setattr(module, name, NativeQuickGELU(kernel))
                count += 1
    return count
