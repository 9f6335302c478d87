"""Sampling parameters are validated; samplers honour top-k / top-p / min-p and seeds."""

from __future__ import annotations

import pytest
import torch

from sglang.srt.sampling.sampler import sample
from sglang.srt.sampling.sampling_params import SamplingParams


@pytest.mark.parametrize(
    "params",
    [
        {"temperature": -1},
        {"top_p": 0},
        {"top_p": 1.5},
        {"top_k": 0},
        {"min_p": 2},
        {"max_new_tokens": -3},
        {"max_new_tokens": 1.5},
        {"stop": [""]},
        {"stop_token_ids": ["a"]},
        {"bogus": 1},
        {"temperature": float("nan")},
    ],
)
def test_invalid_values_raise(params: dict) -> None:
    with pytest.raises(ValueError):
        SamplingParams.from_dict(params)


def test_stop_string_becomes_list() -> None:
    assert SamplingParams.from_dict({"stop": "x"}).stop == ["x"]


def _draws(params: dict, logits: torch.Tensor, seed: int = 0, n: int = 200) -> set[int]:
    sp = SamplingParams.from_dict(params)
    gen = torch.Generator().manual_seed(seed)
    return {sample(logits[None], [sp], [gen])[0] for _ in range(n)}


def test_top_k_top_p_min_p_restrict_support() -> None:
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    assert _draws({"temperature": 1.0}, logits) == {0, 1, 2, 3}
    assert _draws({"temperature": 1.0, "top_k": 2}, logits) == {0, 1}
    assert _draws({"temperature": 1.0, "top_p": 0.7}, logits) == {0, 1}
    assert _draws({"temperature": 1.0, "min_p": 0.5}, logits) == {0, 1}
    assert _draws({"temperature": 0}, logits) == {0}


def test_same_seed_same_tokens() -> None:
    logits = torch.randn(50)
    sp = SamplingParams.from_dict({"temperature": 1.0})

    def run(seed: int) -> list[int]:
        gen = torch.Generator().manual_seed(seed)
        return [sample(logits[None], [sp], [gen])[0] for _ in range(20)]

    assert run(3) == run(3)
    assert run(3) != run(4)
