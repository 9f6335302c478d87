"""Per-request sampling parameters, validated on construction (SGLang names)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, fields
from typing import Any

from sglang.srt.constrained.spec import CONSTRAINT_KINDS, normalize_constraint_params

_INT_MAX = 2**31 - 1
MAX_N = 64
# Below this a temperature samples the argmax anyway; dividing by it would overflow the logits.
SAMPLING_EPS = 1e-6
# SGLang's limits on stop patterns.
MAX_STOP_REGEX_COUNT = 32
MAX_STOP_REGEX_BYTES = 256
# SGLang's names for fields that this server keeps under another name.
_ALIASES = {"sampling_seed": "seed"}


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
    # Python regexes searched in the output's tail; the matched text stays in the output.
    stop_regex: str | list[str] | None = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True  # passed to the tokenizer's decode
    seed: int | None = field(default=None)  # SGLang's ``sampling_seed``
    n: int = 1
    stream_interval: int | None = None  # stream every this many tokens (the first at once)
    # Passed to the request's custom logit processor (accepted, and unread, without one).
    custom_params: dict[str, Any] | None = None
    # Accepted when off only: beam search (beam_width > 1) and watermarking are not implemented.
    beam_width: int | None = None
    watermark: dict[str, Any] | None = None
    # Structured output and logit shaping (see sglang.srt.constrained).
    json_schema: str | None = None
    regex: str | None = None
    ebnf: str | None = None
    structural_tag: str | None = None
    logit_bias: dict[int, float] | None = None
    no_stop_trim: bool = False  # keep a matched stop string at the end of the output text
    # Whether the request named max_new_tokens (SGLang checks only a given one against the
    # context length; a default one is cut to what the prompt leaves).
    max_new_tokens_given: bool = field(default=False, init=False, compare=False)

    @classmethod
    def from_dict(cls, params: dict[str, Any] | None) -> SamplingParams:
        if params is not None and not isinstance(params, dict):
            raise ValueError("sampling_params must be an object")
        # null means "the default" (routers re-serialize requests with every field present), and
        # so does an empty constraint (SGLang's rule)
        params = {
            k: v
            for k, v in (params or {}).items()
            if v is not None and not (k in CONSTRAINT_KINDS and v == "")
        }
        for alias, name in _ALIASES.items():
            if alias in params:
                value = params.pop(alias)
                if params.setdefault(name, value) != value:
                    raise ValueError(f"{alias} and {name} differ; give one of them")
        known = {f.name for f in fields(cls) if f.init}
        unknown = set(params) - known
        if unknown:
            raise ValueError(f"unsupported sampling parameter(s): {sorted(unknown)}")
        sp = cls(**params)
        sp.max_new_tokens_given = "max_new_tokens" in params
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
            _is_int(self.min_new_tokens) and 0 <= self.min_new_tokens <= self.max_new_tokens,
            f"min_new_tokens must be an integer in [0, max_new_tokens ({self.max_new_tokens})], "
            f"got {self.min_new_tokens!r}",
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
        for name in ("ignore_eos", "skip_special_tokens", "spaces_between_special_tokens"):
            check(isinstance(getattr(self, name), bool), f"{name} must be a boolean")
        check(
            self.stream_interval is None
            or (_is_int(self.stream_interval) and 1 <= self.stream_interval <= _INT_MAX),
            f"stream_interval must be a positive integer, got {self.stream_interval!r}",
        )
        check(
            self.custom_params is None or isinstance(self.custom_params, dict),
            "custom_params must be an object",
        )
        self._validate_stop_regex()
        self._refuse_unimplemented()

    def _validate_stop_regex(self) -> None:
        patterns = self.stop_regex or []
        if isinstance(patterns, str):
            patterns = [patterns]
        ok = isinstance(patterns, (list, tuple)) and all(isinstance(p, str) and p for p in patterns)
        if not ok:
            raise ValueError("stop_regex must be a non-empty string or a list of them")
        self.stop_regex = list(patterns) or None
        if len(patterns) > MAX_STOP_REGEX_COUNT:
            raise ValueError(f"at most {MAX_STOP_REGEX_COUNT} stop_regex patterns are allowed")
        for pattern in patterns:
            if len(pattern.encode()) > MAX_STOP_REGEX_BYTES:
                raise ValueError(f"a stop_regex pattern is over {MAX_STOP_REGEX_BYTES} bytes")
            try:
                re.compile(pattern)
            except (re.error, RecursionError) as exc:
                raise ValueError(f"invalid stop_regex {pattern!r}: {exc}") from None

    def _refuse_unimplemented(self) -> None:
        """Fields that SGLang defines and this server cannot honour: accepted when off only."""
        width = self.beam_width
        if width is not None and (not _is_int(width) or width < 1):
            raise ValueError(f"beam_width must be a positive integer, got {width!r}")
        if width is not None and width > 1:
            raise ValueError("beam_width > 1 (beam search) is not supported by this server")
        mark = self.watermark
        if mark is not None and not isinstance(mark, dict):
            raise ValueError("watermark must be an object")
        if mark and mark.get("enabled") is True:
            raise ValueError("watermark is not supported by this server")

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
