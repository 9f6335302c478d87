"""A request's state inside the scheduler."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

import torch

from sglang.srt.core.finish import FinishReason
from sglang.srt.core.mm_item import MultimodalItem, radix_key
from sglang.srt.sampling.sampling_params import SamplingParams

Pairs = list[tuple[float, int]]  # (logprob, token id) entries of one position


def logprob_alternatives(
    logprobs: torch.Tensor, top_num: int, token_ids: list[int] | None
) -> tuple[list[Pairs] | None, list[Pairs] | None]:
    """Per row of ``logprobs`` (rows, vocab): its ``top_num`` best (logprob, token id) pairs,
    and the pairs of ``token_ids`` in their order (None where not asked)."""
    top = chosen = None
    if top_num:
        best = logprobs.topk(top_num, dim=-1)
        top = [list(zip(v, i)) for v, i in zip(best.values.tolist(), best.indices.tolist())]
    if token_ids:
        chosen = [list(zip(row, token_ids)) for row in logprobs[:, token_ids].tolist()]
    return top, chosen


class ReqStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class Req:
    """Token bookkeeping rests on three integers:

    - ``cached_len``: leading tokens whose KV came from the radix cache at admission;
    - ``computed_len``: leading tokens of input + output ids whose KV is in the pool;
    - ``extend_len``: tokens computed in the current step, starting at ``computed_len``.

    Positions, the chunk's multimodal items, KV slots and cache insertion all follow from them.
    """

    rid: str
    input_ids: list[int]
    sampling_params: SamplingParams
    mm_items: list[MultimodalItem] = field(default_factory=list)
    eos_token_ids: frozenset[int] = frozenset()
    output_ids: list[int] = field(default_factory=list)
    status: ReqStatus = ReqStatus.WAITING
    req_pool_idx: int | None = None
    cached_len: int = 0
    computed_len: int = 0
    extend_len: int = 0
    last_node: Any = None
    mrope_positions: torch.Tensor | None = None  # (axes, len(input_ids)), 3 axes for most
    mrope_delta: int = 0
    generator: torch.Generator | None = None
    pins: dict[int, int] = field(default_factory=dict)  # cache key -> end of its placeholders
    # item hash -> where its embedding came from the first time a chunk needed it:
    # "encoded", "global_cache" (the shared store) or "embedding_cache" (items that no chunk
    # needed were in the prefix cache)
    mm_sources: dict[int, str] = field(default_factory=dict)
    finish_reason: FinishReason | None = None
    output_text: str = ""
    arrival_time: float = 0.0
    admit_time: float | None = None  # when it left the waiting queue for the running batch
    first_token_time: float | None = None
    finish_time: float | None = None
    return_logprob: bool = False
    output_logprobs: list[float] = field(default_factory=list)
    top_logprobs_num: int = 0
    output_top_logprobs: list[list[tuple[float, int]]] = field(default_factory=list)
    logprob_start_len: int = -1  # with return_logprob: prompt logprobs from here on (-1: none)
    input_logprobs: list[float | None] = field(default_factory=list)
    input_top_logprobs: list[list[tuple[float, int]] | None] = field(default_factory=list)
    token_ids_logprob: list[int] | None = None  # with return_logprob: these ids' logprobs too
    output_token_ids_logprobs: list[Pairs] = field(default_factory=list)
    input_token_ids_logprobs: list[Pairs | None] = field(default_factory=list)
    grammar: Any = None  # constrained.manager.RequestGrammar
    # Prompt tokens attending both ways: None, "images" or "prompt" (ModelAdapter.bidirectional)
    bidirectional: str | None = None
    cache_salt: str | None = None  # prefixes are shared only among requests with this salt
    custom_logit_processor: str | None = None  # a serialized CustomLogitProcessor
    # A prompt-only request whose hidden states are pooled: "last", "mean" or "cls" (None: a
    # generation request); the sum of its chunks' parts so far, then the pooled vector.
    pooling: str | None = None
    pooled: torch.Tensor | None = None
    embedding: list[float] | None = None

    def __post_init__(self) -> None:
        whole_prompt = self.bidirectional == "prompt"
        self.radix_key_input = radix_key(
            self.input_ids, self.mm_items, whole_prompt, self.cache_salt
        )
        if self.wants_prompt_logprobs and self.logprob_start_len == 0:
            self.input_logprobs.append(None)  # nothing predicts the first token
            self.input_top_logprobs.append(None)
            self.input_token_ids_logprobs.append(None)

    def mm_report(self) -> list[dict[str, Any]]:
        """Per multimodal item: modality, placeholder tokens and where its embedding came from
        ("encoded", "global_cache", "embedding_cache", or "prefix_cache" when its KV was cached
        instead). A video split into frame groups counts as encoded if any group was."""
        report = []
        for item in self.mm_items:
            units = item.groups or [item]
            sources = {self.mm_sources[u.hash] for u in units if u.hash in self.mm_sources}
            source = next(
                (s for s in ("encoded", "global_cache", "embedding_cache") if s in sources),
                "prefix_cache",
            )
            report.append({"modality": item.modality, "tokens": item.num_tokens, "source": source})
        return report

    @property
    def wants_prompt_logprobs(self) -> bool:
        return self.return_logprob and 0 <= self.logprob_start_len < len(self.input_ids)

    @property
    def uncached_from(self) -> int:
        """Prompt tokens before this one may come from the radix cache: the last prompt token
        gives the first output's logits, and a prompt token's logprob needs the logits of the
        token before it. Mean and CLS pooling need the hidden state of every prompt token (or
        the first), which a cached prefix does not keep."""
        if self.pooling in ("mean", "cls"):
            return 0
        end = len(self.input_ids) - 1
        if self.wants_prompt_logprobs:
            end = min(end, max(self.logprob_start_len - 1, 0))
        return end

    def prompt_logprob_positions(self, start: int, end: int) -> range:
        """Positions p in [start, end) whose logits give a wanted logprob of prompt token p + 1."""
        if not self.wants_prompt_logprobs:
            return range(0)
        return range(max(start, self.logprob_start_len - 1), min(end, len(self.input_ids) - 1))

    def token_ids(self, start: int, end: int) -> list[int]:
        """Tokens [start, end) of input ids followed by output ids."""
        n_in = len(self.input_ids)
        if end <= n_in:
            return self.input_ids[start:end]
        return self.input_ids[start:] + self.output_ids[max(start - n_in, 0) : end - n_in]

    @property
    def seq_len(self) -> int:
        return len(self.input_ids) + len(self.output_ids)

    @property
    def is_prefilling(self) -> bool:
        return self.computed_len < len(self.input_ids)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def radix_key(self, length: int) -> list[int]:
        key = self.radix_key_input[:length]
        if length > len(key):
            key = key + self.output_ids[: length - len(self.input_ids)]
        return key

    def positions(self, start: int, end: int) -> torch.Tensor:
        """Rotary positions of tokens [start, end): (n,) or (axes, n) for M-RoPE (3 axes; 4 for
        HunYuan-VL's XD-RoPE)."""
        if self.mrope_positions is None:
            return torch.arange(start, end)
        n_in = len(self.input_ids)
        parts = []
        if start < n_in:
            parts.append(self.mrope_positions[:, start : min(end, n_in)])
        if end > n_in:
            tail = torch.arange(max(start, n_in), end) + self.mrope_delta
            parts.append(tail.expand(self.mrope_positions.shape[0], -1))
        return torch.cat(parts, dim=1)

    def bidirectional_spans(self) -> list[tuple[int, int]]:
        """Ranges of tokens that attend to each other both ways, never split by a chunk."""
        if self.bidirectional == "prompt":
            return [(0, len(self.input_ids))]
        if self.bidirectional == "images":
            return [span for item in self.mm_items for span in item.spans]
        return []
