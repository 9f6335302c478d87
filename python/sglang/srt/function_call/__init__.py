"""Tool-call formats of model families: parse outputs into OpenAI ``tool_calls`` and build the
grammar that forces a call (``--tool-call-parser NAME``)."""

from __future__ import annotations

from types import ModuleType

from sglang.srt.function_call import qwen25

TOOL_CALL_PARSERS: dict[str, ModuleType] = {"qwen25": qwen25}


def get_tool_call_parser(name: str | None) -> ModuleType | None:
    if name is None:
        return None
    if name not in TOOL_CALL_PARSERS:
        raise ValueError(
            f"unknown tool call parser {name!r}; choose from {sorted(TOOL_CALL_PARSERS)}"
        )
    return TOOL_CALL_PARSERS[name]
