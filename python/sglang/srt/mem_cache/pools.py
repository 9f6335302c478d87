"""The pools a worker's requests hold slots of, handed to the scheduler's parts as one handle
(rather than the model runner that allocated them)."""

from __future__ import annotations

from dataclasses import dataclass

from sglang.srt.mem_cache.memory_pool import KVPool, ReqToTokenPool
from sglang.srt.mem_cache.state_pool import StatePool


@dataclass(frozen=True)
class Pools:
    """The KV pool, each running request's row of KV slots (``req_to_token``), and on hybrid
    models the linear-attention state pool; all on ``device``. A request's slots in ``kv`` are
    exactly those its row lists up to its computed length (``KVPool.check_integrity``)."""

    kv: KVPool
    req_to_token: ReqToTokenPool
    state: StatePool | None
    device: str
