"""SGLang's custom logit processors: a client subclasses ``CustomLogitProcessor``, sends
``MyProcessor.to_str()`` as a request's ``custom_logit_processor``, and the scheduler calls it
on that request's logits row (after ``logit_bias`` and grammar masks, before sampling) with the
request's ``custom_params``. The string is a dill pickle, i.e. code the server runs: requests
may carry one only when the server starts with ``--enable-custom-logit-processor``."""

from __future__ import annotations

import functools
import json
from abc import ABC, abstractmethod
from typing import Any

import torch


class CustomLogitProcessor(ABC):
    @abstractmethod
    def __call__(
        self, logits: torch.Tensor, custom_param_list: list[dict[str, Any]] | None = None
    ) -> torch.Tensor:
        """``logits``: (rows, vocab), the rows of the requests naming this processor; returns
        the rows to sample from (may modify ``logits`` in place and return it)."""

    @classmethod
    def to_str(cls) -> str:
        import dill

        # recurse: the globals its methods read travel with it, not a module the server lacks
        return json.dumps({"callable": dill.dumps(cls, recurse=True).hex()})

    @staticmethod
    @functools.lru_cache(maxsize=64)
    def from_str(text: str) -> CustomLogitProcessor:
        import dill

        try:
            cls = dill.loads(bytes.fromhex(json.loads(text)["callable"]))
        except Exception as exc:
            raise ValueError(f"custom_logit_processor cannot be loaded: {exc}") from exc
        processor = cls()
        if not callable(processor):
            raise ValueError("custom_logit_processor is not a callable class")
        return processor


class DisallowedTokensLogitsProcessor(CustomLogitProcessor):
    """Bans ``custom_params["token_ids"]`` (the example SGLang ships)."""

    def __call__(
        self, logits: torch.Tensor, custom_param_list: list[dict[str, Any]] | None = None
    ) -> torch.Tensor:
        for row, params in enumerate(custom_param_list or []):
            ids = (params or {}).get("token_ids") or []
            logits[row, ids] = float("-inf")
        return logits


def apply_custom_processors(
    logits: torch.Tensor, processors: list[str | None], params: list[dict[str, Any] | None]
) -> dict[int, str]:
    """Run each request's processor (``processors[i]`` for row i; None: none) on its rows of
    ``logits``, in place, one call per distinct processor. Returns the rows whose processor
    failed, with why (their requests fail alone)."""
    failed: dict[int, str] = {}
    groups: dict[str, list[int]] = {}
    for row, text in enumerate(processors):
        if text is not None:
            groups.setdefault(text, []).append(row)
    for text, rows in groups.items():
        try:
            processor = CustomLogitProcessor.from_str(text)
            index = torch.tensor(rows, dtype=torch.int64)
            out = processor(logits[index], [dict(params[r] or {}) for r in rows])
            if not isinstance(out, torch.Tensor) or out.shape != (len(rows), logits.shape[-1]):
                raise ValueError("it must return a (rows, vocab) tensor")
            logits[index] = out.to(logits.dtype)
        except Exception as exc:
            failed.update({r: f"custom_logit_processor failed: {exc}" for r in rows})
    return failed
