"""The qwen25 tool-call parser: whole texts and streams cut anywhere give the same message."""

from __future__ import annotations

import json

from conftest import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang.srt.function_call import get_tool_call_parser, qwen25


def _block(name: str, args: dict) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': args})}\n</tool_call>"


def test_parse_content_and_calls() -> None:
    text = "Let me check.\n" + _block("get_weather", {"city": "Paris"}) + "\n" + _block("add", {})
    content, calls = qwen25.parse(text)
    assert content == "Let me check."
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", {"city": "Paris"}),
        ("add", {}),
    ]
    assert calls[0].to_openai(0)["function"]["name"] == "get_weather"
    assert calls[0].id != calls[1].id


def test_text_without_valid_calls_is_content() -> None:
    for text in ("plain answer", "<tool_call>\n{broken json\n</tool_call>", "<tool_call> open"):
        assert qwen25.parse(text) == (text, [])
    only_call = _block("f", {"x": 1})
    assert qwen25.parse(only_call)[0] is None
    stringly = '<tool_call>{"name": "f", "arguments": "{\\"x\\": 2}"}</tool_call>'
    assert json.loads(qwen25.parse(stringly)[1][0].arguments) == {"x": 2}


def test_unknown_parser_is_rejected() -> None:
    assert get_tool_call_parser("qwen25") is qwen25
    try:
        get_tool_call_parser("nope")
    except ValueError as exc:
        assert "qwen25" in str(exc)
    else:
        raise AssertionError("expected ValueError")


_pieces = st.one_of(
    st.sampled_from(["Sure", " ", "\n", "<", "<tool", "<tool_call", "</tool_call>", "ok."]),
    st.builds(
        _block, st.sampled_from(["f", "get_weather"]), st.fixed_dictionaries({"x": st.integers()})
    ),
    st.just("<tool_call>\n{not json}\n</tool_call>"),
    st.text(alphabet="ab <>/\n", max_size=6),
)


@settings(max_examples=examples(300), deadline=None)
@given(pieces=st.lists(_pieces, max_size=6), cuts=st.lists(st.integers(0, 400), max_size=8))
def test_stream_parse_equals_whole_parse(pieces: list[str], cuts: list[int]) -> None:
    text = "".join(pieces)
    bounds = sorted({min(c, len(text)) for c in cuts} | {0, len(text)})
    parser = qwen25.StreamParser()
    content, calls = "", []
    for lo, hi in zip(bounds, bounds[1:]):
        delta, new = parser.feed(text[lo:hi])
        content += delta
        calls += new
    content += parser.finish()
    whole_content, whole_calls = qwen25.parse(text)
    assert content == (whole_content or "")
    assert [(c.name, c.arguments) for c in calls] == [(c.name, c.arguments) for c in whole_calls]
