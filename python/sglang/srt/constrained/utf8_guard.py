"""Constrained outputs stay UTF-8. xgrammar's byte-level matchers check the shape of a multi-byte
character (lead byte, count of continuation bytes) but not every range RFC 3629 puts on its
second byte: they accept a UTF-16 surrogate written as three bytes (``ED A0..BF``) in JSON
strings, regex and EBNF character classes, and in a JSON string with a ``pattern`` (which
bounded strings get, ``xgrammar_backend._plain_length_strings``) overlong forms too
(``E0 80..9F``, ``F0 80..8F``). Those bytes are not UTF-8: the output text would decode them to
replacement characters (a JSON string of ``maxLength`` 3 then reads as 5 characters). The guard
takes such tokens out of every grammar's bitmask: a token holding a lead byte followed by a
second byte it forbids, always, and a token starting with a forbidden second byte right after a
token that ended on that lead byte."""

from __future__ import annotations

import re

import torch

# lead byte -> the second bytes (inclusive range) that make the sequence not UTF-8
FORBIDDEN_AFTER = {0xE0: (0x80, 0x9F), 0xED: (0xA0, 0xBF), 0xF0: (0x80, 0x8F), 0xF4: (0x90, 0xBF)}
# a lead byte and a second byte it forbids (all non-ASCII bytes: nothing to escape)
_INVALID_PAIR = re.compile(
    b"|".join(bytes([lead, ord("["), lo, ord("-"), hi, ord("]")])
              for lead, (lo, hi) in FORBIDDEN_AFTER.items())
)  # fmt: skip


def _packed(allowed: list[bool], words: int) -> torch.Tensor:
    """A bool per token as xgrammar's bitmask words: bit t % 32 of int32 word t // 32."""
    bits = torch.zeros(words * 32, dtype=torch.int64)
    bits[: len(allowed)] = torch.tensor(allowed, dtype=torch.int64)
    values = (bits.view(words, 32) << torch.arange(32)).sum(1)
    return torch.where(values >= 2**31, values - 2**32, values).to(torch.int32)


class Utf8Guard:
    def __init__(self, decoded_vocab: list[bytes], words: int) -> None:
        clean = [not _INVALID_PAIR.search(piece) for piece in decoded_vocab]
        self._lead_at_end = [
            piece[-1] if piece and piece[-1] in FORBIDDEN_AFTER else None for piece in decoded_vocab
        ]
        self.anywhere = _packed(clean, words)
        self.after_lead = {
            lead: _packed(
                [
                    ok and not (piece and lo <= piece[0] <= hi)
                    for ok, piece in zip(clean, decoded_vocab)
                ],
                words,
            )
            for lead, (lo, hi) in FORBIDDEN_AFTER.items()
        }

    def lead_at_end(self, token: int) -> int | None:
        """The lead byte ``token`` ends on, where it limits the next byte; else None."""
        return self._lead_at_end[token] if 0 <= token < len(self._lead_at_end) else None

    def restrict(self, bitmask: torch.Tensor, row: int, lead: int | None) -> None:
        """Clear, in row ``row`` of ``bitmask``, the tokens that would write bytes that are not
        UTF-8, after a token that ended on ``lead`` (None: on a whole character)."""
        bitmask[row] &= self.anywhere if lead is None else self.after_lead[lead]
