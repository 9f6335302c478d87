"""Engine greedy output equals HF ``generate`` for every supported family, across chunk sizes
that cut through images, radix-cache hits and mixed batches."""

from __future__ import annotations

import pytest
from conftest import (
    TEXT_FAMILIES,
    VLM_FAMILIES,
    hf_greedy,
    make_image,
    model_dir,
    placeholder,
)

import sglang

MAX_NEW = 10
GREEDY = {"temperature": 0, "max_new_tokens": MAX_NEW}


def _cases(family: str) -> list[tuple[str, list]]:
    ph = placeholder(family)
    if family in TEXT_FAMILIES:
        return [
            (
                "The quick brown fox jumps over the lazy dog and then the cat sat on the mat "
                "while the bird sang a song about the weather",
                [],
            )
        ]
    return [
        (f"Describe {ph} in a few words.", [make_image(1, 64, 64)]),
        (f"First {ph} then {ph} compare them.", [make_image(2, 96, 64), make_image(3, 64, 128)]),
    ]


def _assert_matches(out: dict, ref_ids: list[int], ref_logprobs: list[float]) -> None:
    assert out["output_ids"] == ref_ids
    got = [lp for lp, _, _ in out["meta_info"]["output_token_logprobs"]]
    assert got == pytest.approx(ref_logprobs, abs=2e-4)


@pytest.mark.parametrize("family", VLM_FAMILIES + TEXT_FAMILIES)
def test_parity_across_chunk_sizes_and_radix_hits(family: str) -> None:
    cases = _cases(family)
    refs = [hf_greedy(family, prompt, images, MAX_NEW) for prompt, images in cases]
    for chunk in (-1, 5, 16):
        engine = sglang.Engine(
            dtype="float32", model_path=model_dir(family), chunked_prefill_size=chunk
        )
        for (prompt, images), (ref_ids, ref_lps) in zip(cases, refs):
            first = engine.generate(prompt, GREEDY, image_data=images, return_logprob=True)
            _assert_matches(first, ref_ids, ref_lps)
            assert first["meta_info"]["prompt_tokens"] > chunk
            again = engine.generate(prompt, GREEDY, image_data=images, return_logprob=True)
            _assert_matches(again, ref_ids, ref_lps)
            assert again["meta_info"]["cached_tokens"] == again["meta_info"]["prompt_tokens"] - 1
        engine.scheduler.check_integrity()


@pytest.mark.parametrize("mixed_chunk", [False, True], ids=["separate-decode", "mixed-chunk"])
@pytest.mark.parametrize("family", VLM_FAMILIES)
def test_parity_in_a_mixed_batch(family: str, mixed_chunk: bool) -> None:
    ph = placeholder(family)
    prompts = [
        f"One {ph} image here.",
        "Only text in this request, a little longer than the others are.",
        f"Two {ph} and {ph} images.",
    ]
    images = [[make_image(4, 64, 96)], [], [make_image(5), make_image(6, 128, 64)]]
    refs = [hf_greedy(family, p, imgs, MAX_NEW) for p, imgs in zip(prompts, images)]
    engine = sglang.Engine(
        dtype="float32",
        model_path=model_dir(family),
        chunked_prefill_size=24,
        enable_mixed_chunk=mixed_chunk,
    )
    outs = engine.generate(prompts, GREEDY, image_data=images, return_logprob=True)
    for out, (ref_ids, ref_lps) in zip(outs, refs):
        _assert_matches(out, ref_ids, ref_lps)
    # with mixing, requests past their prompt decode inside the others' prompt chunks
    assert (engine.scheduler.mixed_steps > 0) == mixed_chunk
    engine.scheduler.check_integrity()


def test_different_image_never_reuses_kv() -> None:
    family = "qwen2_5_vl"
    ph = placeholder(family)
    prompt = f"Look {ph} and describe."
    engine = sglang.Engine(dtype="float32", model_path=model_dir(family))
    engine.generate(prompt, GREEDY, image_data=make_image(10))
    other = engine.generate(prompt, GREEDY, image_data=make_image(11), return_logprob=True)
    ref_ids, ref_lps = hf_greedy(family, prompt, [make_image(11)], MAX_NEW)
    _assert_matches(other, ref_ids, ref_lps)
    start = prompt.index(ph)
    prefix_tokens = len(engine.tokenizer(prompt[:start])["input_ids"])
    assert other["meta_info"]["cached_tokens"] <= prefix_tokens + 1
