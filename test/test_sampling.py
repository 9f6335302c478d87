"""Sampling parameters are validated; samplers honour top-k / top-p / min-p and seeds."""

from __future__ import annotations

import pytest
import torch

from sglang.srt.sampling.sampler import apply_penalties, sample
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
        {"temperature": float("inf")},
        {"top_p": float("inf")},
        {"frequency_penalty": 3},
        {"presence_penalty": float("nan")},
        {"repetition_penalty": 0},
        {"min_new_tokens": -1},
        {"seed": 2**80},
        {"seed": 1.5},
        {"no_stop_trim": "yes"},
        {"n": 0},
        {"logit_bias": {"x": 1}},
        {"regex": "a", "json_schema": "{}"},
        {"ignore_eos": "yes"},
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


def test_null_means_default() -> None:
    sp = SamplingParams.from_dict({"temperature": None, "top_p": None, "regex": None})
    assert sp.temperature == 1.0 and sp.top_p == 1.0


def test_tiny_temperature_is_greedy_and_nan_logits_do_not_raise() -> None:
    logits = torch.log(torch.tensor([0.1, 0.6, 0.3]))
    assert _draws({"temperature": 1e-40}, logits) == {1}
    sp = SamplingParams.from_dict({"temperature": 1.0})
    gen = torch.Generator().manual_seed(0)
    assert sample(torch.full((1, 3), float("nan")), [sp], [gen])[0] in (0, 1, 2)
    assert sample(torch.full((1, 3), float("-inf")), [sp], [gen])[0] in (0, 1, 2)


def test_penalties_follow_openai_and_hf_rules() -> None:
    logits = torch.tensor([[2.0, 1.0, -1.0, 0.5]])
    sp = SamplingParams.from_dict({"frequency_penalty": 0.5, "presence_penalty": 0.25})
    out = apply_penalties(logits.clone(), [sp], [[]], [[0, 0, 2]], [[]])
    assert out.tolist() == [[2.0 - 1.0 - 0.25, 1.0, -1.0 - 0.5 - 0.25, 0.5]]
    sp = SamplingParams.from_dict({"repetition_penalty": 2.0})
    out = apply_penalties(logits.clone(), [sp], [[1]], [[2]], [[]])
    assert out.tolist() == [[2.0, 0.5, -2.0, 0.5]]  # seen: positive halved, negative doubled
    sp = SamplingParams.from_dict({"min_new_tokens": 2, "temperature": 0})
    out = apply_penalties(logits.clone(), [sp], [[]], [[]], [[0]])
    assert out[0, 0] == float("-inf") and sample(out, [sp], [None]) == [1]


def test_choices_of_n_get_distinct_seeds_inside_64_bits() -> None:
    from sglang.srt.core.io_struct import TokenizedRequest
    from sglang.srt.managers.parallel_sampling import prefill_request, sample_copies

    sp = SamplingParams.from_dict({"n": 3, "seed": 2**64 - 2, "temperature": 1.0})
    copies = sample_copies(TokenizedRequest("r", [1, 2], sp))
    seeds = [c.sampling_params.seed for c in copies]
    assert seeds == [2**64 - 2, 2**64 - 1, 0] and [c.rid for c in copies] == ["r-0", "r-1", "r-2"]
    for seed in seeds:
        torch.Generator().manual_seed(seed)
    assert all(c.sampling_params.n == 1 for c in copies)
    warm = prefill_request(TokenizedRequest("r", [1, 2], sp))
    assert warm.sampling_params.max_new_tokens == 1 and warm.sampling_params.is_greedy


# SGLang's sampling parameters (sglang/srt/sampling/sampling_params.py, 0.5.23): every API field,
# with the value its clients send by default.
SGLANG_DEFAULTS = {
    "max_new_tokens": 128,
    "stop": None,
    "stop_token_ids": None,
    "stop_regex": None,
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": -1,
    "min_p": 0.0,
    "frequency_penalty": 0.0,
    "presence_penalty": 0.0,
    "repetition_penalty": 1.0,
    "min_new_tokens": 0,
    "n": 1,
    "beam_width": None,
    "json_schema": None,
    "regex": None,
    "ebnf": None,
    "structural_tag": None,
    "ignore_eos": False,
    "skip_special_tokens": True,
    "spaces_between_special_tokens": True,
    "no_stop_trim": False,
    "stream_interval": None,
    "logit_bias": None,
    "sampling_seed": None,
    "custom_params": None,
    "watermark": None,
}


def test_every_sglang_field_is_accepted_at_its_default() -> None:
    sp = SamplingParams.from_dict(SGLANG_DEFAULTS)
    assert sp == SamplingParams.from_dict({})
    # What SGLang's frontend sends for a plain gen (empty tuples arrive as empty lists).
    frontend = {**SGLANG_DEFAULTS, "stop": [], "stop_token_ids": [], "stop_regex": []}
    assert not SamplingParams.from_dict(frontend).stop_regex


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"beam_width": 4}, "beam search"),
        ({"watermark": {"enabled": True, "key": "k"}}, "watermark"),
    ],
)
def test_unimplemented_fields_are_refused_only_when_on(params: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SamplingParams.from_dict(params)
    assert SamplingParams.from_dict({"beam_width": 1, "watermark": {"enabled": False}})


def test_sglang_names_and_rules() -> None:
    sp = SamplingParams.from_dict({"sampling_seed": 5, "regex": "", "stop_regex": r"\d"})
    assert sp.seed == 5 and sp.regex is None and sp.stop_regex == [r"\d"]
    assert SamplingParams.from_dict({"sampling_seed": 5, "seed": 5}).seed == 5
    sp = SamplingParams.from_dict({"stream_interval": 4, "custom_params": {"k": 1}})
    assert sp.stream_interval == 4 and sp.custom_params == {"k": 1}
    assert SamplingParams.from_dict({"spaces_between_special_tokens": False})


@pytest.mark.parametrize(
    "params",
    [
        {"stop_regex": "("},
        {"stop_regex": [""]},
        {"stop_regex": ["a"] * 33},
        {"stop_regex": "a" * 257},
        {"min_new_tokens": 9, "max_new_tokens": 8},
        {"stream_interval": 0},
        {"beam_width": 0},
        {"watermark": "on"},
        {"custom_params": [1]},
        {"spaces_between_special_tokens": "no"},
        {"sampling_seed": 1, "seed": 2},
    ],
)
def test_invalid_sglang_values_raise(params: dict) -> None:
    with pytest.raises(ValueError):
        SamplingParams.from_dict(params)
