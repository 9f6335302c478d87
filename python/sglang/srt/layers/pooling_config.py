"""How a checkpoint serves pooled hidden states: the pooling method, normalisation, Matryoshka
dimensions and, for rerankers, the head whose outputs become scores.

Read from the checkpoint: a sentence-transformers ``modules.json`` (its Pooling module's
``config.json`` and a Normalize module), ``config.json``'s ``architectures`` (a
``*ForSequenceClassification`` checkpoint's ``score`` head), vLLM's ``classifier_from_token``
(the logits of those tokens are the head: a yes/no reranker) and ``matryoshka_dimensions`` /
``is_matryoshka``. ``--pooling-method`` overrides the method."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

POOLING_METHODS = ("last", "mean", "cls")
_ST_POOLING = "sentence_transformers.models.Pooling"
_ST_NORMALIZE = "sentence_transformers.models.Normalize"
# sentence-transformers' Pooling config keys, in the order a mixed config is read
_ST_MODES = (
    ("pooling_mode_lasttoken", "last"),
    ("pooling_mode_mean_tokens", "mean"),
    ("pooling_mode_cls_token", "cls"),
)
_HEAD_ARCHITECTURES = ("ForSequenceClassification", "ForRanking")


@dataclass(frozen=True)
class PoolingConfig:
    method: str  # "last", "mean" or "cls"
    normalize: bool  # embeddings leave with unit L2 norm
    # "score": a classification head (weights ``score.*``); "tokens": the LM head's rows of
    # ``head_token_ids``; None: the pooled hidden state itself (an embedding model)
    head: str | None = None
    head_token_ids: tuple[int, ...] = ()
    matryoshka: bool = False  # the model was trained for truncated embeddings
    matryoshka_dimensions: tuple[int, ...] = ()  # the sizes it allows (empty: any)

    @property
    def is_cross_encoder(self) -> bool:
        return self.head is not None

    def check_dimensions(self, dimensions: int | None, hidden_size: int) -> None:
        """Raise ValueError unless ``dimensions`` (the request's ``dimensions``) can be given."""
        if dimensions is None:
            return
        if self.is_cross_encoder or not self.matryoshka:
            raise ValueError(
                "this model does not support Matryoshka embeddings: 'dimensions' cannot be set"
            )
        if not 1 <= dimensions <= hidden_size:
            raise ValueError(f"dimensions must be between 1 and {hidden_size}, got {dimensions}")
        allowed = self.matryoshka_dimensions
        if allowed and dimensions not in allowed:
            raise ValueError(f"dimensions must be one of {list(allowed)}, got {dimensions}")


def is_pooling_checkpoint(model_path: str | None) -> bool:
    """Whether the checkpoint declares that it serves pooled states (without --is-embedding)."""
    if model_path is None:
        return False
    config = _read_json(Path(model_path) / "config.json") or {}
    return (
        _sentence_transformers_pooling(Path(model_path)) is not None
        or _head_kind(config) is not None
    )


def read_pooling_config(
    model_path: str, tokenizer: Any = None, method_override: str | None = None
) -> PoolingConfig:
    """The checkpoint's pooling; ``tokenizer`` turns ``classifier_from_token`` names into ids."""
    root = Path(model_path)
    config = _read_json(root / "config.json") or {}
    head = _head_kind(config)
    st = _sentence_transformers_pooling(root)
    method, normalize = st if st is not None else ("last", head is None)
    if method_override is not None:
        method = method_override
    token_ids: tuple[int, ...] = ()
    if head == "tokens":
        token_ids = _token_ids(config["classifier_from_token"], tokenizer)
    if head is not None and method == "mean":
        raise ValueError("a reranker head pools one token: --pooling-method last or cls")
    dims = config.get("matryoshka_dimensions") or ()
    return PoolingConfig(
        method=method,
        normalize=normalize and head is None,
        head=head,
        head_token_ids=token_ids,
        matryoshka=bool(config.get("is_matryoshka") or dims),
        matryoshka_dimensions=tuple(int(d) for d in dims),
    )


def _head_kind(config: dict[str, Any]) -> str | None:
    if config.get("classifier_from_token"):
        return "tokens"
    architectures = config.get("architectures") or []
    if any(a.endswith(_HEAD_ARCHITECTURES) for a in architectures):
        return "score"
    return None


def _sentence_transformers_pooling(root: Path) -> tuple[str, bool] | None:
    """(method, normalize) from ``modules.json`` and its Pooling module; None without one."""
    modules = _read_json(root / "modules.json")
    if not isinstance(modules, list):
        return None
    pooling = next((m for m in modules if m.get("type") == _ST_POOLING), None)
    if pooling is None:
        return None
    settings = _read_json(root / pooling.get("path", "") / "config.json") or {}
    method = next((name for key, name in _ST_MODES if settings.get(key)), None)
    if method is None:
        raise ValueError(
            f"{pooling.get('path')}/config.json: a pooling mode other than last token, mean or "
            "CLS is not served"
        )
    normalize = any(m.get("type") == _ST_NORMALIZE for m in modules)
    return method, normalize


def _token_ids(names: list[str], tokenizer: Any) -> tuple[int, ...]:
    if tokenizer is None:
        raise ValueError("classifier_from_token needs the tokenizer")
    ids = []
    for name in names:
        token_id = tokenizer.convert_tokens_to_ids(name)
        if token_id is None or token_id == tokenizer.unk_token_id:
            encoded = tokenizer.encode(name, add_special_tokens=False)
            if len(encoded) != 1:
                raise ValueError(f"classifier_from_token {name!r} is not one token")
            token_id = encoded[0]
        ids.append(int(token_id))
    return tuple(ids)


def _read_json(path: Path) -> Any:
    if not path.is_file():
        return None
    with open(path) as f:
        return json.load(f)
