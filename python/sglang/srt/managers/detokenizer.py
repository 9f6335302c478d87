"""Output ids -> text, one request at a time: incremental while streaming, whole when finished.

Streaming decodes a window, not the whole output (as SGLang's DetokenizerManager, vLLM's
``detokenize_incrementally`` and HF's ``DecodeStream`` do): ``prefix`` ids already decoded give
the context and ``read`` marks where they end. An event decodes ``window[:read]`` and the whole
window; what the latter adds is new text, unless it ends in U+FFFD (a character whose bytes have
not all arrived): then it stays pending and the window waits for more ids. After new text the
window starts at the old ``read``, so each event decodes about two events' worth of ids, however
long the output. With ``skip_special_tokens`` the ids that decode to nothing never enter the
window (the tokenizer drops them before decoding anyway), so a run of them does not grow it. An
event shows the decoded and pending text less a trailing U+FFFD, less the characters that may
still become a stop string (the length of the longest less one), less a U+FFFD that cut leaves
at the end.

The final text is one decode of all the ids, then stop-trimmed: exactly what a whole decode
gives, even for a tokenizer whose window decodes do not add up to the whole decode (e.g.
clean-up of spaces around punctuation). The last event sends what that text adds to the streamed
text (nothing if the two disagree: the final event's ``text`` is authoritative).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sglang.srt.core.finish import FinishReason
from sglang.srt.sampling.sampling_params import SamplingParams

INCOMPLETE_CHAR = "\ufffd"


class IncrementalDetokenizer:
    """``feed`` each scheduler output's new ids; ``finish`` with the finish reason. ``text`` is
    the text streamed so far (after ``finish``: the final text) and ``delta`` what the latest
    ``feed`` or ``finish`` added to it."""

    def __init__(
        self,
        tokenizer: Any,
        params: SamplingParams,
        skipped_ids: frozenset[int] = frozenset(),
    ) -> None:
        self.tokenizer = tokenizer
        self.params = params
        self.skipped_ids = skipped_ids if params.skip_special_tokens else frozenset()
        self.interval = params.stream_interval or 1
        # Characters held back: they may still become the start of a stop string.
        self.hold = max((len(s) for s in params.stop or []), default=1) - 1
        self.output_ids: list[int] = []
        self.text = ""
        self.delta = ""
        self._decoded = ""  # text of the ids before the window's read offset
        self._pending = ""  # the window's text after it, while it ends in an incomplete char
        self._window: list[int] = []  # ids from the prefix offset on
        self._read = 0  # the read offset, within the window
        self._shown = 0  # output ids when the latest event was due

    def feed(self, new_ids: Sequence[int]) -> str | None:
        """Take a scheduler output's new ids; the text they add to the stream (possibly ""), or
        None when no event is due yet (fewer than ``stream_interval`` ids since the last)."""
        self.output_ids += new_ids
        self._window += [i for i in new_ids if i not in self.skipped_ids]
        if self._shown and len(self.output_ids) - self._shown < self.interval:
            return None
        self._shown = len(self.output_ids)
        self._read_window()
        complete = len(self._decoded) + len(self._pending.rstrip(INCOMPLETE_CHAR))
        start, end = len(self.text), complete - self.hold
        self.delta = self._shown_text(start, end).rstrip(INCOMPLETE_CHAR) if end > start else ""
        self.text += self.delta
        return self.delta

    def finish(self, reason: FinishReason | None, new_ids: Sequence[int] = ()) -> str:
        """The final text, cut before a matched stop string (after it with ``no_stop_trim``),
        from one decode of all the ids (``new_ids``: the last output's)."""
        self.output_ids += new_ids
        final = self._decode(self.output_ids)
        matched = None if reason is None else reason.matched
        if isinstance(matched, str) and matched in final:
            cut = final.find(matched) + (len(matched) if self.params.no_stop_trim else 0)
            final = final[:cut]
        self.delta = final[len(self.text) :] if final.startswith(self.text) else ""
        self.text = final
        return final

    def _read_window(self) -> None:
        """Decode the window: its new text joins the decoded text (and the offsets move past it)
        unless it ends in an incomplete character; then it stays pending."""
        prefix_text = self._decode(self._window[: self._read])
        window_text = self._decode(self._window)
        new_text = window_text[len(prefix_text) :]
        if not new_text or new_text.endswith(INCOMPLETE_CHAR):
            self._pending = new_text
            return
        self._decoded += new_text
        self._pending = ""
        del self._window[: self._read]
        self._read = len(self._window)

    def _shown_text(self, start: int, end: int) -> str:
        """Characters ``start:end`` of the decoded and then the pending text."""
        n = len(self._decoded)
        return self._decoded[start:end] + self._pending[max(0, start - n) : max(0, end - n)]

    def _decode(self, ids: list[int]) -> str:
        if not ids:
            return ""
        return self.tokenizer.decode(
            ids,
            skip_special_tokens=self.params.skip_special_tokens,
            spaces_between_special_tokens=self.params.spaces_between_special_tokens,
        )
