"""Messages between the API process (tokenizer) and the scheduler process."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sglang.srt.multimodal.items import MultimodalItem
from sglang.srt.sampling.sampling_params import SamplingParams


@dataclass
class TokenizedRequest:
    """A validated, tokenized request: what the scheduler needs to run it."""

    rid: str
    input_ids: list[int]
    sampling_params: SamplingParams
    mm_items: list[MultimodalItem] = field(default_factory=list)
    return_logprob: bool = False
    top_logprobs_num: int = 0  # alternatives per output token, with return_logprob


@dataclass
class AbortRequest:
    rid: str


@dataclass
class RpcRequest:
    """A control call answered by one ``RpcResponse`` with the same ``call_id``."""

    call_id: int
    method: str  # "server_info" | "flush_cache" | "check_integrity"


@dataclass
class RpcResponse:
    call_id: int
    result: Any = None
    error: str | None = None


@dataclass
class RequestOutput:
    """New tokens of one request since its previous output."""

    rid: str
    new_token_ids: list[int]
    new_logprobs: list[float]
    finish_reason: dict[str, Any] | None
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    new_top_logprobs: list[list[tuple[float, int]]] = field(default_factory=list)


@dataclass
class BatchOutput:
    outputs: list[RequestOutput]
