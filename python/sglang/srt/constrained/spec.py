"""What a request asks its output to match, independent of the grammar library.

Validation here is structural (types, one constraint at most, bias ranges); whether a schema,
regex or grammar compiles is decided by the backend.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

CONSTRAINT_KINDS = ("json_schema", "regex", "ebnf", "structural_tag")
MAX_LOGIT_BIAS = 100.0


@dataclass(frozen=True)
class GrammarSpec:
    """One constraint: ``kind`` is one of CONSTRAINT_KINDS; ``source`` is its text (a JSON schema
    or structural tag as JSON text, a regex, or an EBNF grammar). Hashable: the cache key."""

    kind: str
    source: str


def grammar_spec(params: Any) -> GrammarSpec | None:
    """The constraint of validated sampling params, or None for free text."""
    for kind in CONSTRAINT_KINDS:
        source = getattr(params, kind, None)
        if source is not None:
            return GrammarSpec(kind, source)
    return None


def normalize_constraint_params(params: Any) -> None:
    """Check and normalise the constraint fields of SamplingParams in place (ValueError)."""
    given = [kind for kind in CONSTRAINT_KINDS if getattr(params, kind) is not None]
    if len(given) > 1:
        raise ValueError(f"give at most one of {', '.join(CONSTRAINT_KINDS)}; got {given}")
    for kind in ("json_schema", "structural_tag"):
        value = getattr(params, kind)
        if isinstance(value, (dict, list, bool)):  # SGLang takes text; accept the parsed form too
            setattr(params, kind, json.dumps(value))
    for kind in CONSTRAINT_KINDS:
        value = getattr(params, kind)
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise ValueError(f"{kind} must be a non-empty string")
    if params.logit_bias is not None:
        params.logit_bias = normalize_logit_bias(params.logit_bias)


def normalize_logit_bias(bias: Any) -> dict[int, float]:
    """OpenAI's ``{"token id": bias}`` (keys may be strings) -> ``{id: bias}``; bias in
    [-100, 100]. Whether ids are inside the vocabulary is checked where the vocabulary is known."""
    if not isinstance(bias, dict):
        raise ValueError("logit_bias must be an object mapping token ids to biases")
    out: dict[int, float] = {}
    for key, value in bias.items():
        try:
            token = int(key)
        except (TypeError, ValueError):
            raise ValueError(f"logit_bias keys must be token ids, got {key!r}") from None
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value == value
        if not ok or abs(value) > MAX_LOGIT_BIAS:
            raise ValueError(f"logit_bias values must be in [-100, 100], got {value!r} for {key}")
        out[token] = float(value)
    return out
