"""Why a request ended: one typed value from the scheduler to the API's answer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

FinishKind = Literal["stop", "length", "abort"]


@dataclass(frozen=True)
class FinishReason:
    """``kind`` is SGLang's ``finish_reason.type``. A stop carries what ``matched`` (a token id
    or a stop string), a length the tokens generated, an abort an optional ``message``; an abort
    with a ``status_code`` is an error the API answers with that status."""

    kind: FinishKind
    matched: int | str | None = None
    length: int | None = None
    message: str | None = None
    status_code: int | None = None

    @classmethod
    def stop(cls, matched: int | str) -> FinishReason:
        return cls("stop", matched=matched)

    @classmethod
    def length_limit(cls, length: int) -> FinishReason:
        return cls("length", length=length)

    @classmethod
    def abort(cls, message: str | None = None, status_code: int | None = None) -> FinishReason:
        """A client's abort (no message), or a failure the API reports as ``status_code``."""
        return cls("abort", message=message, status_code=status_code)

    @classmethod
    def error(cls, message: str, status_code: int = 500) -> FinishReason:
        return cls.abort(message, status_code)

    @property
    def is_error(self) -> bool:
        return self.status_code is not None

    def to_json(self) -> dict[str, Any]:
        """SGLang's ``meta_info.finish_reason``: ``{"type": ..., "matched" | "length" |
        "message": ...}`` (an error adds ``status_code``)."""
        out: dict[str, Any] = {"type": self.kind}
        for name in ("matched", "length", "message", "status_code"):
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        return out


def finish_json(reason: FinishReason | None) -> dict[str, Any] | None:
    return None if reason is None else reason.to_json()
