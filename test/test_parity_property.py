"""Property: for random image layouts and chunk sizes, the engine's greedy output and
log-probabilities equal HF ``generate``: Qwen2.5-VL (M-RoPE), Gemma 4 (images attend both ways in
sliding layers, per-layer KV shapes, shared KV) and PaliGemma (a prefix-LM)."""

from __future__ import annotations

import pytest
from conftest import examples, hf_greedy, make_image, model_dir, placeholder
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sglang

FAMILIES = ("qwen2_5_vl", "gemma4", "paligemma")
SIZES = [(32, 32), (64, 32), (32, 96), (64, 64), (96, 64)]
WORDS = ["red", "blue", "a", "cat", "on", "the", "mat", "seven", "apple", "tree"]

_engines: dict[tuple[str, int], sglang.Engine] = {}


def _engine(family: str, chunk: int) -> sglang.Engine:
    if (family, chunk) not in _engines:
        path = model_dir(family)
        _engines[family, chunk] = sglang.Engine(
            dtype="float32", model_path=path, chunked_prefill_size=chunk
        )
    return _engines[family, chunk]


layouts = st.lists(
    st.tuples(st.lists(st.sampled_from(WORDS), max_size=6), st.sampled_from(range(len(SIZES)))),
    max_size=3,
)


@pytest.mark.parametrize("family", FAMILIES)
@settings(max_examples=examples(25), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    layout=layouts,
    tail=st.lists(st.sampled_from(WORDS), min_size=1, max_size=5),
    chunk=st.sampled_from([3, 7, 13, 29, -1]),
    seed=st.integers(0, 1000),
)
def test_random_layouts_match_hf(family, layout, tail, chunk, seed) -> None:
    ph = placeholder(family)
    parts, images = [], []
    for i, (words, size_idx) in enumerate(layout):
        parts.append(" ".join(words))
        parts.append(ph)
        images.append(make_image(seed + i, *SIZES[size_idx]))
    parts.append(" ".join(tail))
    prompt = " ".join(parts)
    ref_ids, ref_lps = hf_greedy(family, prompt, images, 6)
    engine = _engine(family, chunk)
    out = engine.generate(
        prompt, {"temperature": 0, "max_new_tokens": 6}, image_data=images, return_logprob=True
    )
    assert out["output_ids"] == ref_ids
    got = [lp for lp, _, _ in out["meta_info"]["output_token_logprobs"]]
    assert got == pytest.approx(ref_lps, abs=2e-4)
    engine.scheduler.check_integrity()
