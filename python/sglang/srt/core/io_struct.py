"""Messages between the API process (tokenizer) and the scheduler process."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sglang.srt.core.finish import FinishReason
from sglang.srt.core.mm_item import MultimodalItem
from sglang.srt.sampling.sampling_params import SamplingParams

MAX_TOKEN_IDS_LOGPROB = 64  # token ids whose logprobs one request may ask for at each position


@dataclass
class SchedulerReady:
    """What the scheduler process reports once its model is loaded (a light module: the API
    process unpickles it without importing the engine)."""

    context_length: int
    max_total_tokens: int
    is_multimodal: bool
    model_type: str


@dataclass
class TokenizedRequest:
    """A validated, tokenized request: what the scheduler needs to run it."""

    rid: str
    input_ids: list[int]
    sampling_params: SamplingParams
    mm_items: list[MultimodalItem] = field(default_factory=list)
    return_logprob: bool = False
    top_logprobs_num: int = 0  # alternatives per output token, with return_logprob
    # With return_logprob: logprobs of the prompt tokens from this position on (-1: none).
    logprob_start_len: int = -1
    return_text_in_logprobs: bool = False  # logprob entries carry their token's text
    # With return_logprob: the logprobs of these token ids at every position (SGLang's
    # ``token_ids_logprob``), in this order.
    token_ids_logprob: list[int] | None = None
    # SGLang's ``cache_salt``: only requests with the same salt share prefix-cache entries.
    cache_salt: str | None = None
    # A serialized ``CustomLogitProcessor`` (only with --enable-custom-logit-processor).
    custom_logit_processor: str | None = None
    # SGLang's ``require_reasoning``: the output starts inside a reasoning block (counted in
    # ``meta_info.reasoning_tokens`` up to its end tag).
    require_reasoning: bool = False
    # A prompt-only request answered with its pooled hidden states (an embedding or a score).
    pooling: bool = False

    def ask_logprobs(
        self, top: int | None, start_len: int = -1, token_ids: list[int] | None = None
    ) -> None:
        """Return the output tokens' logprobs with ``top`` alternatives each (None: no logprobs
        at all), the prompt's from ``start_len`` on (-1: none), and at each position those of
        ``token_ids``."""
        self.return_logprob = top is not None
        self.top_logprobs_num = top or 0
        self.logprob_start_len = start_len if top is not None else -1
        self.token_ids_logprob = (token_ids or None) if top is not None else None

    def validate_logprobs(self, vocab_size: int) -> None:
        """Raise ValueError for a prompt logprob start or token ids that cannot be answered."""
        if self.logprob_start_len < -1:
            raise ValueError(f"logprob_start_len must be -1 or more, got {self.logprob_start_len}")
        ids = self.token_ids_logprob or []
        if len(ids) > MAX_TOKEN_IDS_LOGPROB:
            raise ValueError(
                f"token_ids_logprob names {len(ids)} tokens, at most {MAX_TOKEN_IDS_LOGPROB}"
            )
        bad = [t for t in ids if not (isinstance(t, int) and 0 <= t < vocab_size)]
        if bad:
            raise ValueError(
                f"token_ids_logprob names {bad[0]!r}, outside the vocabulary [0, {vocab_size})"
            )

    def validate(
        self, vocab_size: int, image_token_id: int | None, video_token_id: int | None = None
    ) -> None:
        """Raise ValueError unless every token id is in the vocabulary and the image (video)
        placeholder tokens are exactly the spans of the request's images (videos)."""
        self.validate_logprobs(vocab_size)
        ids = self.input_ids
        if ids and (min(ids) < 0 or max(ids) >= vocab_size):
            bad = next(t for t in ids if not 0 <= t < vocab_size)
            raise ValueError(f"token id {bad} is outside the vocabulary [0, {vocab_size})")
        tokens: dict[int, list[str]] = {}
        for modality, token_id in (("image", image_token_id), ("video", video_token_id)):
            if token_id is not None:
                tokens.setdefault(token_id, []).append(modality)
        for token_id, modalities in tokens.items():
            self._validate_placeholders(modalities, token_id)

    def _validate_placeholders(self, modalities: list[str], token_id: int) -> None:
        """``modalities`` share the placeholder token ``token_id`` (GLM-4.1V and InternVL write
        video frames with the image token)."""
        ids = self.input_ids
        items = [item for item in self.mm_items if item.modality in modalities]
        found = ids.count(token_id)
        expected = sum(item.num_tokens for item in items)
        name = " / ".join(modalities)
        if found != expected:
            given = f"its {name}s need {expected}" if items else f"no {name} was given"
            raise ValueError(
                f"the prompt has {found} {name} placeholder token(s) but {given}: "
                f"{name} placeholders must come with their {name}s"
            )
        for item in items:
            for start, end in item.spans:
                if not (0 <= start < end <= len(ids)) or any(t != token_id for t in ids[start:end]):
                    raise ValueError(f"{item.modality} placeholder spans do not match the prompt")


@dataclass
class AbortRequest:
    rid: str


@dataclass
class RpcRequest:
    """A control call answered by one ``RpcResponse`` with the same ``call_id``."""

    call_id: int
    # "server_info" | "load" | "flush_cache" | "check_integrity" | "pause_generation" |
    # "continue_generation"
    method: str


@dataclass
class RpcResponse:
    call_id: int
    result: Any = None
    error: str | None = None


@dataclass
class RequestOutput:
    """New tokens of one request since its previous output."""

    rid: str
    new_token_ids: list[int]
    new_logprobs: list[float]
    finish_reason: FinishReason | None
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    new_top_logprobs: list[list[tuple[float, int]]] = field(default_factory=list)
    # Sent with a request's first output when it asked for prompt logprobs.
    input_logprobs: list[float | None] | None = None
    input_top_logprobs: list[list[tuple[float, int]] | None] | None = None
    new_token_ids_logprobs: list[list[tuple[float, int]]] = field(default_factory=list)
    input_token_ids_logprobs: list[list[tuple[float, int]] | None] | None = None
    # Sent with a finished request's last output: ``Req.mm_report()``.
    mm_items: list[dict[str, Any]] | None = None
    # A pooling request's pooled vector (or its head's outputs), with its last output.
    embedding: list[float] | None = None

    @classmethod
    def failed(
        cls, rid: str, message: str, status_code: int, prompt_tokens: int = 0
    ) -> RequestOutput:
        """The one output of a request that ends in an error (the API answers ``status_code``)."""
        return cls(rid, [], [], FinishReason.error(message, status_code), prompt_tokens, 0, 0)


TokenText = Callable[[int], str]


def one_per_request(value: Any, n: int, is_one: Callable[[Any], bool], what: str) -> list:
    """A request field given once for all ``n`` requests of a call (``is_one(value)``), or as a
    list of one per request (each ``is_one`` or None)."""
    if is_one(value):
        return [value] * n
    if not isinstance(value, list) or not all(v is None or is_one(v) for v in value):
        raise ValueError(f"{what}: give one for all prompts, or a list of one per prompt")
    if len(value) != n:
        raise ValueError(f"{what} has {len(value)} entries for {n} prompts")
    return list(value)


def token_ids_per_request(value: list[int] | list[list[int]] | None, n: int) -> list:
    """SGLang's ``token_ids_logprob`` for each of ``n`` requests (an empty list is none)."""
    if not value:
        return [None] * n
    ids = one_per_request(value, n, _is_token_ids, "token_ids_logprob (a list of token ids)")
    return [one or None for one in ids]


def _is_token_ids(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(t, int) for t in value)


CUSTOM_PROCESSOR_OFF = (
    "The server is not configured to enable custom logit processor. Please set "
    "`--enable-custom-logit-processor` to enable this feature."
)


def processors_per_request(
    value: str | list[str | None] | None, n: int, enabled: bool
) -> list[str | None]:
    """SGLang's ``custom_logit_processor`` for each of ``n`` requests (the JSON of
    ``CustomLogitProcessor.to_str()``); refused unless the server enables them."""
    if value is None or value == []:
        return [None] * n
    if not enabled:
        raise ValueError(CUSTOM_PROCESSOR_OFF)
    what = "custom_logit_processor (CustomLogitProcessor.to_str()'s JSON)"
    return one_per_request(value, n, _is_processor_text, what)


def _is_processor_text(value: Any) -> bool:
    """The shape of ``CustomLogitProcessor.to_str()`` (checked here without unpickling)."""
    try:
        bytes.fromhex(json.loads(value)["callable"])
    except (TypeError, ValueError, KeyError):
        return False
    return True


def salts_per_request(value: str | list[str] | None, n: int) -> list[str | None]:
    """SGLang's ``cache_salt`` for each of ``n`` requests (an empty salt is none)."""
    if value is None:
        return [None] * n
    salts = one_per_request(value, n, lambda v: isinstance(v, str), "cache_salt")
    return [v or None for v in salts]


def output_logprob_meta(
    request: Any,
    output_ids: list[int],
    output_logprobs: list[float],
    output_top_logprobs: list[list[tuple[float, int]]],
    text: TokenText | None = None,
    output_token_ids_logprobs: list[list[tuple[float, int]]] | None = None,
) -> dict[str, Any]:
    """SGLang's ``meta_info`` fields for the output logprobs of ``request`` (a TokenizedRequest
    or a Req): ``(logprob, token id, token text or None)`` per token, and per position lists
    of those entries for its top alternatives and for its ``token_ids_logprob``."""
    meta: dict[str, Any] = {"output_token_logprobs": _entries(output_logprobs, output_ids, text)}
    if request.top_logprobs_num:
        meta["output_top_logprobs"] = [_top_entries(top, text) for top in output_top_logprobs]
    if request.token_ids_logprob:
        rows = output_token_ids_logprobs or []
        meta["output_token_ids_logprobs"] = [_top_entries(row, text) for row in rows]
    return meta


def input_logprob_meta(
    request: Any,
    input_logprobs: list[float | None],
    input_top_logprobs: list[list[tuple[float, int]] | None],
    text: TokenText | None = None,
    input_token_ids_logprobs: list[list[tuple[float, int]] | None] | None = None,
) -> dict[str, Any]:
    """The same for the prompt's tokens from ``logprob_start_len`` on (the first prompt token
    has no logprob: None)."""
    prompt = request.input_ids[max(request.logprob_start_len, 0) :]
    meta: dict[str, Any] = {"input_token_logprobs": _entries(input_logprobs, prompt, text)}
    if request.top_logprobs_num:
        meta["input_top_logprobs"] = [_top_entries(top, text) for top in input_top_logprobs]
    if request.token_ids_logprob:
        rows = input_token_ids_logprobs or []
        meta["input_token_ids_logprobs"] = [_top_entries(row, text) for row in rows]
    return meta


def logprob_meta(request: Any, output: dict[str, Any], prompt: dict[str, Any]) -> dict[str, Any]:
    """The logprob fields of ``meta_info`` as SGLang answers them: all of its keys, empty when
    nothing was asked of them (no prompt logprobs), plus ``output_token_logprobs_length``.
    The output lists are copies: an event's meta must not grow with the request's later
    outputs (a stream reader that lags behind would send those tokens' logprobs early and
    later text without any)."""
    meta: dict[str, Any] = {"input_token_logprobs": [], "output_token_logprobs": []}
    if request.top_logprobs_num:
        meta |= {"input_top_logprobs": [], "output_top_logprobs": []}
    if request.token_ids_logprob:
        meta |= {"input_token_ids_logprobs": [], "output_token_ids_logprobs": []}
    meta |= {key: list(entries) for key, entries in output.items()}
    meta |= prompt
    meta["output_token_logprobs_length"] = len(meta["output_token_logprobs"])
    return meta


def _entries(logprobs: list, ids: list[int], text: TokenText | None) -> list[tuple]:
    if text is None:
        return [(lp, tok, None) for lp, tok in zip(logprobs, ids)]
    return [(lp, tok, text(tok)) for lp, tok in zip(logprobs, ids)]


def _top_entries(top: list[tuple[float, int]] | None, text: TokenText | None) -> list | None:
    if top is None:
        return None
    return _entries([lp for lp, _ in top], [tok for _, tok in top], text)


@dataclass
class BatchOutput:
    outputs: list[RequestOutput]
