"""The pooling side of a model runner: the checkpoint's ``PoolingConfig`` and the head that a
reranker's pooled hidden state goes through (its ``score`` linear, read from the checkpoint's
safetensors beside the model transformers loads, or the LM head's rows of named tokens)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from sglang.srt.layers.pooler import Head
from sglang.srt.layers.pooling_config import PoolingConfig, read_pooling_config

logger = logging.getLogger(__name__)

SCORE_PREFIX = "score."


def build_pooling(
    model_path: str,
    method: str | None,
    tokenizer: Any,
    logits: Callable[[torch.Tensor], torch.Tensor],
    dtype: torch.dtype,
    device: str,
) -> tuple[PoolingConfig, Head | None]:
    """The pooling config and its head; ``logits`` maps hidden rows to the LM's logits."""
    config = read_pooling_config(model_path, tokenizer, method)
    logger.info("pooling: %s, normalize %s, head %s", config.method, config.normalize, config.head)
    if config.head == "tokens":
        ids = list(config.head_token_ids)
        return config, lambda rows: logits(rows)[:, ids]
    if config.head == "score":
        return config, score_head(model_path, dtype, device)
    return config, None


def score_head(model_path: str, dtype: torch.dtype, device: str) -> Head:
    """The ``score`` linear of a ``*ForSequenceClassification`` checkpoint."""
    tensors = _score_tensors(Path(model_path))
    if "weight" not in tensors:
        raise ValueError(f"{model_path}: a sequence-classification checkpoint without score.weight")
    weight = tensors["weight"].to(device=device, dtype=dtype)
    bias = tensors.get("bias")
    bias = bias.to(device=device, dtype=dtype) if bias is not None else None
    return lambda rows: torch.nn.functional.linear(rows, weight, bias)


def _score_tensors(root: Path) -> dict[str, torch.Tensor]:
    from safetensors import safe_open

    found: dict[str, torch.Tensor] = {}
    for path in sorted(root.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as f:
            for key in f.keys():
                name = key.rsplit(".", 2)
                if key.startswith(SCORE_PREFIX) or key.endswith((".score.weight", ".score.bias")):
                    found[name[-1]] = f.get_tensor(key)
    return found
