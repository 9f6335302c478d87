"""Turn last-token logits into next tokens, honouring each request's sampling parameters."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from sglang.srt.sampling.sampling_params import SamplingParams


def sample(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    generators: Sequence[torch.Generator | None],
) -> list[int]:
    """logits: (num_reqs, vocab) float32. Greedy rows take the argmax."""
    tokens = logits.argmax(dim=-1).tolist()
    for i, (sp, gen) in enumerate(zip(params, generators)):
        if not sp.is_greedy:
            tokens[i] = _sample_row(logits[i], sp, gen)
    return tokens


def _sample_row(logits: torch.Tensor, sp: SamplingParams, gen: torch.Generator | None) -> int:
    logits = logits / sp.temperature
    if sp.top_k > 0 and sp.top_k < logits.shape[-1]:
        kth = torch.topk(logits, sp.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if sp.top_p < 1.0:
        sorted_probs, order = probs.sort(descending=True)
        # Keep the smallest prefix whose mass reaches top_p (the first token always stays).
        drop = sorted_probs.cumsum(-1) - sorted_probs >= sp.top_p
        sorted_probs[drop] = 0.0
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
    if sp.min_p > 0.0:
        probs = probs.masked_fill(probs < sp.min_p * probs.max(), 0.0)
    probs = probs.to("cpu")
    return int(torch.multinomial(probs / probs.sum(), 1, generator=gen).item())
