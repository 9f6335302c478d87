"""What one model forward needs: the packed tokens of a batch and their bookkeeping."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from sglang.srt.managers.req import Req


@dataclass
class ForwardBatch:
    """Requests packed along one token axis. Request i owns tokens
    ``[sum(extend_lens[:i]), sum(extend_lens[:i+1]))``, which sit at sequence positions
    ``[prefix_lens[i], prefix_lens[i] + extend_lens[i])`` of that request."""

    reqs: list[Req]
    input_ids: torch.Tensor  # (T,)
    positions: torch.Tensor  # (T,) or (3, T) for M-RoPE
    out_cache_loc: torch.Tensor  # (T,) KV slots written this step
    req_pool_indices: list[int]
    prefix_lens: list[int]
    extend_lens: list[int]
    bidirectional_spans: list[list[tuple[int, int]]]
    is_decode: bool
    attn_backend: Any = None
    state_plan: Any = None  # hybrid models: linear-attention state slots (StatePlan)

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def last_token_indices(self) -> torch.Tensor:
        ends = torch.tensor(self.extend_lens).cumsum(0) - 1
        return ends.to(self.input_ids.device)
