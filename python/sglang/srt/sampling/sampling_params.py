"""Per-request sampling parameters, validated on construction (SGLang names)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from sglang.srt.constrained.spec import normalize_constraint_params

_INT_MAX = 2**31 - 1
MAX_N = 64


@dataclass
class SamplingParams:
    max_new_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    seed: int | None = field(default=None)
    n: int = 1
    # Structured output and logit shaping (see sglang.srt.constrained).
    json_schema: str | None = None
    regex: str | None = None
    ebnf: str | None = None
    structural_tag: str | None = None
    logit_bias: dict[int, float] | None = None
    no_stop_trim: bool = False  # keep a matched stop string at the end of the output text

    @classmethod
    def from_dict(cls, params: dict[str, Any] | None) -> SamplingParams:
        params = dict(params or {})
        known = {f.name for f in fields(cls)}
        # Accepted for compatibility; they do not change greedy/stochastic decoding here.
        for ignored in (
            "frequency_penalty",
            "presence_penalty",
            "repetition_penalty",
            "spaces_between_special_tokens",
            "min_new_tokens",
        ):
            params.pop(ignored, None)
        unknown = set(params) - known
        if unknown:
            raise ValueError(f"unknown sampling parameter(s): {sorted(unknown)}")
        if params.get("max_new_tokens") is None:
            params.pop("max_new_tokens", None)
        sp = cls(**params)
        sp.validate()
        return sp

    def validate(self) -> None:
        def check(ok: bool, message: str) -> None:
            if not ok:
                raise ValueError(message)

        check(
            _is_int(self.max_new_tokens) and 0 <= self.max_new_tokens <= _INT_MAX,
            f"max_new_tokens must be a non-negative integer, got {self.max_new_tokens!r}",
        )
        check(
            _is_number(self.temperature) and self.temperature >= 0,
            f"temperature must be >= 0, got {self.temperature!r}",
        )
        check(
            _is_number(self.top_p) and 0 < self.top_p <= 1,
            f"top_p must be in (0, 1], got {self.top_p!r}",
        )
        check(
            _is_int(self.top_k) and (self.top_k == -1 or self.top_k >= 1),
            f"top_k must be -1 (disabled) or >= 1, got {self.top_k!r}",
        )
        check(
            _is_number(self.min_p) and 0 <= self.min_p <= 1,
            f"min_p must be in [0, 1], got {self.min_p!r}",
        )
        check(
            _is_int(self.n) and 1 <= self.n <= MAX_N, f"n must be in [1, {MAX_N}], got {self.n!r}"
        )
        normalize_constraint_params(self)
        check(
            self.seed is None or _is_int(self.seed), f"seed must be an integer, got {self.seed!r}"
        )
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        check(
            self.stop is None or all(isinstance(s, str) and s for s in self.stop),
            "stop must be a non-empty string or a list of them",
        )
        check(
            self.stop_token_ids is None or all(_is_int(t) for t in self.stop_token_ids),
            "stop_token_ids must be a list of integers",
        )

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value
