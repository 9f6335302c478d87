"""Split a reasoning model's output into ``reasoning_content`` and ``content``.

``qwen3`` (Qwen3, Qwen3.5): reasoning is the text inside ``<think>...</think>``, which may only
open the output. When the chat template's generation prompt already opened the block (Qwen3.5
thinks by default: the prompt ends with ``<think>``), the output starts inside it and only the
closing tag appears. An output cut short inside the block is all reasoning. Reasoning is stripped
of surrounding whitespace and the answer of leading whitespace; the streamed pieces add up to
exactly what the one-shot split returns.
"""

from __future__ import annotations

from sglang.srt.managers.reasoning_tokens import REASONING_TAGS as PARSERS


def prompt_opens_reasoning(prompt: str, parser: str) -> bool:
    """Whether the rendered prompt ends inside an open reasoning block."""
    start, end = PARSERS[parser]
    tail = prompt.rstrip()
    return tail.endswith(start) and not tail.endswith(end)


class ReasoningParser:
    def __init__(self, parser: str, in_reasoning: bool = False) -> None:
        if parser not in PARSERS:
            raise ValueError(f"unknown reasoning parser {parser!r}; known: {sorted(PARSERS)}")
        self.start, self.end = PARSERS[parser]
        # "start": nothing decided yet; "reasoning": inside the block; "content": after it.
        self.state = "reasoning" if in_reasoning else "start"
        self.saw_reasoning = in_reasoning
        self._strip_next = True  # drop whitespace at the start of reasoning / of the answer
        self.buffer = ""

    def parse(self, text: str) -> tuple[str | None, str]:
        """One-shot split of a whole output: (reasoning, or None without a block; content)."""
        reasoning, content = self.feed(text, final=True)
        return (reasoning if self.saw_reasoning else None), content

    def feed(self, delta: str, final: bool = False) -> tuple[str, str]:
        """Consume the next piece of output; return the (reasoning, content) text now safe to
        emit. Text that may still turn out to be (part of) a tag or whitespace to drop is held
        back until more arrives or ``final``."""
        self.buffer += delta
        reasoning = ""
        if self.state == "start":
            self._leave_start(final)
        if self.state == "reasoning":
            reasoning = self._take_reasoning(final)
        content = self._take_content(final) if self.state == "content" else ""
        return reasoning, content

    def _leave_start(self, final: bool) -> None:
        head = self.buffer.lstrip()
        if head.startswith(self.start):
            self.buffer = head[len(self.start) :]
            self.state, self.saw_reasoning = "reasoning", True
        elif not (head and self.start.startswith(head)) or final:
            self.state, self._strip_next = "content", False  # no block: content as it is
        # else: maybe an opening tag still arriving

    def _take_reasoning(self, final: bool) -> str:
        if self._strip_next:
            self.buffer = self.buffer.lstrip()
            self._strip_next = not self.buffer
        idx = self.buffer.find(self.end)
        if idx >= 0:
            piece, self.buffer = self.buffer[:idx].rstrip(), self.buffer[idx + len(self.end) :]
            self.state, self._strip_next = "content", True
            return piece
        if final:
            piece, self.buffer = self.buffer.rstrip(), ""
            return piece
        keep = _partial_suffix(self.buffer, self.end)
        piece = self.buffer[: len(self.buffer) - keep].rstrip()  # whitespace may precede the tag
        self.buffer = self.buffer[len(piece) :]
        return piece

    def _take_content(self, final: bool) -> str:
        if self._strip_next:
            self.buffer = self.buffer.lstrip()
            self._strip_next = not self.buffer and not final
        piece, self.buffer = self.buffer, ""
        return piece


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``tag``."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0
