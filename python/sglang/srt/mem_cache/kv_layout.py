"""Which decoder layers keep per-token KV in the pool, with what shape, read by which layers.

Most models: every decoder layer keeps KV of one shape. Exceptions, all read from the text config:
- hybrid models: ``linear_attention`` (Qwen3.5) and ``conv`` (LFM2 / LFM3 short convolution)
  layers keep fixed-size state instead;
- Gemma 4: full-attention layers have their own head dim and KV head count
  (``per_layer_config``), and the last ``num_kv_shared_layers`` layers keep no KV: each reads the
  KV of the last earlier layer of its type (``kv_sharing_modes``: "reuse" reads, "store" is read).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

LINEAR_ATTENTION = "linear_attention"
STATE_LAYER_TYPES = (LINEAR_ATTENTION, "conv")  # layers without per-token KV


@dataclass(frozen=True)
class KVLayout:
    """``shapes[i]`` is (kv_heads, head_dim) of pool layer i; ``pool_layer[layer]`` is the pool
    layer that decoder layer ``layer`` reads; the decoder layers in ``shared`` read another
    layer's KV and write none."""

    shapes: tuple[tuple[int, int], ...]
    pool_layer: dict[int, int]
    shared: frozenset[int]

    @classmethod
    def of(cls, text_config: Any) -> KVLayout:
        types = list(getattr(text_config, "layer_types", None) or [])
        num_layers = int(text_config.num_hidden_layers)
        attention = [i for i in range(num_layers) if not types or types[i] not in STATE_LAYER_TYPES]
        source = _kv_sources(text_config, types, attention)
        owners = [i for i in attention if source[i] == i]
        index = {layer: n for n, layer in enumerate(owners)}
        return cls(
            shapes=tuple(_kv_shape(text_config, i) for i in owners),
            pool_layer={i: index[source[i]] for i in attention},
            shared=frozenset(i for i in attention if source[i] != i),
        )

    def bytes_per_token(self, dtype: torch.dtype) -> int:
        element = torch.empty(0, dtype=dtype).element_size()
        return 2 * sum(heads * dim for heads, dim in self.shapes) * element


def _kv_shape(text_config: Any, layer: int) -> tuple[int, int]:
    per_layer = getattr(text_config, "per_layer_config", None)
    config = per_layer[layer] if per_layer is not None else text_config
    heads = getattr(config, "num_key_value_heads", None) or text_config.num_attention_heads
    dim = getattr(config, "head_dim", None)
    dim = dim or text_config.hidden_size // text_config.num_attention_heads
    return int(heads), int(dim)


def _kv_sources(text_config: Any, types: list[str], attention: list[int]) -> dict[int, int]:
    """Decoder layer -> the layer whose KV it reads (itself unless it shares)."""
    shared = int(getattr(text_config, "num_kv_shared_layers", 0) or 0)
    source = {i: i for i in attention}
    if not shared:
        return source
    first_shared = int(text_config.num_hidden_layers) - shared
    for layer in attention:
        if layer >= first_shared:
            owners = [i for i in attention if i < first_shared and types[i] == types[layer]]
            if not owners:
                raise ValueError(f"layer {layer} shares KV but no earlier layer has its type")
            source[layer] = owners[-1]
    return source
