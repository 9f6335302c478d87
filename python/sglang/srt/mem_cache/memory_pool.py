"""Engine-owned KV storage: a request-to-slot table and a token-slot KV pool.

Invariants (checked by ``check_integrity``):
- every KV slot index in ``[0, size)`` is either free or owned by exactly one holder (a running
  request or a radix-cache node); the pool only tracks the free set, holders track the rest;
- the free list never holds duplicates;
- a request row of ``req_to_token`` is meaningful only while that row is allocated.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


class ReqToTokenPool:
    """Maps a request row to the KV slots of its tokens, in token order."""

    def __init__(self, size: int, max_context_len: int, device: str) -> None:
        self.size = size
        self.max_context_len = max_context_len
        self.req_to_token = torch.zeros((size, max_context_len), dtype=torch.int64, device=device)
        self.free_rows = list(range(size))

    def alloc(self) -> int | None:
        return self.free_rows.pop() if self.free_rows else None

    def free(self, row: int) -> None:
        self.free_rows.append(row)

    def available_size(self) -> int:
        return len(self.free_rows)

    def check_integrity(self) -> None:
        assert len(set(self.free_rows)) == len(self.free_rows), "duplicate free request rows"
        assert all(0 <= r < self.size for r in self.free_rows)


class KVPool:
    """Per-layer K and V buffers of shape (size, kv_heads, head_dim), addressed by slot index;
    ``layer_shapes`` gives each layer's (kv_heads, head_dim), which may differ between layers.

    Allocation hands out ascending slots and continues where the previous allocation ended
    while the pool has not been fragmented by frees, so a request's tokens (and a conversation's
    turns) mostly sit in a few contiguous runs that attention reads as views, not gathers. The
    free list is a stack whose top holds the lowest slot of the most recently freed run.
    """

    def __init__(
        self,
        size: int,
        layer_shapes: Sequence[tuple[int, int]],
        dtype: torch.dtype,
        device: str,
    ) -> None:
        self.size = size
        self.dtype = dtype
        self.device = device
        self.layer_shapes = list(layer_shapes)
        self.k_buffer = [
            torch.empty((size, *shape), dtype=dtype, device=device) for shape in self.layer_shapes
        ]
        self.v_buffer = [
            torch.empty((size, *shape), dtype=dtype, device=device) for shape in self.layer_shapes
        ]
        self._free = torch.arange(size - 1, -1, -1, dtype=torch.int64)
        self._num_free = size

    def available_size(self) -> int:
        return self._num_free

    def alloc(self, n: int) -> torch.Tensor | None:
        if n > self._num_free:
            return None
        start = self._num_free - n
        out = self._free[start : self._num_free].flip(0)
        self._num_free = start
        return out

    def free(self, slots: torch.Tensor) -> None:
        n = slots.numel()
        if n == 0:
            return
        self._free[self._num_free : self._num_free + n] = slots.to("cpu", torch.int64).flip(0)
        self._num_free += n

    def set_kv(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        self.k_buffer[layer][slots] = k.to(self.dtype)
        self.v_buffer[layer][slots] = v.to(self.dtype)

    def free_slots(self) -> torch.Tensor:
        return self._free[: self._num_free]

    def check_integrity(self, held: int | None = None) -> None:
        """Free slots are distinct and in range; with ``held``, free + held == size."""
        free = self.free_slots()
        assert free.unique().numel() == free.numel(), "duplicate free KV slots"
        assert free.numel() == 0 or (free.min() >= 0 and free.max() < self.size)
        if held is not None:
            assert held + free.numel() == self.size, (
                f"KV slot leak: {held} held + {free.numel()} free != {self.size}"
            )
