"""``n`` > 1: one prompt, n sampled completions.

The prompt runs once as a one-token prefill request whose KV (and image embeddings) then sit in
the radix and embedding caches; the n copies that follow match that prefix, so they compute only
the prompt's last token and encode no image again.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from sglang.srt.core.io_struct import TokenizedRequest
from sglang.srt.sampling.sampling_params import SamplingParams


@dataclass
class FanOut:
    """The requests that answer a batch of prompts: ``requests[i]`` is a choice of prompt
    ``prompt_of[i]``; ``prefills`` holds the warm-up request of each prompt with n > 1."""

    requests: list[TokenizedRequest]
    prompt_of: list[int]
    prefills: dict[int, TokenizedRequest]


def fan_out(tokenized: list[TokenizedRequest]) -> FanOut:
    """Each prompt with n > 1 replaced by its n copies (and given a prefill request)."""
    requests, prompt_of, prefills = [], [], {}
    for i, request in enumerate(tokenized):
        if request.sampling_params.n > 1:
            prefills[i] = prefill_request(request)
            copies = sample_copies(request)
        else:
            copies = [request]
        requests += copies
        prompt_of += [i] * len(copies)
    return FanOut(requests, prompt_of, prefills)


def prefill_request(tokenized: TokenizedRequest) -> TokenizedRequest:
    """A greedy one-token request over the same prompt and images, without constraints."""
    params = SamplingParams(max_new_tokens=1, temperature=0.0)
    return dataclasses.replace(
        tokenized,
        rid=f"{tokenized.rid}-prefill",
        sampling_params=params,
        mm_items=_copy_items(tokenized),
        return_logprob=False,
        top_logprobs_num=0,
        logprob_start_len=-1,
        token_ids_logprob=None,
    )


def sample_copies(tokenized: TokenizedRequest) -> list[TokenizedRequest]:
    """The n completions. With a seed, copy i samples with seed + i: reproducible, yet the
    choices differ from one another."""
    sp = tokenized.sampling_params
    copies = []
    for i in range(sp.n):
        seed = None if sp.seed is None else _wrap_seed(sp.seed + i)
        params = dataclasses.replace(sp, n=1, seed=seed)
        copies.append(
            dataclasses.replace(
                tokenized,
                rid=f"{tokenized.rid}-{i}",
                sampling_params=params,
                mm_items=_copy_items(tokenized),
            )
        )
    return copies


# The streaming side (the API process) --------------------------------------------------------
Stream = AsyncIterator[Any]  # a TokenizerManager.generate stream of StreamEvents


@dataclass
class Choices:
    """The streams of all choices; ``prompt_of[i]`` is the prompt index of stream i."""

    streams: list[Stream]
    prompt_of: list[int]
    prefill_cached: dict[int, int] = field(default_factory=dict)  # prompt -> cached tokens


async def start_choices(
    generate: Callable[[TokenizedRequest], Stream],
    tokenized: list[TokenizedRequest],
    prefill: bool,
) -> Choices:
    """One stream per choice of ``fan_out``; with ``prefill`` (a radix cache to share the
    prompt through), the prefill requests run to their end first."""
    plan = fan_out(tokenized)
    cached: dict[int, int] = {}
    if plan.prefills and prefill:
        finals = await asyncio.gather(*(last_event(generate(r)) for r in plan.prefills.values()))
        cached = {i: e.meta["cached_tokens"] for i, e in zip(plan.prefills, finals)}
    return Choices([generate(r) for r in plan.requests], plan.prompt_of, cached)


async def last_event(stream: Stream) -> Any:
    """Run a request's stream to its end; its final event."""
    event = None
    async for event in stream:  # noqa: B007
        pass
    assert event is not None
    return event


def _copy_items(tokenized: TokenizedRequest) -> list:
    # Items carry per-request state (features loaded on a miss); each request owns its own.
    return [dataclasses.replace(item) for item in tokenized.mm_items]


def _wrap_seed(seed: int) -> int:
    """Keep a derived seed inside the 64-bit range that seeds accept."""
    return seed - 2**64 if seed >= 2**64 else seed
