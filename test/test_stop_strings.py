"""The tail-window stop-string check finishes a request at the same token, with the same matched
string, as a check of the whole decoded output would."""

from __future__ import annotations

import functools
import re

import pytest
from conftest import examples, model_dir
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sglang.srt.multimodal.hf_processor import load_hf_processor
from sglang.srt.sampling.stop_strings import (
    matched_stop,
    matched_stop_regex,
    regex_max_chars,
    skipped_token_ids,
)

# Words whose characters take one to four byte tokens each (the tiny tokenizers are byte-level
# with ~1k merges), spaces, digits, punctuation.
SAMPLE = "Hello world, naïve café 東京 😀 𝔘 龘 emoji 123 ... \n\t--> ünïcödé 日本語テキスト"


@functools.cache
def _tokenizer(family: str):
    processor = load_hf_processor(model_dir(family))
    return getattr(processor, "tokenizer", processor)


@functools.cache
def _pool(family: str) -> tuple[list[tuple[int, ...]], list[int]]:
    """Pieces of ordinary tokens (each word of SAMPLE whole, so that multi-byte characters stay
    intact, and single ids from across the vocabulary) and the skipped ids."""
    tok = _tokenizer(family)
    words = [f" {w}" for w in SAMPLE.split(" ")]
    pieces = [tuple(tok(w, add_special_tokens=False)["input_ids"]) for w in words]
    pieces += [(i,) for i in range(100, min(len(tok), 5000), 97)]
    return sorted(set(pieces)), sorted(skipped_token_ids(tok))


def _first_stop_full(tok, ids, stops, skip) -> tuple[int, str] | None:
    for t in range(1, len(ids) + 1):
        text = tok.decode(ids[:t], skip_special_tokens=skip)
        hit = next((s for s in stops if s in text), None)
        if hit is not None:
            return t, hit
    return None


def _first_stop_tail(tok, ids, stops, skip, special) -> tuple[int, str] | None:
    for t in range(1, len(ids) + 1):
        hit = matched_stop(tok, ids[:t], stops, skip, special)
        if hit is not None:
            return t, hit
    return None


@pytest.mark.parametrize("family", ["qwen2_5_vl", "llama"])
@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_tail_check_stops_where_the_whole_text_check_does(family: str, data) -> None:
    tok = _tokenizer(family)
    pieces, skipped = _pool(family)
    piece = st.sampled_from(pieces)
    if skipped:
        piece = st.one_of(piece, piece, st.sampled_from(skipped).map(lambda i: (i,)))
    chosen = data.draw(st.lists(piece, min_size=1, max_size=32), label="pieces")
    ids = [i for p in chosen for i in p]
    skip = data.draw(st.booleans(), label="skip_special_tokens")
    full_text = tok.decode(ids, skip_special_tokens=skip)
    stops = []
    for _ in range(data.draw(st.integers(1, 3), label="stops")):
        if full_text and data.draw(st.booleans()):
            start = data.draw(st.integers(0, len(full_text) - 1))
            stops.append(full_text[start : start + data.draw(st.integers(1, 16))])
        else:
            stops.append(data.draw(st.text(min_size=1, max_size=4)))
    special = skipped_token_ids(tok)
    assert _first_stop_tail(tok, ids, stops, skip, special) == _first_stop_full(
        tok, ids, stops, skip
    )


def test_window_reaches_past_skipped_tokens() -> None:
    tok = _tokenizer("qwen2_5_vl")
    _, skipped = _pool("qwen2_5_vl")
    stop_ids = tok("XYZ", add_special_tokens=False)["input_ids"]
    filler = tok(" a", add_special_tokens=False)["input_ids"]
    # the stop string's tokens, then many skipped tokens: the window must look past them
    ids = filler * 5 + stop_ids[:-1] + [skipped[0]] * 40 + stop_ids[-1:]
    assert tok.decode(ids, skip_special_tokens=True).endswith("XYZ")
    special = skipped_token_ids(tok)
    assert matched_stop(tok, ids, ["XYZ"], True, special) == "XYZ"
    # without the skipped tokens counted, the default window would miss it
    assert matched_stop(tok, ids, ["XYZ"], True, frozenset()) is None


@pytest.mark.parametrize("family", ["qwen2_5_vl", "llama"])
def test_stop_of_multibyte_characters_spanning_many_tokens(family: str) -> None:
    tok = _tokenizer(family)
    # four-byte characters, one byte token each: 10 characters are 40 tokens, the most a
    # 10-character stop string can span
    ids = tok(" a b c 日本語テキスト " + "𝔘" * 10 + " d", add_special_tokens=False)["input_ids"]
    special = skipped_token_ids(tok)
    for stops in (["本語テキス"], ["𝔘" * 10], ["zz", "テキスト 𝔘"]):
        want = _first_stop_full(tok, ids, stops, True)
        assert want is not None
        assert _first_stop_tail(tok, ids, stops, True, special) == want


# stop_regex --------------------------------------------------------------------------------------
REGEXES = [
    r"[0-9]{2}", r"é.", r"\s\s", r"(ca|東京)", r"[A-Z]\w", r"(?<=a)f", r"o(?= )", r"\d+", "😀",
]  # fmt: skip


@pytest.mark.parametrize(
    ("pattern", "chars"),
    [
        ("abc", 3),
        (r"a{2,5}b", 6),
        (r"(foo|barbaz)!", 7),
        (r"x(?=yz)", 3),
        (r"^\bw\b$", 1),
        (r"[a-z]{3}", 3),
        (r"(?>ab)c", 3),
        (r"\d+", None),
        (r"a*?", None),
        (r"(a)\1", None),
    ],
)
def test_regex_max_chars(pattern: str, chars: int | None) -> None:
    assert regex_max_chars(pattern) == chars


def _first_regex_full(tok, ids, patterns, skip) -> tuple[int, str] | None:
    for t in range(1, len(ids) + 1):
        text = tok.decode(ids[:t], skip_special_tokens=skip)
        hit = next((p for p in patterns if re.search(p, text)), None)
        if hit is not None:
            return t, hit
    return None


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_tail_regex_check_stops_where_the_whole_text_check_does(data) -> None:
    tok = _tokenizer("qwen2_5_vl")
    pieces, skipped = _pool("qwen2_5_vl")
    piece = st.one_of(st.sampled_from(pieces), st.sampled_from(skipped).map(lambda i: (i,)))
    ids = [i for p in data.draw(st.lists(piece, min_size=1, max_size=32)) for i in p]
    skip = data.draw(st.booleans(), label="skip_special_tokens")
    patterns = data.draw(st.lists(st.sampled_from(REGEXES), min_size=1, max_size=3, unique=True))
    special = skipped_token_ids(tok)
    tail = next(
        (
            (t, hit)
            for t in range(1, len(ids) + 1)
            if (hit := matched_stop_regex(tok, ids[:t], patterns, skip, special)) is not None
        ),
        None,
    )
    assert tail == _first_regex_full(tok, ids, patterns, skip)
