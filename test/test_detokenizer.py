"""The incremental detokenizer streams the text a whole decode gives, decoding a bounded window
per event, and holds back what may still become a stop string."""

from __future__ import annotations

import functools
from typing import Any

import pytest
from conftest import examples, model_dir
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer

from sglang.srt.core.finish import FinishReason
from sglang.srt.managers.detokenizer import IncrementalDetokenizer
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.sampling.stop_strings import skipped_token_ids

FAMILIES = ["qwen2_5_vl", "llama"]
WORDS = "Hello world, naïve café 東京 😀 𝔘 龘 emoji 123 ... \n\t--> ünïcödé 日本語テキスト"
SPLIT_CHARS = "東京😀𝔘龘üï語"  # each fed as its UTF-8 bytes, one byte token per byte


@functools.cache
def _tokenizer(family: str) -> Any:
    """The tiny model's byte-level BPE tokenizer (the one place that knows where it lives)."""
    return AutoTokenizer.from_pretrained(model_dir(family))


def _byte_tokens(tok: Any, char: str) -> tuple[int, ...]:
    """The ids of the byte tokens of ``char``'s UTF-8 bytes, one per byte."""
    spelled = tok.backend_tokenizer.pre_tokenizer.pre_tokenize_str(char)[0][0]
    return tuple(tok.convert_tokens_to_ids(list(spelled)))


@functools.cache
def _pieces(family: str) -> tuple[list[tuple[int, ...]], list[tuple[int, ...]], list[int]]:
    """Runs of ids that end on a character boundary (words, and multi-byte characters split into
    their byte tokens), single ids from across the vocabulary (often a character's first bytes
    only) and the ids ``skip_special_tokens`` drops."""
    tok = _tokenizer(family)
    words = [tuple(tok(f" {w}", add_special_tokens=False)["input_ids"]) for w in WORDS.split(" ")]
    split = [_byte_tokens(tok, ch) for ch in SPLIT_CHARS]
    assert all(len(p) > 1 for p in split)
    singles = [(i,) for i in range(100, min(len(tok), 5000), 97)]
    return sorted(set(words + split)), singles, sorted(skipped_token_ids(tok))


def _params(**kwargs: Any) -> SamplingParams:
    return SamplingParams.from_dict(kwargs)


def _whole(tok: Any, ids: list[int], params: SamplingParams) -> str:
    return tok.decode(
        ids,
        skip_special_tokens=params.skip_special_tokens,
        spaces_between_special_tokens=params.spaces_between_special_tokens,
    )


def _groups(data: Any, ids: list[int]) -> list[list[int]]:
    """``ids`` cut into random-sized groups (one scheduler output each)."""
    groups, start = [], 0
    while start < len(ids):
        size = data.draw(st.integers(1, 6), label="group")
        groups.append(ids[start : start + size])
        start += size
    return groups


def _draw_ids(data: Any, family: str, complete: bool) -> list[int]:
    whole_chars, singles, skipped = _pieces(family)
    piece = st.sampled_from(whole_chars if complete else whole_chars + singles)
    special = st.sampled_from(skipped).map(lambda i: (i,))
    chosen = data.draw(st.lists(st.one_of(piece, piece, special), max_size=40), label="pieces")
    return [i for p in chosen for i in p]


def _shown_by_whole_decode(tok: Any, ids: list[int], params: SamplingParams, sent: str) -> str:
    """What an event showed when streaming decoded the whole output each time, less two flaws:
    a trailing incomplete character counted among the held-back characters (so the start of a
    stop string ending in a multi-byte character could show), and a text shorter than the
    held-back characters showed part of itself (``text[:-k]``)."""
    text = _whole(tok, ids, params).rstrip("\ufffd")
    hold = max((len(s) for s in params.stop or []), default=1) - 1
    text = text[: max(0, len(text) - hold)].rstrip("\ufffd")
    return sent + (text[len(sent) :] if text.startswith(sent) else "")


def _stream(detokenizer: IncrementalDetokenizer, groups: list[list[int]]) -> list[str]:
    """Feed each group; check each event shows what a whole decode showed; the deltas."""
    tok, params = detokenizer.tokenizer, detokenizer.params
    deltas: list[str] = []
    for group in groups:
        delta = detokenizer.feed(group)
        assert delta is not None and delta == detokenizer.delta
        deltas.append(delta)
        want = _shown_by_whole_decode(tok, detokenizer.output_ids, params, "".join(deltas[:-1]))
        assert detokenizer.text == want
    return deltas


@pytest.mark.parametrize("family", FAMILIES)
@settings(max_examples=examples(80), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_streamed_deltas_add_up_to_the_whole_decode(family: str, data: Any) -> None:
    tok = _tokenizer(family)
    complete = data.draw(st.booleans(), label="ends on character boundaries")
    ids = _draw_ids(data, family, complete)
    params = _params(
        skip_special_tokens=data.draw(st.booleans(), label="skip_special_tokens"),
        spaces_between_special_tokens=data.draw(st.booleans(), label="spaces"),
        stop=data.draw(st.lists(st.text(min_size=1, max_size=6), max_size=2), label="stops"),
    )
    whole = _whole(tok, ids, params)
    detokenizer = IncrementalDetokenizer(tok, params, skipped_token_ids(tok))
    deltas = _stream(detokenizer, _groups(data, ids))
    assert "".join(deltas) == detokenizer.text
    assert whole.startswith(detokenizer.text)
    if complete and not params.stop:  # nothing waits for more bytes or a possible stop string
        assert detokenizer.text == whole
    assert detokenizer.finish(FinishReason.length_limit(len(ids))) == whole
    assert "".join(deltas) + detokenizer.delta == detokenizer.text == whole
    assert detokenizer.output_ids == ids


@pytest.mark.parametrize("family", FAMILIES)
@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_stop_strings_are_held_back_and_trimmed(family: str, data: Any) -> None:
    tok = _tokenizer(family)
    ids = _draw_ids(data, family, complete=data.draw(st.booleans(), label="complete"))
    skip = data.draw(st.booleans(), label="skip_special_tokens")
    text = tok.decode(ids, skip_special_tokens=skip)
    assume(text)
    start = data.draw(st.integers(0, len(text) - 1), label="stop start")
    stop = text[start : start + data.draw(st.integers(1, 8), label="stop length")]
    other = data.draw(st.text(min_size=1, max_size=12), label="another stop")
    no_stop_trim = data.draw(st.booleans(), label="no_stop_trim")
    params = _params(stop=[stop, other], skip_special_tokens=skip, no_stop_trim=no_stop_trim)
    # the scheduler finishes the request at the first token whose text holds a stop string
    end = next(t for t in range(1, len(ids) + 1) if stop in _whole(tok, ids[:t], params))
    assume(not any(other in _whole(tok, ids[:t], params) for t in range(1, end + 1)))
    *streamed, last = _groups(data, ids[:end])
    detokenizer = IncrementalDetokenizer(tok, params, skipped_token_ids(tok))
    deltas = _stream(detokenizer, streamed)
    full = _whole(tok, ids[:end], params)
    cut = full.find(stop) + (len(stop) if no_stop_trim else 0)
    assert full[:cut].startswith(detokenizer.text)  # never shown past a stop string's start
    assert detokenizer.finish(FinishReason.stop(stop), last) == full[:cut]
    assert "".join(deltas) + detokenizer.delta == full[:cut]


def test_hold_back_is_the_longest_stop_string_less_one_character() -> None:
    tok = _tokenizer("qwen2_5_vl")
    ids = tok(" hello world", add_special_tokens=False)["input_ids"]
    detokenizer = IncrementalDetokenizer(tok, _params(stop=["xyz", "abcdef"]))
    detokenizer.feed(ids)
    assert detokenizer.text == " hello "  # five characters held back
    assert detokenizer.finish(FinishReason.length_limit(len(ids))) == " hello world"
    assert detokenizer.delta == "world"


def test_a_text_shorter_than_the_hold_back_shows_nothing() -> None:
    tok = _tokenizer("qwen2_5_vl")
    detokenizer = IncrementalDetokenizer(tok, _params(stop=["abcd"]))
    # streaming by whole decodes showed "a" here (text[: len(text) - 3] is text[:-1])
    assert detokenizer.feed(tok("ab", add_special_tokens=False)["input_ids"]) == ""
    last = tok("cd", add_special_tokens=False)["input_ids"]
    assert detokenizer.finish(FinishReason.stop("abcd"), last) == ""
    assert detokenizer.delta == ""


def test_an_incomplete_character_is_not_one_of_the_held_back_characters() -> None:
    tok = _tokenizer("qwen2_5_vl")
    first, second = _byte_tokens(tok, "ï")
    detokenizer = IncrementalDetokenizer(tok, _params(stop=["ïïï"]))
    detokenizer.feed([first])
    # the text is "ïï" and half an "ï": the two "ï" may start the stop string
    assert detokenizer.feed([second, first, second, first]) == ""
    assert detokenizer.finish(FinishReason.stop("ïïï"), [second]) == ""
    assert detokenizer.delta == ""


def test_stream_interval_decides_which_outputs_are_events() -> None:
    tok = _tokenizer("qwen2_5_vl")
    ids = tok(" one two three four five six seven", add_special_tokens=False)["input_ids"]
    detokenizer = IncrementalDetokenizer(tok, _params(stream_interval=3))
    due = [detokenizer.feed([i]) is not None for i in ids]
    assert due == [n == 1 or (n - 1) % 3 == 0 for n in range(1, len(ids) + 1)]
    assert detokenizer.text == _whole(tok, ids[: 1 + 3 * ((len(ids) - 1) // 3)], _params())


class CountingTokenizer:
    """A tokenizer that records how many ids each ``decode`` call gets."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.calls: list[int] = []

    def decode(self, ids: list[int], **kwargs: Any) -> str:
        self.calls.append(len(ids))
        return self.tokenizer.decode(ids, **kwargs)


@pytest.mark.parametrize("skip", [True, False])
def test_work_per_event_stays_bounded_as_the_output_grows(skip: bool) -> None:
    tok = _tokenizer("qwen2_5_vl")
    end = tok.convert_tokens_to_ids("<|im_end|>")
    text_ids = tok(f" {WORDS}" * 200, add_special_tokens=False)["input_ids"]
    ids = text_ids[:2000] + [end] * 500 + text_ids[2000:3500]  # a long run of a special token
    counting = CountingTokenizer(tok)
    params = _params(skip_special_tokens=skip, stop=["東京 😀"])
    detokenizer = IncrementalDetokenizer(counting, params, skipped_token_ids(tok))
    decoded_per_feed = []
    for i in ids:
        before = len(counting.calls)
        detokenizer.feed([i])
        decoded_per_feed.append(sum(counting.calls[before:]))
    assert len(ids) == 4000
    assert max(decoded_per_feed) <= 16  # a window of a few characters' tokens, at any length
    assert max(decoded_per_feed[-500:]) <= max(decoded_per_feed[:500])
    assert detokenizer.finish(None) == _whole(tok, ids, params)


def test_spaces_between_special_tokens_reach_every_decode() -> None:
    class Recorder:
        def __init__(self) -> None:
            self.kwargs: list[dict] = []

        def decode(self, ids: list[int], **kwargs: Any) -> str:
            self.kwargs.append(kwargs)
            return "a" * len(ids)

    tok = Recorder()
    detokenizer = IncrementalDetokenizer(tok, _params(spaces_between_special_tokens=False))
    assert [detokenizer.feed([1]), detokenizer.feed([2, 3])] == ["a", "aa"]
    assert detokenizer.finish(None) == "aaa"
    want = {"skip_special_tokens": True, "spaces_between_special_tokens": False}
    assert tok.kwargs and all(kwargs == want for kwargs in tok.kwargs)
