"""SGLang's ``reasoning_tokens``: how many output tokens a reasoning model spent thinking.

Counted on token ids, as SGLang's scheduler counts them: an output that starts inside the block
(the prompt opened it, or ``/generate`` asked ``require_reasoning``) reasons up to and including
the end tag's tokens; any other output reasons only when it opens with the start tag itself.
An output cut short inside the block is all reasoning.
"""

from __future__ import annotations

from typing import Any

# --reasoning-parser -> (start tag, end tag)
REASONING_TAGS = {"qwen3": ("<think>", "</think>")}


class ReasoningTokenCounter:
    """Fed an output's token ids as they arrive; ``count`` is its ``reasoning_tokens``."""

    def __init__(self, start_ids: list[int], end_ids: list[int], opened: bool) -> None:
        self.start_ids, self.end_ids = start_ids, end_ids
        self.state = "reasoning" if opened else "start"  # then "done"
        self.count = 0
        self._start_matched = 0
        self._recent: list[int] = []  # the last len(end_ids) ids, to find an end tag

    def feed(self, token_ids: list[int]) -> None:
        for token in token_ids:
            if self.state == "start":
                self._feed_start(token)
            elif self.state == "reasoning":
                self._feed_reasoning(token)
            else:
                return

    def _feed_start(self, token: int) -> None:
        if not self.start_ids or token != self.start_ids[self._start_matched]:
            self.state = "done"  # the output does not open a block
            return
        self._start_matched += 1
        if self._start_matched == len(self.start_ids):
            self.count, self.state = len(self.start_ids), "reasoning"

    def _feed_reasoning(self, token: int) -> None:
        self.count += 1
        self._recent = [*self._recent, token][-len(self.end_ids) :]
        if self.end_ids and self._recent == self.end_ids:
            self.state = "done"


def reasoning_tag_ids(tokenizer: Any, parser: str | None) -> tuple[list[int], list[int]] | None:
    """The token ids of ``parser``'s start and end tags (None without a reasoning parser)."""
    if parser is None:
        return None
    start, end = REASONING_TAGS[parser]
    encode = tokenizer.encode
    return encode(start, add_special_tokens=False), encode(end, add_special_tokens=False)
