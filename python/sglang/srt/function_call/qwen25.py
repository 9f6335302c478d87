"""Qwen2.5-style tool calls (``--tool-call-parser qwen25``).

The model writes each call as a JSON object between tags::

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

Parsing rule (the same for whole texts and streams, so both give the same message): the text
before the first ``<tool_call>`` (right-stripped) is the message content; every complete block
whose JSON names a function becomes a tool call; text after the first tag that is not a valid
block is dropped. A text without any valid block is returned whole as content.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

BEGIN = "<tool_call>"
END = "</tool_call>"
_BLOCK = re.compile(re.escape(BEGIN) + r"(.*?)" + re.escape(END), re.DOTALL)


@dataclass
class ToolCall:
    name: str
    arguments: str  # JSON text, as OpenAI returns it
    id: str = field(default_factory=lambda: f"call_{uuid.uuid4().hex[:24]}")

    def to_openai(self, index: int | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }
        if index is not None:
            out["index"] = index
        return out


def parse_block(body: str) -> ToolCall | None:
    """The call in one block's body, or None when it is not a JSON object naming a function."""
    try:
        obj = json.loads(body)
    except json.JSONDecodeError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # some models double-encode
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return None
    return ToolCall(obj["name"], json.dumps(args, ensure_ascii=False))


def parse(text: str) -> tuple[str | None, list[ToolCall]]:
    """(content, tool calls) of a whole output."""
    start = text.find(BEGIN)
    if start < 0:
        return text, []
    calls = [c for c in (parse_block(m.group(1)) for m in _BLOCK.finditer(text, start)) if c]
    if not calls:
        return text, []
    return text[:start].rstrip() or None, calls


class StreamParser:
    """Incremental ``parse``: feed text deltas, get (content delta, completed calls)."""

    def __init__(self) -> None:
        self._held = ""  # content not yet safe to emit: whitespace, or a prefix of BEGIN
        self._calls_text: str | None = None  # everything from the first BEGIN on
        self._scanned = 0
        self.calls: list[ToolCall] = []

    def feed(self, delta: str) -> tuple[str, list[ToolCall]]:
        if self._calls_text is None:
            text = self._held + delta
            start = text.find(BEGIN)
            if start < 0:
                safe = len(text) - _unsafe_tail(text)
                self._held = text[safe:]
                return text[:safe], []
            self._held, self._calls_text = text[:start], text[start:]
            content = self._held.rstrip()
            self._held = self._held[len(content) :]
            return content, self._complete_blocks()
        self._calls_text += delta
        return "", self._complete_blocks()

    def _complete_blocks(self) -> list[ToolCall]:
        assert self._calls_text is not None
        new = []
        for match in _BLOCK.finditer(self._calls_text, self._scanned):
            self._scanned = match.end()
            call = parse_block(match.group(1))
            if call is not None:
                new.append(call)
        self.calls += new
        return new

    def finish(self) -> str:
        """Content still held back; when no call was found, the whole tool-call text too."""
        if self.calls:
            return ""
        rest = self._held + (self._calls_text or "")
        self._held, self._calls_text = "", None
        return rest


def _unsafe_tail(text: str) -> int:
    """Length of the tail that must wait: trailing whitespace (dropped if a call follows) plus a
    partial BEGIN."""
    partial = next((n for n in range(min(len(BEGIN) - 1, len(text)), 0, -1)
                    if BEGIN.startswith(text[-n:])), 0)  # fmt: skip
    body = text[: len(text) - partial]
    return partial + len(body) - len(body.rstrip())


def structural_tag(
    tools: list[dict[str, Any]], choice: str | dict[str, Any], parallel: bool
) -> dict[str, Any]:
    """xgrammar structural tag forcing tool calls: ``"required"`` (one or more of ``tools``,
    only one without ``parallel``) or a named function (exactly one call of it)."""
    if isinstance(choice, dict):
        name = choice["function"]["name"]
        tool = next(t for t in tools if t["function"]["name"] == name)
        return {"type": "structural_tag", "format": _call_tag(tool)}
    fmt = {
        "type": "tags_with_separator",
        "tags": [_call_tag(t) for t in tools],
        "separator": "\n",
        "at_least_one": True,
        "stop_after_first": not parallel,
    }
    return {"type": "structural_tag", "format": fmt}


def _call_tag(tool: dict[str, Any]) -> dict[str, Any]:
    function = tool["function"]
    schema = function.get("parameters") or {"type": "object"}
    return {
        "type": "tag",
        "begin": f'{BEGIN}\n{{"name": {json.dumps(function["name"])}, "arguments": ',
        "content": {"type": "json_schema", "json_schema": schema},
        "end": f"}}\n{END}",
    }
