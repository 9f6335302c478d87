"""Property: random multi-turn image chats on Qwen3.5, under random chunk sizes and with
thinking on or off, give HF ``generate``'s tokens at every turn, and every later turn resumes
from a state snapshot of the conversation so far."""

from __future__ import annotations

import pytest
from conftest import examples, hf_greedy, make_image, model_dir
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sglang

FAMILY = "qwen3_5"
MAX_NEW = 5
SIZES = [(32, 32), (64, 32), (32, 96), (64, 64)]
WORDS = ["red", "blue", "a", "cat", "on", "the", "mat", "seven", "apple", "tree"]

_engines: dict[int, sglang.Engine] = {}


def _engine(chunk: int) -> sglang.Engine:
    if chunk not in _engines:
        _engines[chunk] = sglang.Engine(
            dtype="float32", model_path=model_dir(FAMILY), chunked_prefill_size=chunk
        )
    return _engines[chunk]


turns = st.lists(
    st.tuples(
        st.lists(st.sampled_from(WORDS), min_size=1, max_size=6),
        st.one_of(st.none(), st.sampled_from(range(len(SIZES)))),
    ),
    min_size=1,
    max_size=3,
)


@settings(max_examples=examples(20), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    turns=turns,
    chunk=st.sampled_from([5, 17, 64, -1]),
    thinking=st.booleans(),
    seed=st.integers(0, 1000),
)
def test_random_conversations_match_hf(turns, chunk, thinking, seed) -> None:
    eng = _engine(chunk)
    messages: list[dict] = []
    images = []
    for i, (words, size) in enumerate(turns):
        content: list[dict] = []
        if size is not None:
            images.append(make_image(seed + i, *SIZES[size]))
            content.append({"type": "image"})
        content.append({"type": "text", "text": " ".join(words)})
        messages.append({"role": "user", "content": content})
        prompt = eng.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True, enable_thinking=thinking
        )
        out = eng.generate(
            prompt,
            {"temperature": 0, "max_new_tokens": MAX_NEW},
            image_data=images,
            return_logprob=True,
        )
        ref_ids, ref_logprobs = hf_greedy(FAMILY, prompt, images, MAX_NEW)
        assert out["output_ids"] == ref_ids
        got = [lp for lp, _, _ in out["meta_info"]["output_token_logprobs"]]
        assert got == pytest.approx(ref_logprobs, abs=2e-4)
        assert i == 0 or out["meta_info"]["cached_tokens"] > 0
        messages.append({"role": "assistant", "content": out["text"]})
    eng.scheduler.check_integrity()
