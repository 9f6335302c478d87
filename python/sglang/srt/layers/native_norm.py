"""RMSNorms of bfloat16 CPU models on a native one-pass kernel (``kernels/csrc/rms_norm.cpp``).

HF's RMSNorms take six or seven tensor passes per call: two per decoder layer and the final
one (Gemma's per-head q and k norms besides), over every token of a prompt and again at each
decode step. Two definitions are routed to the kernel, each where a class's code is, by its
syntax tree, exactly that definition (a norm without weight, or any other change keeps HF's
code):

- Llama's (140 classes in transformers: the Qwen, Llama, Mistral, GLM and Granite language
  models, Qwen2.5-VL's and InternVL's towers among them): ``weight * (x / rms)`` with ``x / rms``
  rounded to the input's dtype first;
- Gemma's (Gemma 1-3): ``(x / rms) * (1 + weight)`` in float32, rounded once.

The kernel rounds where HF rounds: results equal HF's except, rarely, by a unit in the last
place (Llama's form: up to two; ``test/test_cpu_kernels.py``). bfloat16 CPU models only:
float32, the exact mode, keeps HF's code, as does a weight kept in float32.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Iterable

import torch
from torch import nn

from sglang.srt.kernels import ops
from sglang.srt.layers import hf_code

# The body of HF's Llama-style RMSNorm forward (``hidden_states`` renamed to ``x``).
_RMS_NORM_BODY = """input_dtype = x.dtype
x = x.to(torch.float32)
variance = x.pow(2).mean(-1, keepdim=True)
x = x * torch.rsqrt(variance + self.variance_epsilon)
return self.weight * x.to(input_dtype)"""


# Gemma's: ``_norm(x)`` and the forward's body (its argument renamed to ``x``).
_GEMMA_NORM_BODY = "return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)"
_GEMMA_FORWARD_BODY = """output = self._norm(x.float())
output = output * (1.0 + self.weight.float())
return output.type_as(x)"""


def install_rms_norms(modules: Iterable[nn.Module]) -> int:
    """Route every HF RMSNorm of Llama's or Gemma's definition among ``modules`` through the
    kernel's function for that form (in place); returns how many (none where the kernel does
    not build)."""
    kernel = ops.rms_norm()
    if kernel is None:
        return 0
    count = 0
    for module in modules:
        weight = getattr(module, "weight", None)
        if not isinstance(weight, torch.Tensor) or weight.dim() != 1:
            continue
        cls = type(module)
        if _eps(module, "variance_epsilon") and forward_is_rms_norm(cls):
            module._rms_norm, module._rms_eps = kernel.rms_norm, module.variance_epsilon
        elif _eps(module, "eps") and forward_is_gemma_rms_norm(cls):
            module._rms_norm, module._rms_eps = kernel.rms_norm_offset, module.eps
        else:
            continue
        module.forward = types.MethodType(_native_forward, module)
        count += 1
    return count


def _eps(module: nn.Module, name: str) -> bool:
    return isinstance(getattr(module, name, None), float)


@functools.cache  # one parse per class, not per layer
def forward_is_rms_norm(cls: type) -> bool:
    """Whether ``cls.forward(self, x)`` is HF's Llama-style RMSNorm, by its syntax tree."""
    node = hf_code.definition(cls.forward)
    if node is None or len(node.args.args) != 2:
        return False
    return hf_code.body_code(node, {node.args.args[1].arg: "x"}) == _RMS_NORM_BODY


@functools.cache
def forward_is_gemma_rms_norm(cls: type) -> bool:
    """Whether ``cls`` computes Gemma's RMSNorm (its ``_norm`` and ``forward``), by their
    syntax trees."""
    bodies = []
    for method in (getattr(cls, "_norm", None), cls.forward):
        node = hf_code.definition(method) if method is not None else None
        if node is None or len(node.args.args) != 2:
            return False
        bodies.append(hf_code.body_code(node, {node.args.args[1].arg: "x"}))
    return bodies == [_GEMMA_NORM_BODY, _GEMMA_FORWARD_BODY]


def _native_forward(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
    weight = self.weight
    if x.dtype == weight.dtype == torch.bfloat16 and x.device.type == "cpu":
        return self._rms_norm(x, weight, self._rms_eps)
    return type(self).forward(self, x)
