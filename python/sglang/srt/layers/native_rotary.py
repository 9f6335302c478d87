"""Rotary embedding of bfloat16 CPU language models on a native kernel
(``kernels/csrc/rotary.cpp``).

HF's Llama-style ``apply_rotary_pos_emb`` (``q * cos + rotate_half(q) * sin``, with cos and
sin unsqueezed at the head dim) takes six tensor passes over q and again over k in every
layer. Where a loaded model's modeling module defines exactly that function (by its syntax
tree: the Qwen, Llama, Mistral and GLM language models among others; a partial rotary or any
other change keeps HF's), the function in that module is replaced by one that hands bfloat16
CPU tensors to the kernel, which rounds where HF's passes round: the result is bit for bit
HF's (``test/test_cpu_kernels.py``), so the replacement stays for the process; other inputs go
to HF's function.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

from sglang.srt.kernels import ops
from sglang.srt.layers import hf_code

FUNCTION = "apply_rotary_pos_emb"
_BODY = """cos = cos.unsqueeze(unsqueeze_dim)
sin = sin.unsqueeze(unsqueeze_dim)
q_embed = q * cos + rotate_half(q) * sin
k_embed = k * cos + rotate_half(k) * sin
return (q_embed, k_embed)"""


def install(modules: Iterable[nn.Module]) -> int:
    """Replace HF's Llama-style ``apply_rotary_pos_emb`` in the modeling module of every class
    among ``modules`` (once per module); returns how many modules now route to the kernel."""
    kernel = ops.rotary()
    if kernel is None:
        return 0
    count = 0
    for namespace in {sys.modules[type(m).__module__] for m in modules}:
        function = getattr(namespace, FUNCTION, None)
        if function is None:
            continue
        if hasattr(function, "hf_function"):
            count += 1
        elif is_llama_rotary(function):
            setattr(namespace, FUNCTION, native_rotary(function, kernel))
            count += 1
    return count


def is_llama_rotary(function: Callable) -> bool:
    """Whether ``function(q, k, cos, sin, unsqueeze_dim=1)`` is HF's Llama-style rotary, by its
    syntax tree (its docstring and decorators aside)."""
    node = hf_code.definition(function)
    if node is None:
        return False
    names = [a.arg for a in node.args.args]
    defaults = [ast.unparse(d) for d in node.args.defaults]
    signature = names == ["q", "k", "cos", "sin", "unsqueeze_dim"] and defaults == ["1"]
    return signature and hf_code.body_code(node) == _BODY


def native_rotary(original: Callable, kernel: Any) -> Callable:
    """``original`` (HF's apply_rotary_pos_emb) with bfloat16 CPU inputs on ``kernel``."""

    def apply_rotary_pos_emb(
        q: torch.Tensor,
        k: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        unsqueeze_dim: int = 1,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if unsqueeze_dim == 1 and _kernel_takes(q, k, cos, sin):
            return kernel.rotary_pair(q, k, cos, sin)
        return original(q, k, cos, sin, unsqueeze_dim)

    apply_rotary_pos_emb.hf_function = original  # type: ignore[attr-defined]
    return apply_rotary_pos_emb


def _kernel_takes(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> bool:
    tensors = (q, k, cos, sin)
    return (
        all(t.dtype == torch.bfloat16 and t.device.type == "cpu" for t in tensors)
        and q.dim() == k.dim() == 4
        and cos.dim() == 3
        and q.stride(-1) == k.stride(-1) == 1
        and q.shape[0] == k.shape[0] == cos.shape[0]
        and q.shape[2] == k.shape[2] == cos.shape[1]
        and q.shape[3] == k.shape[3] == cos.shape[2]
        and cos.shape == sin.shape
        and cos.is_contiguous()
        and sin.is_contiguous()
        and q.shape[3] % 2 == 0
    )
