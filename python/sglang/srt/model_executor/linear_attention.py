"""HF's linear-attention layers (Gated DeltaNet) and gated short convolutions (LFM2 / LFM3) on
engine-owned state.

The engine runs the language model on one packed sequence of several requests. Full-attention
layers go through the attention backend, which keeps requests apart. A linear-attention layer
instead carries a causal convolution and a recurrence along its sequence axis, so it must never
see two requests as one sequence. Each linear-attention module's ``forward`` is therefore wrapped:
with a ``StatePlan`` on the batch, the wrapper runs HF's own forward once per request segment
(decode: once for all requests, as a batch of one-token sequences), handing it a cache object that
reads and writes that request's slot of the ``StatePool``. Without a plan the module runs as HF
wrote it.

A segment may be cut at given offsets: the layer then runs piece by piece and the state after
each cut is copied into a snapshot slot (prefix caching of hybrid models), at the price of one
more call of this layer per cut, not of another model step.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from sglang.srt.mem_cache.state_pool import LinearStateShape, StatePool


@dataclass
class Segment:
    """One request's ``length`` tokens of a step (segments follow each other on the packed
    axis). The state after ``offset`` tokens of the segment is copied into ``slot`` for each
    ``(offset, slot)`` of ``snapshots`` (``0 < offset <= length``)."""

    length: int
    slot: int
    fresh: bool  # no state yet: the request's first computed tokens
    snapshots: list[tuple[int, int]] = field(default_factory=list)
    written: bool = False  # a layer has started to change the slot in this step


@dataclass
class StatePlan:
    """Which pool slots a step's linear-attention layers read and write."""

    pool: StatePool
    segments: list[Segment]
    is_decode: bool

    def select(self, indices: list[int]) -> StatePlan:
        """The plan of a sub-batch (the same segments, so ``written`` stays shared)."""
        return StatePlan(self.pool, [self.segments[i] for i in indices], self.is_decode)


class SlotStates:
    """The part of HF's cache interface a linear-attention layer calls (conv and recurrent state
    of one layer), backed by pool slots: a view of the slot for one sequence, a gathered copy
    written back by ``commit`` for several."""

    def __init__(self, pool: StatePool, layer: int, slots: list[int], fresh: bool) -> None:
        self.pool, self.layer, self.fresh = pool, layer, fresh
        conv, rec = pool.conv[layer], pool.recurrent[layer]
        if len(slots) == 1:
            self.index = None
            self.conv, self.recurrent = conv[slots[0] : slots[0] + 1], rec[slots[0] : slots[0] + 1]
        else:
            self.index = torch.tensor(slots, dtype=torch.int64, device=conv.device)
            self.conv, self.recurrent = conv[self.index], rec[self.index]

    # Read by the layer: None means "no previous state" (HF then starts from zeros).
    def get_conv_state(self, layer_idx: int, state_idx: int = 0) -> torch.Tensor | None:
        return None if self.fresh else self.conv

    def get_recurrent_state(self, layer_idx: int, state_idx: int = 0) -> torch.Tensor | None:
        return None if self.fresh else self.recurrent

    def is_recording_past(self, layer_idx: int) -> bool:
        return False

    def update_conv_state(
        self, conv_states: torch.Tensor, layer_idx: int, state_idx: int = 0, **kwargs: Any
    ) -> torch.Tensor:
        """Keep the last ``kernel`` inputs; return the inputs with the previous ones in front
        (zero padded when fresh), as HF's own cache does."""
        kernel = self.conv.shape[-1]
        if self.fresh:
            full = conv_states
            if full.shape[-1] < kernel:
                full = F.pad(full, (kernel - full.shape[-1], 0))
        else:
            full = torch.cat([self.conv.to(conv_states.dtype), conv_states], dim=-1)
        self.conv.copy_(full[..., -kernel:])
        return full

    def update_recurrent_state(
        self, recurrent_states: torch.Tensor, layer_idx: int, state_idx: int = 0, **kwargs: Any
    ) -> torch.Tensor:
        self.recurrent.copy_(recurrent_states)
        return self.recurrent

    def commit(self) -> None:
        if self.index is not None:
            self.pool.conv[self.layer].index_copy_(0, self.index, self.conv)
            self.pool.recurrent[self.layer].index_copy_(0, self.index, self.recurrent)


class _PooledForward:
    """Replacement ``forward`` of one linear-attention module (see the module docstring)."""

    def __init__(self, module: nn.Module) -> None:
        self.layer = int(module.layer_idx)
        self.inner: Callable[..., torch.Tensor] = module.forward
        # The cache argument follows the hidden states: ``cache_params`` (Gated DeltaNet) or
        # ``past_key_values`` (short convolutions).
        self.cache_arg = list(inspect.signature(self.inner).parameters)[1]

    def __call__(self, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        batch = kwargs.pop("forward_batch", None)
        plan: StatePlan | None = getattr(batch, "state_plan", None)
        if plan is None:
            return self.inner(hidden_states, *args, **kwargs)
        # The state is the pool's and every call sees one unpadded sequence (or one token each):
        # the cache and attention mask the model passes (positionally or by name) are dropped.
        kwargs.pop(self.cache_arg, None)
        kwargs.pop("attention_mask", None)
        if plan.is_decode:
            return self._decode(plan, hidden_states, kwargs)
        outs, start = [], 0
        for seg in plan.segments:
            outs.append(
                self._segment(plan, seg, hidden_states[:, start : start + seg.length], kwargs)
            )
            start += seg.length
        return torch.cat(outs, dim=1)

    def _decode(self, plan: StatePlan, hidden: torch.Tensor, kwargs: dict) -> torch.Tensor:
        """All requests at once, as a batch of one-token sequences."""
        states = SlotStates(plan.pool, self.layer, [s.slot for s in plan.segments], fresh=False)
        for seg in plan.segments:
            seg.written = True
        out = self._run(hidden.transpose(0, 1), states, kwargs)
        states.commit()
        return out.transpose(0, 1)

    def _segment(
        self, plan: StatePlan, seg: Segment, hidden: torch.Tensor, kwargs: dict
    ) -> torch.Tensor:
        cuts = sorted(seg.snapshots)
        bounds = sorted({0, seg.length, *(offset for offset, _ in cuts)})
        outs, fresh = [], seg.fresh
        seg.written = True
        for lo, hi in zip(bounds, bounds[1:]):
            states = SlotStates(plan.pool, self.layer, [seg.slot], fresh)
            piece = hidden[:, lo:hi]
            outs.append(self._run(piece, states, kwargs))
            fresh = False
            for offset, snapshot in cuts:
                if offset == hi:
                    plan.pool.copy(seg.slot, snapshot, layers=(self.layer,))
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)

    def _run(self, hidden: torch.Tensor, states: SlotStates, kwargs: dict) -> torch.Tensor:
        return self.inner(hidden, **{self.cache_arg: states, "attention_mask": None}, **kwargs)


def _is_linear_attention(module: nn.Module) -> bool:
    """HF's Gated DeltaNet modules (Qwen3.5, Qwen3.5-MoE, Qwen3-Next) and look-alikes."""
    needed = ("layer_idx", "conv_dim", "conv_kernel_size", "num_v_heads", "head_k_dim")
    return all(hasattr(module, name) for name in needed) and hasattr(module, "head_v_dim")


def _is_short_conv(module: nn.Module) -> bool:
    """LFM2 / LFM3's gated short convolutions: a depthwise causal conv, no recurrence."""
    conv = getattr(module, "conv", None)
    return (
        getattr(module, "layer_type", None) == "conv"
        and isinstance(conv, nn.Conv1d)
        and hasattr(module, "layer_idx")
        and hasattr(module, "conv_kernel_size")
    )


def _state_shapes(module: nn.Module) -> tuple[tuple[int, int], tuple[int, int, int]] | None:
    """(conv, recurrent) state shape of one sequence in ``module``, None for a stateless one; a
    short convolution keeps no recurrent state (an empty one)."""
    if _is_linear_attention(module):
        conv = (int(module.conv_dim), int(module.conv_kernel_size))
        return conv, (int(module.num_v_heads), int(module.head_k_dim), int(module.head_v_dim))
    if _is_short_conv(module):
        return (int(module.conv.in_channels), int(module.conv_kernel_size)), (0, 0, 0)
    return None


def install_pooled_linear_attention(
    language_model: nn.Module, conv_dtype: torch.dtype, recurrent_dtype: torch.dtype
) -> LinearStateShape | None:
    """Wrap every linear-attention (or short-convolution) module of ``language_model``; return
    the per-slot state shape, or None when the model has no such layer."""
    shapes = {m: _state_shapes(m) for m in language_model.modules()}
    modules = [m for m, shape in shapes.items() if shape is not None]
    if not modules:
        return None
    if len({shapes[m] for m in modules}) > 1:
        raise ValueError("linear-attention layers whose state shapes differ are not supported")
    for module in modules:
        module.forward = _PooledForward(module)
    conv, recurrent = shapes[modules[0]]
    return LinearStateShape(
        layer_ids=tuple(int(m.layer_idx) for m in modules),
        conv=conv,
        recurrent=recurrent,
        conv_dtype=conv_dtype,
        recurrent_dtype=recurrent_dtype,
    )
