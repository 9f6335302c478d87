"""Pooling of a prefill's hidden states, chunk by chunk, and what the API makes of the result.

A pooling request is a prompt-only request: each of its chunks gives a part (the last prompt
token's row, the first token's, or the sum of the chunk's rows for a mean, through the head
where the model has one) and the parts add up to the request's pooled vector once its prompt is
done. A linear head commutes with the sum, so a part can go through it before the sum."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from sglang.srt.layers.pooling_config import PoolingConfig

if TYPE_CHECKING:
    from sglang.srt.core.forward_batch import ForwardBatch
    from sglang.srt.core.req import Req

Head = Callable[[torch.Tensor], torch.Tensor]


def chunk_parts(hidden: torch.Tensor, batch: ForwardBatch, head: Head | None) -> list:
    """Per request of ``batch``: its chunk's float32 part of the pooled vector, or None (not a
    pooling request, or a chunk that holds none of the pooled rows)."""
    parts: list[torch.Tensor | None] = []
    row = 0
    for req, prefix, extend in zip(batch.reqs, batch.prefix_lens, batch.extend_lens):
        rows = _pooled_rows(req, prefix, extend)
        part = None
        if rows is not None:
            chosen = hidden[row + rows.start : row + rows.stop]
            out = head(chosen) if head is not None else chosen
            part = out.float().sum(0)
        parts.append(part)
        row += extend
    return parts


def _pooled_rows(req: Req, prefix: int, extend: int) -> range | None:
    """Which rows of the chunk [prefix, prefix + extend) the request pools (chunk-relative)."""
    prompt_len = len(req.input_ids)
    if req.pooling is None or prefix >= prompt_len:
        return None
    end = min(prefix + extend, prompt_len)
    if req.pooling == "mean":
        return range(0, end - prefix)
    if req.pooling == "cls":
        return range(0, 1) if prefix == 0 else None
    return range(end - prefix - 1, end - prefix) if end == prompt_len else None


def add_part(req: Req, part: torch.Tensor | None) -> None:
    if part is not None:
        req.pooled = part if req.pooled is None else req.pooled + part


def finish_pooling(req: Req) -> None:
    """The request's prompt is done: its pooled vector becomes ``req.embedding``."""
    if req.pooled is None:
        raise ValueError("no pooled rows were computed for this request")
    vector = req.pooled / len(req.input_ids) if req.pooling == "mean" else req.pooled
    req.embedding = vector.tolist()
    req.pooled = None


def embedding_output(
    vector: list[float], config: PoolingConfig, dimensions: int | None
) -> list[float]:
    """What an embedding request answers: the vector cut to ``dimensions`` (Matryoshka), then
    normalised where the model is."""
    out = torch.tensor(vector, dtype=torch.float32)
    if dimensions is not None:
        out = out[:dimensions]
    if config.normalize:
        out = torch.nn.functional.normalize(out, dim=0)
    return out.tolist()


def relevance_score(head_output: list[float]) -> float:
    """A cross-encoder's score from its head: the sigmoid of one output, or the softmax
    probability of the second of two (``classifier_from_token: ["no", "yes"]``: P(yes))."""
    out = torch.tensor(head_output, dtype=torch.float32)
    if out.numel() == 1:
        return float(torch.sigmoid(out[0]))
    if out.numel() == 2:
        return float(torch.softmax(out, dim=0)[1])
    raise ValueError(f"a relevance score needs a head of one or two outputs, not {out.numel()}")


def cosine_score(a: list[float], b: list[float]) -> float:
    x, y = torch.tensor(a), torch.tensor(b)
    return float(torch.nn.functional.cosine_similarity(x, y, dim=0))
