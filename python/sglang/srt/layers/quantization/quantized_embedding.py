"""Token embedding tables in int8 per row: a table of its own (``quantize_embedding``), or the
rows of a tied head's int8 codes (``serve_lookups_from_head``)."""

from __future__ import annotations

import functools
import types

import torch
from torch import nn

from sglang.srt.layers.quantization.base import stand_in
from sglang.srt.layers.quantization.packed_linear import panel_rows
from sglang.srt.layers.quantization.quant_layouts import quantize_int8
from sglang.srt.layers.quantization.quantized_linear import QuantizedLinear


def quantize_embedding(embedding: nn.Module) -> bool:
    """Store a plain ``nn.Embedding``'s table in int8 per row (``quantize_int8``: a row is one
    token's vector, so its scale is the row's), in place; returns whether it did. A lookup
    returns the rows as the table would hold them dequantized (each value ``scale * q``
    rounded once to the table's dtype). The ``weight`` keeps its shape, dtype and device over a
    one-element storage (HF code reads them). Subclasses (Gemma's scaled embeddings), tables
    with ``max_norm`` and tables another module shares (a tied LM head) are left as they are."""
    weight = getattr(embedding, "weight", None)
    if type(embedding) is not nn.Embedding or embedding.max_norm is not None:
        return False
    if weight is None or weight.device.type != "cpu" or not weight.is_floating_point():
        return False
    q, scale = quantize_int8(weight)
    embedding.register_buffer("qweight", q)
    embedding.register_buffer("scale", scale)
    weight.data = stand_in(weight)
    embedding.forward = types.MethodType(_quantized_lookup, embedding)
    return True


def _quantized_lookup(self: nn.Embedding, ids: torch.Tensor) -> torch.Tensor:
    rows = self.qweight[ids].double() * self.scale[ids].double()[..., None]  # exact
    return rows.to(self.weight.dtype)


def serve_lookups_from_head(embedding: nn.Embedding, head: QuantizedLinear) -> None:
    """``embedding``'s lookups read rows of ``head``'s int8 codes, and its own table goes: for a
    table tied to the head, quantized per output channel (one token's row), whose codes and
    scales are those ``quantize_embedding`` would give the table."""
    assert head.bits == 8  # int8dq's quads are read per column as the pairs are
    embedding.weight.data = stand_in(embedding.weight)
    embedding.forward = functools.partial(_lookup_in_head, embedding, head)


def _lookup_in_head(embedding: nn.Embedding, head: QuantizedLinear, ids: torch.Tensor):
    codes = panel_rows(head.qweight, ids)[..., : head.in_features]
    rows = codes.double() * head.scale[ids].double()[..., None]  # exact
    return rows.to(embedding.weight.dtype)
