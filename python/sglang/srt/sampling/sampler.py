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
    total = probs.sum()
    if not torch.isfinite(total) or total <= 0:
        # Nothing left to sample from (e.g. every logit -inf after masking): the argmax stands.
        return int(logits.argmax())
    return int(torch.multinomial(probs / total, 1, generator=gen).item())


def apply_penalties(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    prompt_ids: Sequence[Sequence[int]],
    output_ids: Sequence[Sequence[int]],
    banned_ids: Sequence[Sequence[int]],
) -> torch.Tensor:
    """Frequency, presence and repetition penalties and ``min_new_tokens``, in place.

    OpenAI semantics for frequency/presence (generated tokens only); the HF/vLLM rule for the
    repetition penalty (prompt and generated tokens; positive logits divided, negative ones
    multiplied). ``banned_ids[i]`` are the tokens that would end request i before its
    ``min_new_tokens``."""
    vocab = logits.shape[-1]
    for i, sp in enumerate(params):
        if banned_ids[i]:
            logits[i, torch.tensor(banned_ids[i], dtype=torch.int64)] = float("-inf")
        if not sp.has_penalties:
            continue
        out = torch.tensor(output_ids[i], dtype=torch.int64)
        if sp.frequency_penalty or sp.presence_penalty:
            counts = torch.bincount(out, minlength=vocab)[:vocab].to(logits)
            logits[i] -= sp.frequency_penalty * counts + sp.presence_penalty * (counts > 0)
        if sp.repetition_penalty != 1.0:
            seen = torch.cat([torch.tensor(prompt_ids[i], dtype=torch.int64), out]).unique()
            seen = seen[(seen >= 0) & (seen < vocab)]
            row = logits[i, seen]
            penalty = sp.repetition_penalty
            logits[i, seen] = torch.where(row > 0, row / penalty, row * penalty)
    return logits
