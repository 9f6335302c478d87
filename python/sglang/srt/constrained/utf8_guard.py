"""Constrained outputs stay UTF-8. xgrammar's byte-level matchers accept a UTF-16 surrogate
written as three UTF-8 bytes (``ED A0..BF 80..BF``, U+D800..U+DFFF) inside JSON strings, regex
and EBNF character classes; those bytes are not UTF-8, and the output text would decode them
to replacement characters (a JSON string of ``maxLength`` 3 then reads as 5 characters). The
guard takes such tokens out of every grammar's bitmask: a token holding ``ED A0..BF`` always,
and a token starting with ``A0..BF`` right after a token that ended on the lead byte ``ED``."""

from __future__ import annotations

import re

import torch

_SURROGATE = re.compile(rb"\xed[\xa0-\xbf]")
_LEAD = 0xED


def _packed(allowed: list[bool], words: int) -> torch.Tensor:
    """A bool per token as xgrammar's bitmask words: bit t % 32 of int32 word t // 32."""
    bits = torch.zeros(words * 32, dtype=torch.int64)
    bits[: len(allowed)] = torch.tensor(allowed, dtype=torch.int64)
    values = (bits.view(words, 32) << torch.arange(32)).sum(1)
    return torch.where(values >= 2**31, values - 2**32, values).to(torch.int32)


class Utf8Guard:
    def __init__(self, decoded_vocab: list[bytes], words: int) -> None:
        inside = [bool(_SURROGATE.search(piece)) for piece in decoded_vocab]
        continues = [bool(piece) and 0xA0 <= piece[0] <= 0xBF for piece in decoded_vocab]
        self._ends_on_lead = [piece.endswith(bytes([_LEAD])) for piece in decoded_vocab]
        self.anywhere = _packed([not i for i in inside], words)
        self.after_lead = _packed([not (i or c) for i, c in zip(inside, continues)], words)

    def ends_on_lead(self, token: int) -> bool:
        return 0 <= token < len(self._ends_on_lead) and self._ends_on_lead[token]

    def restrict(self, bitmask: torch.Tensor, row: int, after_lead: bool) -> None:
        """Clear, in row ``row`` of ``bitmask``, the tokens that would write a surrogate."""
        bitmask[row] &= self.after_lead if after_lead else self.anywhere
