"""Per-request sampling parameters, validated on construction (SGLang names)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any

from sglang.srt.constrained.spec import normalize_constraint_params

_INT_MAX = 2**31 - 1
MAX_N = 64
# Below this a temperature samples the argmax anyway; dividing by it would overflow the logits.
SAMPLING_EPS = 1e-6
# Accepted with their default value only (what clients and routers send by default).
_DEFAULT_ONLY = {"spaces_between_special_tokens": True}


@dataclass
class SamplingParams:
    max_new_tokens: int = 128
    min_new_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
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
        if params is not None and not isinstance(params, dict):
            raise ValueError("sampling_params must be an object")
        # null means "the default" (routers re-serialize requests with every field present)
        params = {k: v for k, v in (params or {}).items() if v is not None}
        for name, default in _DEFAULT_ONLY.items():
            if name in params and params.pop(name) != default:
                raise ValueError(f"sampling parameter {name!r} is not supported")
        known = {f.name for f in fields(cls)}
        unknown = set(params) - known
        if unknown:
            raise ValueError(f"unsupported sampling parameter(s): {sorted(unknown)}")
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
            _is_int(self.min_new_tokens) and 0 <= self.min_new_tokens <= _INT_MAX,
            f"min_new_tokens must be a non-negative integer, got {self.min_new_tokens!r}",
        )
        check(
            _is_finite(self.temperature) and self.temperature >= 0,
            f"temperature must be a finite number >= 0, got {self.temperature!r}",
        )
        check(
            _is_finite(self.top_p) and 0 < self.top_p <= 1,
            f"top_p must be in (0, 1], got {self.top_p!r}",
        )
        check(
            _is_int(self.top_k) and (self.top_k == -1 or 1 <= self.top_k <= _INT_MAX),
            f"top_k must be -1 (disabled) or >= 1, got {self.top_k!r}",
        )
        check(
            _is_finite(self.min_p) and 0 <= self.min_p <= 1,
            f"min_p must be in [0, 1], got {self.min_p!r}",
        )
        for name in ("frequency_penalty", "presence_penalty"):
            value = getattr(self, name)
            check(
                _is_finite(value) and -2 <= value <= 2,
                f"{name} must be in [-2, 2], got {value!r}",
            )
        check(
            _is_finite(self.repetition_penalty) and 0 < self.repetition_penalty <= 2,
            f"repetition_penalty must be in (0, 2], got {self.repetition_penalty!r}",
        )
        check(
            _is_int(self.n) and 1 <= self.n <= MAX_N, f"n must be in [1, {MAX_N}], got {self.n!r}"
        )
        check(isinstance(self.no_stop_trim, bool), "no_stop_trim must be a boolean")
        normalize_constraint_params(self)
        check(
            self.seed is None or (_is_int(self.seed) and -(2**63) <= self.seed < 2**64),
            f"seed must be a 64-bit integer, got {self.seed!r}",
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
        check(isinstance(self.ignore_eos, bool), "ignore_eos must be a boolean")
        check(isinstance(self.skip_special_tokens, bool), "skip_special_tokens must be a boolean")

    @property
    def is_greedy(self) -> bool:
        return self.temperature < SAMPLING_EPS or self.top_k == 1

    @property
    def has_penalties(self) -> bool:
        return bool(
            self.frequency_penalty or self.presence_penalty or self.repetition_penalty != 1.0
        )


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
