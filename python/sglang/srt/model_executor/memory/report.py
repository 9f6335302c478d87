"""What start-up allocated, as ``/server_info``'s ``memory`` and the start-up log show it."""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from typing import Any

from sglang.srt.model_executor.host_memory import (
    host_memory_available,
    host_memory_total,
)
from sglang.srt.model_executor.memory.estimate import fmt_bytes

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class MemoryReport:
    """What start-up allocated, in bytes (``/server_info``'s ``memory``)."""

    device: str
    dtype: str
    kv_dtype: str
    quantization: str | None
    weights_bytes: int
    weights_estimate_bytes: int | None
    lm_packed_copy_bytes: int  # in weights_bytes: packed copies for prompts (packed_linear)
    kv_pool_bytes: int
    kv_pool_tokens: int
    kv_bytes_per_token: int
    kv_budget_rule: str
    state_pool_bytes: int
    mm_embedding_cache_bytes: int
    host_total_bytes: int
    host_available_bytes: int

    @property
    def static_bytes(self) -> int:
        return self.weights_bytes + self.kv_pool_bytes + self.state_pool_bytes

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "static_bytes": self.static_bytes}

    def log(self) -> None:
        estimate = self.weights_estimate_bytes
        rows = [
            ("weights", self.weights_bytes, self._weights_note(estimate)),
            ("KV pool", self.kv_pool_bytes, self._kv_note()),
            ("linear-attention state", self.state_pool_bytes, ""),
            ("embedding cache", self.mm_embedding_cache_bytes, "budget, filled on demand"),
            ("static total", self.static_bytes, "weights + KV pool + state"),
        ]
        lines = [f"  {name:<24}{fmt_bytes(n):>12}  {note}".rstrip() for name, n, note in rows]
        head = (
            f"memory on {self.device}: host total {fmt_bytes(self.host_total_bytes)}, "
            f"{fmt_bytes(self.host_available_bytes)} available after start-up"
        )
        logger.info("%s\n%s", head, "\n".join(lines))

    def _weights_note(self, estimate: int | None) -> str:
        setting = self.dtype + (f" + {self.quantization}" if self.quantization else "")
        if self.lm_packed_copy_bytes:
            setting += f"; {fmt_bytes(self.lm_packed_copy_bytes)} of packed copies for prompts"
        if estimate is None:
            return setting
        return f"{setting}; estimated {fmt_bytes(estimate)} from the checkpoint"

    def _kv_note(self) -> str:
        return (
            f"{self.kv_pool_tokens} tokens x {self.kv_bytes_per_token} B, {self.kv_dtype} "
            f"(rule: {self.kv_budget_rule})"
        )


def runner_report(runner: Any, kv_bytes_per_token: int) -> MemoryReport:
    """The report of a ``ModelRunner`` whose pools are allocated."""
    args = runner.args
    state = runner.state_pool.nbytes if runner.state_pool is not None else 0
    host_total = host_memory_total()[0]
    return MemoryReport(
        device=runner.device,
        dtype=str(runner.dtype).removeprefix("torch."),
        kv_dtype=str(runner.kv_cache_dtype).removeprefix("torch."),
        quantization=args.torchao_config or None,
        weights_bytes=runner.weights_bytes,
        weights_estimate_bytes=runner.fit_plan.weights if runner.fit_plan else None,
        lm_packed_copy_bytes=runner.lm_packed_copy_bytes,
        kv_pool_bytes=runner.max_total_tokens * kv_bytes_per_token,
        kv_pool_tokens=runner.max_total_tokens,
        kv_bytes_per_token=kv_bytes_per_token,
        kv_budget_rule="max_total_tokens" if args.max_total_tokens else runner.kv_budget_rule,
        state_pool_bytes=state,
        mm_embedding_cache_bytes=args.mm_cache_bytes if runner.is_multimodal else 0,
        host_total_bytes=host_total,
        host_available_bytes=host_memory_available()[0],
    )
