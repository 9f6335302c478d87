"""bfloat16 linears of the vision towers on oneDNN with their weights packed once, at load.

On a CPU, torch's bfloat16 ``F.linear`` hands the (out, in) weight to oneDNN, which lays it out
in its blocked format for the product. Packing each weight once
(``torch.ops.mkldnn._reorder_linear_weight``) and calling the packed product gives the same
result (bit for bit on the towers' shapes; elsewhere within the output's rounding) and measured
5-12% faster on those shapes (1,564-4,784 rows x 1280 -> 1280-5120 and back, AMD EPYC, 2
threads, AVX512-BF16).

The packed copy replaces the weight's storage: the Parameter keeps its shape, dtype and device
(HF code reads them) over a one-element storage, so the weights are held once; each module's
``packed_weight_bytes`` tells the memory report what the packed copy holds. Only plain bfloat16
CPU weights of modules that are exactly ``nn.Linear`` are packed (quantized tensor subclasses,
float32 and Linear subclasses keep torch's product).

The language model's linears need their plain weight too: decode-sized inputs run on
``decode_linear``'s kernel, which reads it. ``add_packed_copies`` gives them a packed copy
beside it, which ``decode_linear`` uses for prompt-sized inputs: one 640x480 image's prompt
(416 tokens) through the 2B-shaped language model took 390-399 ms instead of 426-450 ms (AMD
EPYC, 2 threads, AVX512-BF16; oneDNN reorders a plain weight on every call, and runs some row
counts of it well below its rate). The copy costs the weights' bytes again, so by default
(``cpu_packed_lm_weights="auto"``) it is made only where it takes at most
``COPY_SHARE_OF_AVAILABLE`` of the memory available after loading.
"""

from __future__ import annotations

import types
from collections.abc import Iterable

import torch
from torch import nn

COPY_SHARE_OF_AVAILABLE = 0.25
PACKED_COPY_SETTINGS = ("auto", "on", "off")


def available() -> bool:
    mkldnn = torch.ops.mkldnn
    return torch.backends.mkldnn.is_available() and hasattr(mkldnn, "_reorder_linear_weight")


def install(modules: Iterable[nn.Module]) -> int:
    """Pack the weight of every eligible ``nn.Linear`` among ``modules`` (in place) and route
    its forward to the packed product; returns how many were packed."""
    if not available():
        return 0
    count = 0
    for module in modules:
        if _eligible(module):
            _pack(module)
            weight = module.weight
            weight.data = torch.zeros((), dtype=weight.dtype).expand(weight.shape)
            module.forward = types.MethodType(_forward, module)
            count += 1
    return count


def add_packed_copies(modules: Iterable[nn.Module]) -> int:
    """Give every eligible ``nn.Linear`` among ``modules`` a packed copy of its weight and keep
    the weight (and the module's forward) as they are; returns how many got one."""
    if not available():
        return 0
    count = 0
    for module in modules:
        if _eligible(module):
            _pack(module)
            count += 1
    return count


def copies_wanted(setting: str, modules: Iterable[nn.Module], available_bytes: int) -> bool:
    """Whether ``add_packed_copies`` should run on ``modules``: ``setting`` is on, off, or auto
    (the copies take at most ``COPY_SHARE_OF_AVAILABLE`` of ``available_bytes``)."""
    if setting not in PACKED_COPY_SETTINGS:
        raise ValueError(f"packed copies: {setting!r} is not one of {PACKED_COPY_SETTINGS}")
    if setting == "off" or not available():
        return False
    if setting == "on":
        return True
    copy_bytes = sum(_weight_bytes(m) for m in modules if _eligible(m))
    return 0 < copy_bytes <= COPY_SHARE_OF_AVAILABLE * available_bytes


def packed_bytes(model: nn.Module) -> int:
    """Bytes of the packed weights under ``model`` (not in its parameters' storages)."""
    return sum(getattr(m, "packed_weight_bytes", 0) for m in model.modules())


def _pack(module: nn.Linear) -> None:
    """The packed copy of the module's weight, and its bytes for the memory report."""
    module.packed_weight = torch.ops.mkldnn._reorder_linear_weight(module.weight.detach(), None)
    module.packed_weight_bytes = _weight_bytes(module)


def _weight_bytes(module: nn.Linear) -> int:
    return module.weight.numel() * module.weight.element_size()


def _eligible(module: nn.Module) -> bool:
    # Exactly nn.Linear: subclasses (nn.MultiheadAttention's out_proj) have parents that read
    # their weight themselves.
    if type(module) is not nn.Linear or hasattr(module, "packed_weight"):
        return False
    weight = module.weight
    plain = type(weight.data) is torch.Tensor  # not a quantized tensor subclass
    return (
        plain
        and weight.dtype == torch.bfloat16
        and weight.device.type == "cpu"
        and weight.is_contiguous()
    )


def _forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, self.packed_weight, self.bias, "none", [], "")
