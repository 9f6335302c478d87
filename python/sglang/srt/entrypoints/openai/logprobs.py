"""OpenAI logprob entries (chat ``logprobs.content`` and the completions ``logprobs`` object)
from the scheduler's ``(logprob, token id, _)`` lists."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class LogprobFormatter:
    """One entry per output token, as SGLang gives them: the special ones that the text's decode
    skips (the EOS that ended a choice, say) included."""

    def __init__(self, token_text: Callable[[int], str]) -> None:
        self.token = token_text  # the tokenizer manager's cached one-token decode

    def _rows(self, meta: dict[str, Any], start: int) -> list[tuple[float, int, list]]:
        chosen = meta.get("output_token_logprobs", [])[start:]
        tops = meta.get("output_top_logprobs", [])[start:] or [[] for _ in chosen]
        return [(lp, tok, top) for (lp, tok, _), top in zip(chosen, tops)]

    def chat(self, meta: dict[str, Any], start: int = 0) -> list[dict[str, Any]]:
        return [
            {
                **self._entry(lp, tok),
                "top_logprobs": [self._entry(t_lp, t_tok) for t_lp, t_tok, _ in top],
            }
            for lp, tok, top in self._rows(meta, start)
        ]

    def _entry(self, logprob: float, token_id: int) -> dict[str, Any]:
        text = self.token(token_id)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode())}

    def completion(
        self, meta: dict[str, Any], start: int, offset: int, top: int
    ) -> tuple[dict[str, Any], int]:
        """The completions ``logprobs`` object for tokens from ``start``; text offsets count on
        from ``offset``. Returns it and the offset after it."""
        out = _empty_completion_logprobs()
        for lp, tok, alternatives in self._rows(meta, start):
            text = self.token(tok)
            out["tokens"].append(text)
            out["token_logprobs"].append(lp)
            out["text_offset"].append(offset)
            out["top_logprobs"].append({self.token(t): t_lp for t_lp, t, _ in alternatives})
            offset += len(text)
        if not top:
            out["top_logprobs"] = None
        return out, offset

    def prompt(self, meta: dict[str, Any], top: int) -> dict[str, Any]:
        """The completions ``logprobs`` object of an echoed prompt (``echo`` with ``logprobs``):
        every prompt token, the first one with a null logprob, as OpenAI's legacy API."""
        chosen = meta.get("input_token_logprobs", [])
        tops = meta.get("input_top_logprobs") or [None] * len(chosen)
        out = _empty_completion_logprobs()
        offset = 0
        for (lp, tok, _), alternatives in zip(chosen, tops):
            text = self.token(tok)
            out["tokens"].append(text)
            out["token_logprobs"].append(lp)
            out["text_offset"].append(offset)
            if alternatives is not None:
                alternatives = {self.token(t): t_lp for t_lp, t, _ in alternatives}
            out["top_logprobs"].append(alternatives)
            offset += len(text)
        if not top:
            out["top_logprobs"] = None
        return out


def _empty_completion_logprobs() -> dict[str, Any]:
    return {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}


def joined(first: dict[str, Any], second: dict[str, Any]) -> dict[str, Any]:
    """Two completions ``logprobs`` objects, one after the other."""
    return {k: None if first[k] is None else first[k] + second[k] for k in first}
