"""RMSNorms of bfloat16 CPU models on a native one-pass kernel (``kernels/csrc/rms_norm.cpp``).

HF's Llama-style RMSNorm (the language models of the Qwen, Llama, Mistral, GLM and Granite
families among 140 classes in transformers, Qwen2.5-VL's and InternVL's towers) takes seven
tensor passes per call: two per decoder layer and the final one, over every token of a prompt
and again at each decode step. A norm is routed to the kernel where its class's forward is,
by its syntax tree, exactly that definition (Gemma's ``1 + weight``, a norm without weight, or
any other change keeps HF's code). The kernel rounds where HF rounds: results equal HF's
except, rarely, by up to two units in the last place (``test/test_cpu_kernels.py``). bfloat16 CPU
models only: float32, the exact mode, keeps HF's code, as does a weight kept in float32.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Iterable

import torch
from torch import nn

from sglang.srt import kernels
from sglang.srt.layers import hf_code

# The body of HF's Llama-style RMSNorm forward (``hidden_states`` renamed to ``x``).
_RMS_NORM_BODY = """input_dtype = x.dtype
x = x.to(torch.float32)
variance = x.pow(2).mean(-1, keepdim=True)
x = x * torch.rsqrt(variance + self.variance_epsilon)
return self.weight * x.to(input_dtype)"""


def install_rms_norms(modules: Iterable[nn.Module]) -> int:
    """Route every HF Llama-style RMSNorm among ``modules`` through the kernel (in place);
    returns how many (none where the kernel does not build)."""
    kernel = kernels.load("rms_norm")
    if kernel is None:
        return 0
    count = 0
    for module in modules:
        weight = getattr(module, "weight", None)
        if (
            isinstance(weight, torch.Tensor)
            and weight.dim() == 1
            and isinstance(getattr(module, "variance_epsilon", None), float)
            and forward_is_rms_norm(type(module))
        ):
            module._rms_norm = kernel
            module.forward = types.MethodType(_native_forward, module)
            count += 1
    return count


@functools.cache  # one parse per class, not per layer
def forward_is_rms_norm(cls: type) -> bool:
    """Whether ``cls.forward(self, x)`` is HF's Llama-style RMSNorm, by its syntax tree."""
    node = hf_code.definition(cls.forward)
    if node is None or len(node.args.args) != 2:
        return False
    return hf_code.body_code(node, {node.args.args[1].arg: "x"}) == _RMS_NORM_BODY


def _native_forward(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
    weight = self.weight
    if x.dtype == weight.dtype == torch.bfloat16 and x.device.type == "cpu":
        return self._rms_norm.rms_norm(x, weight, self.variance_epsilon)
    return type(self).forward(self, x)
