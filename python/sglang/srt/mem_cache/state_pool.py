"""Engine-owned state of linear-attention layers (Gated DeltaNet, Mamba-style), in slots.

A hybrid model's linear-attention layers keep, per sequence and layer, a fixed-size convolution
state (the last ``kernel`` inputs of the causal conv, ``(conv_dim, kernel)``) and a recurrent
state (``(heads, key_dim, value_dim)``) instead of per-token KV. One slot holds both, for every
linear layer, for one sequence position: a running request's current state or a prefix-cache
snapshot of some request's state at a given prefix.

Invariants (checked by ``check_integrity``):
- every slot in ``[0, size)`` is either free or held by exactly one owner (a running request or
  a snapshot); the pool tracks only the free set, owners track the rest;
- the free list never holds duplicates and stays in range;
- with the owners' count, ``free + held == size``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class LinearStateShape:
    """Per-layer shapes of one sequence's state, without the slot dimension."""

    layer_ids: tuple[int, ...]  # the model's linear-attention layer indices
    conv: tuple[int, int]  # (conv_dim, kernel)
    recurrent: tuple[int, int, int]  # (value heads, key head dim, value head dim)
    conv_dtype: torch.dtype
    recurrent_dtype: torch.dtype

    @property
    def bytes_per_slot(self) -> int:
        conv = self.conv[0] * self.conv[1] * _itemsize(self.conv_dtype)
        rec = self.recurrent[0] * self.recurrent[1] * self.recurrent[2]
        return len(self.layer_ids) * (conv + rec * _itemsize(self.recurrent_dtype))


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty(0, dtype=dtype).element_size()


class StatePool:
    """``size`` slots of conv and recurrent state for every linear-attention layer."""

    def __init__(self, size: int, shape: LinearStateShape, device: str) -> None:
        self.size = size
        self.shape = shape
        self.device = device
        self.conv = {
            layer: torch.empty((size, *shape.conv), dtype=shape.conv_dtype, device=device)
            for layer in shape.layer_ids
        }
        self.recurrent = {
            layer: torch.empty((size, *shape.recurrent), dtype=shape.recurrent_dtype, device=device)
            for layer in shape.layer_ids
        }
        self._free = list(range(size - 1, -1, -1))

    @property
    def bytes_per_slot(self) -> int:
        return self.shape.bytes_per_slot

    @property
    def nbytes(self) -> int:
        return self.size * self.bytes_per_slot

    def available_size(self) -> int:
        return len(self._free)

    def alloc(self) -> int | None:
        return self._free.pop() if self._free else None

    def free(self, slot: int) -> None:
        self._free.append(slot)

    def copy(self, src: int, dst: int, layers: Sequence[int] | None = None) -> None:
        """Copy the state of slot ``src`` into slot ``dst`` (every layer, or ``layers``)."""
        for layer in self.shape.layer_ids if layers is None else layers:
            self.conv[layer][dst].copy_(self.conv[layer][src])
            self.recurrent[layer][dst].copy_(self.recurrent[layer][src])

    def check_integrity(self, held: int | None = None) -> None:
        assert len(set(self._free)) == len(self._free), "duplicate free state slots"
        assert all(0 <= s < self.size for s in self._free), "free state slot out of range"
        if held is not None:
            assert held + len(self._free) == self.size, (
                f"state slot leak: {held} held + {len(self._free)} free != {self.size}"
            )
