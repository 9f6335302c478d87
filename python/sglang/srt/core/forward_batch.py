"""What one model forward needs: the packed tokens of a batch and their bookkeeping."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from sglang.srt.core.req import Req


# Logprobs of the prompt tokens a chunk predicts, their top alternatives and the logprobs of the
# request's ``token_ids_logprob`` at each (None: not asked).
PromptLogprobs = tuple[
    list[float], list[list[tuple[float, int]]] | None, list[list[tuple[float, int]]] | None
]


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
    # Set by the forward when a request asked for prompt logprobs: one entry per request.
    prompt_logprobs: list[PromptLogprobs | None] | None = None
    # Set by the forward when the batch has pooling requests: each request's part (float32).
    pooled: list[torch.Tensor | None] | None = None

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def last_token_indices(self) -> torch.Tensor:
        ends = torch.tensor(self.extend_lens).cumsum(0) - 1
        return ends.to(self.input_ids.device)

    @property
    def size(self) -> int:
        return len(self.reqs)

    def select(self, indices: list[int]) -> ForwardBatch:
        """The sub-batch of requests ``indices`` (in that order), with their tokens."""
        bounds = [0, *torch.tensor(self.extend_lens).cumsum(0).tolist()]
        token_index = torch.cat([torch.arange(bounds[i], bounds[i + 1]) for i in indices]).to(
            self.input_ids.device
        )
        return ForwardBatch(
            reqs=[self.reqs[i] for i in indices],
            input_ids=self.input_ids[token_index],
            positions=self.positions[..., token_index],
            out_cache_loc=self.out_cache_loc[token_index],
            req_pool_indices=[self.req_pool_indices[i] for i in indices],
            prefix_lens=[self.prefix_lens[i] for i in indices],
            extend_lens=[self.extend_lens[i] for i in indices],
            bidirectional_spans=[self.bidirectional_spans[i] for i in indices],
            is_decode=self.is_decode,
            state_plan=None if self.state_plan is None else self.state_plan.select(indices),
        )
