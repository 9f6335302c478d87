"""``n`` > 1: one prompt, n sampled completions.

The prompt runs once as a one-token prefill request whose KV (and image embeddings) then sit in
the radix and embedding caches; the n copies that follow match that prefix, so they compute only
the prompt's last token and encode no image again.
"""

from __future__ import annotations

import dataclasses

from sglang.srt.core.io_struct import TokenizedRequest
from sglang.srt.sampling.sampling_params import SamplingParams


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


def _copy_items(tokenized: TokenizedRequest) -> list:
    # Items carry per-request state (features loaded on a miss); each request owns its own.
    return [dataclasses.replace(item) for item in tokenized.mm_items]


def _wrap_seed(seed: int) -> int:
    """Keep a derived seed inside the 64-bit range that seeds accept."""
    return seed - 2**64 if seed >= 2**64 else seed
