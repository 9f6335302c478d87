"""Faster vision towers for the Qwen-VL families, swapped in at load time (no forks of HF code).

Five changes, checked against HF's own tower in ``test/test_fast_vision.py``:

- **Attention, one call per run of equal segments** (bitwise equal to HF). After loading, the
  vision config's attention implementation is set to ``VISION_ATTENTION_NAME``; its name
  contains "flash", so the HF vision blocks hand the whole packed sequence and its
  ``cu_seqlens`` (images, or Qwen2.5-VL's windows) to ``varlen_vision_attention`` in one call
  instead of one SDPA call per segment.
  Consecutive segments of equal length (the full windows of a row, images of one size) become
  one batch of strided views for the same SDPA kernel, which computes every (segment, head) on
  its own exactly as the per-segment calls do.
- **Attention on CUDA in one flash call** (``torch.nn.attention.varlen.varlen_attn``) for
  bfloat16 and float16: every segment of the packed sequence at once, with the maximum segment
  length HF computes once per tower forward (the SDPA path reads the lengths from the device in
  every layer). Measured on an H200 against SDPA per run (``benchmark/vision_attention.py
  --device cuda``): 1.25x on 75 windows of 64 tokens, 0.73x on one 4,784-token image (SDPA's
  own kernel for a single long segment is faster); the tower's total is about even. float32
  keeps the SDPA path (``test/test_cuda.py``).
- **Attention on the native CPU kernel** where it builds (``kernels/csrc/prefill_attention.cpp``,
  ``varlen_attention``: all segments in one call, float32 softmax, within float rounding of the
  SDPA path, ``test/test_vision_attention.py``): bfloat16 and float32 on the CPU; in bfloat16,
  head dims that are not a multiple of 16 (Qwen3-VL's 72) are zero-padded to one. The torch
  path above stays for other inputs and with ``SGLANG_DISABLE_CPU_KERNELS=1``.
- **Rotary embedding on the native CPU kernel** (``kernels/csrc/vision_rotary.cpp``): the
  towers' ``apply_rotary_pos_emb_vision`` (nine float32 tensor passes over q and k per layer)
  is replaced, in the HF module that defines it, by a wrapper that hands CPU tensors to one
  pass computing the same float32 operations in the same order: bit for bit HF's result
  (``test/test_fast_vision.py``), 6.5x faster in bfloat16 at 1,564 tokens x 16 heads of 80.
  Since the result is identical, the replacement is left in place for the process (other
  inputs go to HF's function).
- **Patch embedding as one matrix product**: a Conv3d whose kernel equals its stride over
  inputs of exactly one kernel each is a linear map of the flattened patch, so the embedding's
  ``proj`` becomes that ``nn.Linear`` (the Conv3d weight's own storage, viewed as (out, in)).
  Being a plain linear of the tower, it is then served as the tower's other linears are: on
  packed weights in bfloat16, in int8dq with ``--vision-int8dq``. The sum runs in another order
  than the convolution's, so embeddings differ from HF's in the last bits (|d| ~ 1e-6
  relative); greedy outputs stay equal to HF's in the parity tests.
  ``SGLANG_EXACT_PATCH_EMBED=1`` keeps HF's Conv3d.
"""

from __future__ import annotations

import os
import sys
import time
import types
import weakref
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
import transformers
from torch import nn

from sglang.srt.core.perf_counters import PerfCounters
from sglang.srt.kernels import ops
from sglang.srt.layers.quantization.base import keep_out_of_compile

VISION_ATTENTION_NAME = "sglang_vision_flash_varlen"
FAST_VISION_MODEL_TYPES = frozenset({"qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe"})


def varlen_vision_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    cu_seq_lens_q: torch.Tensor | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Bidirectional attention within each segment ``[cu[i], cu[i+1])`` of the packed tokens.

    q, k, v: (1, heads, N, dim). Returns (1, N, heads, dim), as HF's attention functions do."""
    if cu_seq_lens_q is None:
        out = F.scaled_dot_product_attention(
            query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling
        )
        return out.transpose(1, 2).contiguous(), None
    started = time.perf_counter()
    q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))  # (N, heads, dim) views
    kernel = getattr(module, "attention_kernel", None)
    max_length = kwargs.get("max_length_q")
    if kernel is not None and dropout == 0.0 and _kernel_takes(q, k, v):
        scale = scaling if scaling is not None else q.shape[-1] ** -0.5
        out = _segments_on_kernel(kernel, q, k, v, cu_seq_lens_q, scale)
    elif dropout == 0.0 and isinstance(max_length, int) and _flash_takes(q, k, v):
        out = _segments_on_flash(q, k, v, cu_seq_lens_q, max_length, scaling)
    else:
        out = _segments_by_runs(q, k, v, cu_seq_lens_q.tolist(), scaling, dropout)
    counters = getattr(module, "perf_counters", None)
    if counters is not None:
        elapsed = time.perf_counter() - started
        flops = 4.0 * q.shape[1] * q.shape[2] * _squared_lengths(cu_seq_lens_q)
        counters.add_vision_attention(elapsed, flops)
    return out.unsqueeze(0), None


# The towers pass the same cu_seqlens tensor to every layer of a forward (one for full
# attention, one for windows): its sum of squared segment lengths is read from the device once.
_SQUARES_SEEN: list[tuple[weakref.ref, float]] = []


def _squared_lengths(cu_seqlens: torch.Tensor) -> float:
    for ref, squares in _SQUARES_SEEN:
        if ref() is cu_seqlens:
            return squares
    lengths = cu_seqlens[1:] - cu_seqlens[:-1]
    squares = float((lengths.double() ** 2).sum())
    _SQUARES_SEEN[:] = [*_SQUARES_SEEN[-1:], (weakref.ref(cu_seqlens), squares)]
    return squares


def _segments_by_runs(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: list[int],
    scaling: float | None,
    dropout: float,
) -> torch.Tensor:
    """Torch SDPA, one call per run of equal segments; (N, heads, dim) in and out."""
    out = q.new_empty(q.shape[0], q.shape[1], v.shape[-1])
    for start, count, length in equal_segment_runs(cu_seqlens):
        rows = slice(start, start + count * length)
        qs, ks, vs = (t[rows].unflatten(0, (count, length)).transpose(1, 2) for t in (q, k, v))
        o = F.scaled_dot_product_attention(qs, ks, vs, dropout_p=dropout, scale=scaling)
        out[rows].unflatten(0, (count, length)).copy_(o.transpose(1, 2))
    return out


def _kernel_takes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """bfloat16, or float32 with a head dim the kernel takes unpadded: padded float32 (72 ->
    80) measured 0.92-0.97x torch's rate, bfloat16 1.8-1.9x (``benchmark/vision_attention.py``)."""
    same = q.dtype == k.dtype == v.dtype and q.shape[-1] == k.shape[-1] == v.shape[-1]
    on_cpu = q.device.type == k.device.type == v.device.type == "cpu"
    unpadded_float = q.dtype == torch.float32 and q.shape[-1] % 16 == 0
    return same and on_cpu and (q.dtype == torch.bfloat16 or unpadded_float)


def _flash_takes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Half-precision CUDA tensors of one dtype whose head dim flash attention takes."""
    dims = {q.shape[-1], k.shape[-1], v.shape[-1]}
    return (
        q.device.type == k.device.type == v.device.type == "cuda"
        and q.dtype == k.dtype == v.dtype
        and q.dtype in (torch.bfloat16, torch.float16)
        and len(dims) == 1
        and q.shape[-1] % 8 == 0
        and q.shape[-1] <= 256
    )


def _segments_on_flash(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_length: int,
    scaling: float | None,
) -> torch.Tensor:
    """Every segment in one varlen flash call (bidirectional); (N, heads, dim) in and out."""
    from torch.nn.attention.varlen import varlen_attn

    cu = cu_seqlens.to(torch.int32)
    q, k, v = (t.contiguous() for t in (q, k, v))
    return varlen_attn(q, k, v, cu, cu, max_length, max_length, scale=scaling)


def _segments_on_kernel(
    kernel: Any,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """All segments in one native call; (N, heads, dim) in and out. Head dims are zero-padded
    to a multiple of 16 (zeros add nothing to the scores, and their outputs are dropped)."""
    dim = q.shape[-1]
    pad = -dim % 16
    if pad:
        q, k, v = (F.pad(t, (0, pad)) for t in (q, k, v))
    else:
        q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    out = q.new_empty(q.shape)
    kernel.varlen_attention(out, q, k, v, cu_seqlens, scale)
    return out[..., :dim] if pad else out


def equal_segment_runs(cu_seqlens: list[int]) -> list[tuple[int, int, int]]:
    """Group consecutive segments of equal length: [(first token, segments, length), ...]."""
    runs: list[tuple[int, int, int]] = []
    for a, b in zip(cu_seqlens, cu_seqlens[1:]):
        length = b - a
        if length == 0:
            continue
        if runs and runs[-1][2] == length:
            start, count, _ = runs[-1]
            runs[-1] = (start, count + 1, length)
        else:
            runs.append((a, 1, length))
    return runs


transformers.AttentionInterface.register(VISION_ATTENTION_NAME, varlen_vision_attention)


def install(model: nn.Module, config: Any, counters: PerfCounters | None = None) -> bool:
    """Route a loaded Qwen-VL tower's attention to ``varlen_vision_attention`` and swap its
    patch embedding for the matrix-product form (in place). Returns whether it applied. The
    attention adds its FLOPs to ``counters`` and runs on the native kernel where it loads (both
    held by each attention module).

    The implementation is set after loading: at load time transformers would look for a flash
    kernel behind any name that contains "flash"."""
    if config.model_type not in FAST_VISION_MODEL_TYPES:
        return False
    tower = model.model.visual
    on_cpu = next(tower.parameters()).device.type == "cpu"  # native kernels are CPU code
    for module in tower.modules():
        module_config = getattr(module, "config", None)
        if module_config is not None and hasattr(module_config, "_attn_implementation_internal"):
            module_config._attn_implementation_internal = VISION_ATTENTION_NAME
            module.perf_counters = counters
            module.attention_kernel = ops.prefill_attention() if on_cpu else None
    if on_cpu:
        _install_native_rotary(tower)
    if patch_embedding_is_linear(config.model_type):
        patch_embeddings_as_linears(tower)
    return True


def patch_embedding_is_linear(model_type: str) -> bool:
    """Whether a loaded model of ``model_type`` serves its patchwise Conv3d as a linear of its
    tower (``patch_embeddings_as_linears``), which quantization then takes too."""
    exact = os.environ.get("SGLANG_EXACT_PATCH_EMBED", "0") == "1"
    return model_type in FAST_VISION_MODEL_TYPES and not exact


def patch_embeddings_as_linears(tower: nn.Module) -> int:
    """Swap the patchwise Conv3d of every ``*PatchEmbed`` in ``tower`` for the equivalent
    ``nn.Linear`` over flattened patches (in place); returns how many."""
    count = 0
    for module in list(tower.modules()):
        if type(module).__name__.endswith("PatchEmbed") and _is_patchwise_conv(module):
            conv = module.proj
            weight = conv.weight.detach().reshape(conv.out_channels, -1)
            linear = nn.Linear(weight.shape[1], weight.shape[0], conv.bias is not None, "meta")
            linear.weight = nn.Parameter(weight, requires_grad=False)
            if conv.bias is not None:
                linear.bias = nn.Parameter(conv.bias.detach(), requires_grad=False)
            module.proj = linear
            module.forward = types.MethodType(_patch_embed_as_linear, module)
            count += 1
    return count


ROTARY_FUNCTION = "apply_rotary_pos_emb_vision"


def _install_native_rotary(tower: nn.Module) -> None:
    """Replace the rotary function of every HF module that defines the tower's blocks (once)."""
    kernel = ops.vision_rotary()
    if kernel is None:
        return
    for module in tower.modules():
        namespace = sys.modules[type(module).__module__]
        original = getattr(namespace, ROTARY_FUNCTION, None)
        if original is not None and not hasattr(original, "hf_function"):
            setattr(namespace, ROTARY_FUNCTION, native_rotary(original, kernel))


def native_rotary(original: Callable, kernel: Any) -> Callable:
    """``original`` (HF's apply_rotary_pos_emb_vision) with CPU inputs on ``kernel``."""

    def apply_rotary_pos_emb_vision(
        q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if _rotary_takes(q, k, cos, sin):
            return kernel.rotary_pair(q, k, cos, sin)
        return original(q, k, cos, sin)

    apply_rotary_pos_emb_vision.hf_function = original  # type: ignore[attr-defined]
    return apply_rotary_pos_emb_vision


def _rotary_takes(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> bool:
    tensors = (q, k, cos, sin)
    return (
        all(t.device.type == "cpu" for t in tensors)
        and q.dtype == k.dtype
        and q.dtype in (torch.bfloat16, torch.float32)
        and q.dim() == k.dim() == 3
        and q.shape == k.shape
        and q.stride(-1) == k.stride(-1) == 1
        and cos.dtype == sin.dtype == torch.float32
        and cos.shape == sin.shape == (q.shape[0], q.shape[2])
        and cos.is_contiguous()
        and sin.is_contiguous()
        and q.shape[2] % 2 == 0
    )


def _is_patchwise_conv(module: nn.Module) -> bool:
    proj = getattr(module, "proj", None)
    return (
        isinstance(proj, nn.Conv3d)
        and tuple(proj.kernel_size) == tuple(proj.stride)
        and all(p == 0 for p in proj.padding)  # type: ignore[union-attr]
        and proj.groups == 1
        and proj.dilation == (1, 1, 1)
    )


def _patch_embed_as_linear(self: nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
    """Rows of ``hidden_states`` are flattened (channel, time, height, width) patches, the
    layout of the Conv3d weight: one patch under the kernel is one dot product per channel."""
    proj = self.proj
    patches = hidden_states.reshape(-1, proj.in_features)
    return proj(patches.to(proj.weight.dtype))


def compile_tower(model: nn.Module) -> None:
    """``--enable-torch-compile``: compile each vision block and the merger with dynamic shapes
    (inductor fuses the norms, rotary and MLP activations; the attention call stays eager, and
    so do the linears a method serves: ``keep_out_of_compile``). Called once the kernels are
    installed. Measured on the small model, 720p, 1 thread: 5% less CPU per image, after 4
    minutes of compilation per new shape class on a loaded 2-core machine, so it is off by
    default."""
    tower = model.model.visual
    keep_out_of_compile(tower)
    for i, block in enumerate(tower.blocks):
        tower.blocks[i] = torch.compile(block, dynamic=True)
    tower.merger = torch.compile(tower.merger, dynamic=True)
