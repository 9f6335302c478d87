"""bfloat16 weights served in float32: on a CPU without native bfloat16 arithmetic (AVX2 only),
a bfloat16 checkpoint runs in float32, but its linear and embedding weights stay stored in
bfloat16, half the bytes (a 7B in ~16 GB rather than ~31).

Each weight is widened exactly where it is used, so the result is the float32 model on the
checkpoint's own values (``--dtype float32`` on the same checkpoint computes the same products
in another summation order). Every other parameter and buffer (norms, biases, convolutions, the
tower's patch embedding) is float32. Decode-sized inputs (up to ``MAX_KERNEL_ROWS`` rows) run on
``linear_bf16.cpp``'s ``linear_mixed``, which widens the weight in registers and reads it at
memory bandwidth: a 3584 -> 18944 weight took 5.0 ms at one row against torch's float32
product's 11.3 on the float32 copy (AMD EPYC Zen 3, AVX2, 2 threads). Larger inputs (prompt
chunks, the vision tower) take torch's float32 GEMM on ``BLOCK_ROWS`` weight rows at a time,
each widened into a float32 copy that stays in cache: 433 rows of that weight, 341 ms against
376 on the whole float32 copy, the same machine.

Stored so: plain ``nn.Linear`` modules (their forward is exactly ``F.linear``) and the token
embeddings, when a plain ``nn.Embedding``. Float32: subclasses, which may scale or cast by
their weight's dtype; patch embeddings, and the towers' position tables, since model code casts
the pixels to the dtype of the tower's first parameter or of its patch projection (so they
would reach it rounded to bfloat16).
"""

from __future__ import annotations

import types
from collections.abc import Collection
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from sglang.srt.kernels import ops
from sglang.srt.layers.quantization.base import LinearMethod, attach, attached

MAX_KERNEL_ROWS = 16
BLOCK_ROWS = 1024


@dataclass(frozen=True)
class StoredWeights:
    """What ``store_in_bfloat16`` left: linears and embeddings on bfloat16 weights, their bytes,
    and the parameters and buffers widened to float32."""

    linears: int
    embeddings: int
    bfloat16_bytes: int
    widened: int


def store_in_bfloat16(
    model: nn.Module, embeddings: Collection[nn.Module] | None = None
) -> StoredWeights:
    """Make a model loaded in bfloat16 compute in float32: every floating parameter and buffer
    becomes float32 except the weights of plain linears (but patch embeddings) and of the plain
    ``embeddings`` given (None: every one), whose forwards take float32 inputs (or any floating
    dtype) and give float32. A parameter shared by several modules (tied embeddings) stays one
    tensor."""
    kept: dict[int, nn.Parameter] = {}
    widened: dict[int, nn.Parameter] = {}
    chosen = None if embeddings is None else {id(m) for m in embeddings}
    linears = stored_embeddings = 0
    for name, module in model.named_modules():
        stores = _stores(name, module, chosen)
        for key, param in list(module._parameters.items()):
            if param is None or not param.is_floating_point():
                continue
            if stores and key == "weight":
                kept[id(param)] = param
                continue
            if id(param) in kept:  # shared with a stored weight: stays that one tensor
                continue
            new = widened.get(id(param))
            if new is None:
                new = nn.Parameter(param.detach().float(), requires_grad=param.requires_grad)
                widened[id(param)] = new
            module._parameters[key] = new
        for key, buffer in list(module._buffers.items()):
            if buffer is not None and buffer.is_floating_point():
                module._buffers[key] = buffer.float()
        if stores and isinstance(module, nn.Linear):
            WIDENED.process_weights_after_loading(module)
            linears += 1
        elif stores:
            module.forward = types.MethodType(_embedding_forward, module)
            stored_embeddings += 1
    size = sum(p.numel() * p.element_size() for p in kept.values())
    return StoredWeights(linears, stored_embeddings, size, len(widened))


def _stores(name: str, module: nn.Module, embeddings: set[int] | None) -> bool:
    if type(module) is nn.Linear:
        return _is_bf16(module.weight) and "patch_embed" not in name
    chosen = embeddings is None or id(module) in embeddings
    return type(module) is nn.Embedding and chosen and _is_bf16(module.weight)


def stores_bfloat16(module: nn.Module) -> bool:
    """Whether ``store_in_bfloat16`` left this module on a bfloat16 weight it widens."""
    forward = getattr(module.__dict__.get("forward"), "__func__", None)
    return isinstance(attached(module), WidenedMethod) or forward is _embedding_forward


def _is_bf16(weight: object) -> bool:
    return (
        isinstance(weight, torch.Tensor)
        and type(weight.data) is torch.Tensor
        and weight.dtype == torch.bfloat16
    )


class WidenedMethod(LinearMethod):
    """A bfloat16 weight under float32 compute, widened as it is read: decode rows on
    ``linear_mixed`` (the module's ``_widening_kernel``; None: torch's widening and product),
    the rest on torch's float32 GEMM by blocks of weight rows (``blocked_product``)."""

    names = {
        "bf16-widened": "a bfloat16 weight under float32 compute, widened as it is read: decode "
        "rows on the native kernel (linear_mixed), prompt chunks on torch's float32 GEMM by "
        "blocks"
    }

    def process_weights_after_loading(self, layer: nn.Module) -> nn.Module:
        layer._widening_kernel = ops.linear_bf16()
        return attach(layer, self)

    def apply(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // x.shape[-1] if x.numel() else 0
        flat = x.reshape(rows, x.shape[-1]).float()
        kernel = layer._widening_kernel
        if 0 < rows <= MAX_KERNEL_ROWS and kernel is not None:
            out = kernel.linear_mixed(flat.contiguous(), layer.weight, layer.bias)
        else:
            out = blocked_product(flat, layer.weight, layer.bias, kernel)
        return out.reshape(*x.shape[:-1], layer.out_features)

    def name(self, layer: nn.Module) -> str:
        return "bf16-widened"


WIDENED = WidenedMethod()


def blocked_product(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, kernel: ops.LinearBf16 | None
) -> torch.Tensor:
    """float32 ``x`` times the bfloat16 ``weight`` (out, in) transposed, ``BLOCK_ROWS`` weight
    rows at a time, each widened to float32 just before torch's GEMM reads it."""
    out = x.new_empty(x.shape[0], weight.shape[0])
    for start in range(0, weight.shape[0], BLOCK_ROWS):
        block = weight[start : start + BLOCK_ROWS]
        wide = kernel.widen_bf16(block) if kernel is not None else block.float()
        part = out[:, start : start + block.shape[0]]
        if bias is None:
            torch.mm(x, wide.t(), out=part)
        else:
            torch.addmm(bias[start : start + block.shape[0]], x, wide.t(), out=part)
    return out


def _embedding_forward(self: nn.Embedding, ids: torch.Tensor) -> torch.Tensor:
    rows = F.embedding(
        ids, self.weight, self.padding_idx, self.max_norm, self.norm_type,
        self.scale_grad_by_freq, self.sparse,
    )  # fmt: skip
    return rows.float()
