"""Work and time counters of a model forward, for achieved GFLOP/s and model FLOPs utilisation.

- Vision tower: seconds inside the tower's forward; FLOPs of its linear layers (2 x in x out
  per row, counted by forward hooks), of its patch embedding, and of its attention (counted by
  ``varlen_vision_attention``: 4 x heads x dim x len^2 per segment). The attention's seconds
  and FLOPs are also kept apart (``vision_attention_*``, included in ``vision_*``): under
  int8dq the tower's linears multiply int8 and its attention bfloat16, two different peaks.
- Language-model attention of prefill forwards (prompts and their chunks: the work before a
  request's first token): seconds inside the attention backend (KV store + attention) and the
  FLOPs of causal attention, 4 x heads x dim x queries x (mean keys per query). Decode
  forwards' attention counts its seconds apart (``decode_attention_seconds``).
- Language-model linears of prefill forwards: 2 x tokens x (in x out summed over the LM's dense
  linears), and the LM head's 2 x rows x hidden x vocab (MoE experts, stored as 3-D tensors,
  are not counted: MFU is a lower bound for MoE models).
- Forward and sampling seconds (prefill and decode forwards apart), and per decode step the
  bytes it must read: the LM's weights and head once (one embedding row per request) plus
  every request's KV.

Counts are analytic (multiply-adds x 2), so GFLOP/s compares directly with a GEMM peak.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn


@dataclass
class PerfCounters:
    vision_seconds: float = 0.0
    vision_flops: float = 0.0
    vision_calls: int = 0
    vision_attention_seconds: float = 0.0
    vision_attention_flops: float = 0.0
    lm_attention_seconds: float = 0.0
    lm_attention_flops: float = 0.0
    decode_attention_seconds: float = 0.0
    lm_linear_flops: float = 0.0
    lm_head_flops: float = 0.0
    prefill_forward_seconds: float = 0.0
    decode_forward_seconds: float = 0.0
    decode_steps: int = 0
    decode_bytes: float = 0.0  # weights + KV each decode step must read
    sampling_seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def add_vision_attention(self, seconds: float, flops: float) -> None:
        self.vision_attention_seconds += seconds
        self.vision_attention_flops += flops
        self.vision_flops += flops

    def add_lm_attention(self, seconds: float, flops: float) -> None:
        self.lm_attention_seconds += seconds
        self.lm_attention_flops += flops


def causal_keys_seen(prefix: int, q_len: int) -> float:
    """Keys seen by ``q_len`` queries at positions [prefix, prefix + q_len) under a causal mask
    (all earlier ones and itself), summed over the queries."""
    return q_len * prefix + q_len * (q_len + 1) / 2


def causal_attention_flops(heads: int, dim: int, keys_seen: float) -> float:
    """QK^T and PV of queries that see ``keys_seen`` keys in all (``causal_keys_seen``)."""
    return 4.0 * heads * dim * keys_seen


def wait_for_device(device: torch.device | str) -> None:
    """Wait until ``device`` has run the work queued on it, before a clock is read: CUDA runs
    kernels asynchronously, so a host clock alone measures their launches."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def instrument_vision(tower: nn.Module, counters: PerfCounters) -> None:
    """Time ``tower``'s forward and count the FLOPs of its linear and patch-projection layers
    (the clock is read once the device is done)."""
    started: list[float] = []
    device = next(tower.parameters()).device

    def before(module: nn.Module, args: Any) -> None:
        wait_for_device(device)
        started.append(time.perf_counter())

    def after(module: nn.Module, args: Any, output: Any) -> None:
        wait_for_device(device)
        counters.vision_seconds += time.perf_counter() - started.pop()
        counters.vision_calls += 1

    tower.register_forward_pre_hook(before)
    tower.register_forward_hook(after)
    for module in tower.modules():
        if isinstance(module, nn.Linear):
            module.register_forward_hook(_count_linear(counters))
        elif (
            type(module).__name__.endswith("PatchEmbed")
            and hasattr(module, "proj")
            and not isinstance(module.proj, nn.Linear)  # counted as a linear
        ):
            module.register_forward_hook(_count_patch_embed(counters))


def _count_linear(counters: PerfCounters):
    def hook(module: nn.Linear, args: Any, output: Any) -> None:
        rows = output.numel() // module.out_features
        counters.vision_flops += 2.0 * rows * module.in_features * module.out_features

    return hook


def _count_patch_embed(counters: PerfCounters):
    def hook(module: nn.Module, args: Any, output: Any) -> None:
        weight = module.proj.weight
        counters.vision_flops += 2.0 * output.numel() * weight[0].numel()

    return hook
