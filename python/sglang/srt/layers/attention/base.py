"""The attention contract: metadata once per batch, then one call per layer."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from sglang.srt.core.forward_batch import ForwardBatch


class AttentionBackend(ABC):
    perf: Any = None  # the runner's PerfCounters: time and FLOPs of every forward call
    # How a batch's bidirectional spans meet sliding windows (ModelAdapter's two flags).
    spans_in_sliding_layers_only = False
    window_bounds_spans = True

    @abstractmethod
    def prepare_metadata(self, batch: ForwardBatch) -> None:
        """Build whatever the per-layer calls of this batch share (indices, masks)."""

    @abstractmethod
    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer: int,
        batch: ForwardBatch,
        *,
        scaling: float,
        sliding_window: int | None = None,
        softcap: float | None = None,
        save_kv: bool = True,
    ) -> torch.Tensor:
        """Store this step's k/v at ``batch.out_cache_loc`` (unless ``save_kv`` is False: a
        layer reading the KV another layer wrote) and attend.

        q: (1, heads, T, dim); k, v: (1, kv_heads, T, dim) for the T packed tokens of the batch.
        Returns (1, T, heads, dim).
        """
