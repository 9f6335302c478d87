"""The qwen3 reasoning parser: one-shot splits, and streamed pieces that add up to them however
the output is cut."""

from __future__ import annotations

import pytest
from conftest import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang.srt.entrypoints.reasoning_parser import ReasoningParser, prompt_opens_reasoning
from sglang.srt.managers.reasoning_tokens import ReasoningTokenCounter


@pytest.mark.parametrize(
    "text, opened, expected",
    [
        ("Let me see.\n</think>\n\nIt is a cat.", True, ("Let me see.", "It is a cat.")),
        ("<think>\nhmm\n</think>\n\nyes <think>x</think>", False, ("hmm", "yes <think>x</think>")),
        ("A plain answer.", False, (None, "A plain answer.")),
        ("cut short while thin", True, ("cut short while thin", "")),
        ("\n\n</think>\n\nOK", True, ("", "OK")),
        ("  <thin", False, (None, "  <thin")),
    ],
)
def test_one_shot(text: str, opened: bool, expected: tuple) -> None:
    assert ReasoningParser("qwen3", in_reasoning=opened).parse(text) == expected


def test_prompt_opens_reasoning() -> None:
    assert prompt_opens_reasoning("<|im_start|>assistant\n<think>\n", "qwen3")
    assert not prompt_opens_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n", "qwen3")
    assert not prompt_opens_reasoning("<|im_start|>assistant\n", "qwen3")
    with pytest.raises(ValueError, match="unknown reasoning parser"):
        ReasoningParser("nope")


words = st.lists(st.sampled_from(["a", "b c", "\n", " ", "<", "/", "think", ">", "x"]), max_size=8)


@settings(max_examples=examples(300), deadline=None)
@given(
    reasoning=words,
    answer=words,
    opened=st.booleans(),
    tagged=st.booleans(),
    closed=st.booleans(),
    cuts=st.lists(st.integers(1, 5), max_size=30),
)
def test_streamed_pieces_add_up_to_the_one_shot_split(
    reasoning, answer, opened, tagged, closed, cuts
) -> None:
    body = "".join(reasoning) + ("</think>" + "".join(answer) if closed else "")
    text = body if opened or not tagged else "<think>" + body
    one_shot = ReasoningParser("qwen3", opened).parse(text)
    parser, got_r, got_c, i = ReasoningParser("qwen3", opened), "", "", 0
    for step in cuts:
        r, c = parser.feed(text[i : i + step])
        got_r, got_c, i = got_r + r, got_c + c, i + step
    r, c = parser.feed(text[i:], final=True)
    assert (got_r + r if parser.saw_reasoning else None, got_c + c) == one_shot
    if opened and closed and "</think>" not in "".join(reasoning):
        assert one_shot[0] == "".join(reasoning).strip()
        assert one_shot[1] == "".join(answer).lstrip()


@pytest.mark.parametrize(
    "opened, output, expected",
    [
        (True, [5, 6, 7], 3),  # still thinking: all of it
        (True, [5, 8, 9, 6], 3),  # up to and including the two-token end tag
        (True, [8, 5, 8, 9, 8, 9], 4),  # a lone first half of the tag does not end it
        (False, [5, 8, 9], 0),  # no block opened: nothing
        (False, [1, 2, 5, 8, 9, 6], 5),  # opened by its own two-token start tag
        (False, [1, 5, 2], 0),  # half a start tag is no block
    ],
)
def test_reasoning_tokens_counted_on_ids_fed_in_pieces(opened, output, expected) -> None:
    for cut in range(len(output) + 1):
        counter = ReasoningTokenCounter([1, 2], [8, 9], opened)
        counter.feed(output[:cut])
        counter.feed(output[cut:])
        assert counter.count == expected, cut
