"""Attention on torch SDPA over the engine's KV pool: any device, one request at a time."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from sglang.srt.layers.attention.base import AttentionBackend

if TYPE_CHECKING:
    from sglang.srt.mem_cache.memory_pool import KVPool, ReqToTokenPool
    from sglang.srt.model_executor.forward_batch import ForwardBatch


@dataclass
class _ReqAttn:
    q_start: int
    q_len: int
    kv_indices: torch.Tensor
    q_pos: torch.Tensor  # (q_len,) absolute positions of the queries
    kv_pos: torch.Tensor  # (seq_len,)
    allowed: torch.Tensor | None  # (q_len, seq_len) bool; None = attend to everything
    dtype: torch.dtype
    masks: dict[int | None, torch.Tensor | None] = field(default_factory=dict)

    def mask(self, sliding_window: int | None) -> torch.Tensor | None:
        """Additive mask (0 / -inf) in the model dtype, built once per batch and window: SDPA's
        fused CPU kernel takes it as is, while a boolean mask is converted on every call."""
        if sliding_window is not None and self.kv_pos.numel() <= 1:
            sliding_window = None
        if sliding_window not in self.masks:
            allowed = self.allowed
            if sliding_window is not None:
                in_window = self.kv_pos[None, :] > self.q_pos[:, None] - sliding_window
                allowed = in_window if allowed is None else allowed & in_window
            self.masks[sliding_window] = None if allowed is None else _additive(allowed, self.dtype)
        return self.masks[sliding_window]


def _additive(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill(
        ~allowed, float("-inf")
    )


class TorchNativeAttnBackend(AttentionBackend):
    def __init__(self, kv_pool: KVPool, req_to_token_pool: ReqToTokenPool) -> None:
        self.kv_pool = kv_pool
        self.req_to_token = req_to_token_pool.req_to_token
        self._reqs: list[_ReqAttn] = []

    def prepare_metadata(self, batch: ForwardBatch) -> None:
        device, dtype = self.kv_pool.device, self.kv_pool.dtype
        self._reqs = []
        q_start = 0
        for row, prefix, extend, spans in zip(
            batch.req_pool_indices, batch.prefix_lens, batch.extend_lens, batch.bidirectional_spans
        ):
            seq_len = prefix + extend
            q_pos = torch.arange(prefix, seq_len, device=device)
            kv_pos = torch.arange(seq_len, device=device)
            mask = None
            if extend > 1 or spans:
                mask = kv_pos[None, :] <= q_pos[:, None]
                for start, end in spans:
                    if start < seq_len and end > prefix:
                        q_in = (q_pos >= start) & (q_pos < end)
                        kv_in = (kv_pos >= start) & (kv_pos < end)
                        mask |= q_in[:, None] & kv_in[None, :]
            kv_indices = self.req_to_token[row, :seq_len]
            self._reqs.append(_ReqAttn(q_start, extend, kv_indices, q_pos, kv_pos, mask, dtype))
            q_start += extend

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer: int,
        batch: ForwardBatch,
        *,
        scaling: float,
        sliding_window: int | None = None,
        softcap: float | None = None,
    ) -> torch.Tensor:
        pool = self.kv_pool
        pool.set_kv(layer, batch.out_cache_loc, k[0].transpose(0, 1), v[0].transpose(0, 1))
        k_buf, v_buf = pool.k_buffer[layer], pool.v_buffer[layer]
        out = q.new_empty(q.shape[2], q.shape[1], q.shape[3])
        for r in self._reqs:
            qi = q[:, :, r.q_start : r.q_start + r.q_len]
            ki = k_buf[r.kv_indices].transpose(0, 1).unsqueeze(0).to(q.dtype)
            vi = v_buf[r.kv_indices].transpose(0, 1).unsqueeze(0).to(q.dtype)
            mask = r.mask(sliding_window)
            if softcap:
                oi = _softcapped_attention(qi, ki, vi, mask, scaling, softcap)
            else:
                oi = F.scaled_dot_product_attention(
                    qi, ki, vi, attn_mask=mask, scale=scaling, enable_gqa=ki.shape[1] != qi.shape[1]
                )
            out[r.q_start : r.q_start + r.q_len] = oi[0].transpose(0, 1)
        return out.unsqueeze(0)


def _softcapped_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    scaling: float,
    softcap: float,
) -> torch.Tensor:
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    scores = torch.matmul(q, k.transpose(2, 3)) * scaling
    scores = torch.tanh(scores / softcap) * softcap
    if mask is not None:
        scores = scores + mask
    probs = torch.softmax(scores.float(), dim=-1).to(q.dtype)
    return torch.matmul(probs, v)
