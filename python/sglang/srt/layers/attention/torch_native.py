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
    """One request of the batch: its queries are tokens [prefix, prefix + q_len) of a sequence
    whose KV sits at ``kv_indices``; ``spans`` are image spans attended bidirectionally."""

    q_start: int
    q_len: int
    prefix: int
    kv_indices: torch.Tensor
    spans: list[tuple[int, int]]
    dtype: torch.dtype
    masks: dict[int | None, torch.Tensor | None] = field(default_factory=dict)

    @property
    def seq_len(self) -> int:
        return self.prefix + self.q_len

    def is_plain_causal(self, sliding_window: int | None) -> bool:
        return not self.spans and (sliding_window is None or sliding_window >= self.seq_len)

    def mask(self, sliding_window: int | None) -> torch.Tensor | None:
        """Additive mask (0 / -inf) in the model dtype, built once per batch and window: SDPA's
        fused CPU kernel takes it as is, while a boolean mask is converted on every call."""
        if self.is_plain_causal(sliding_window):
            sliding_window = None
            if self.q_len == 1:
                return None
        if sliding_window not in self.masks:
            device = self.kv_indices.device
            q_pos = torch.arange(self.prefix, self.seq_len, device=device)[:, None]
            kv_pos = torch.arange(self.seq_len, device=device)[None, :]
            allowed = kv_pos <= q_pos
            for start, end in self.spans:
                if start < self.seq_len and end > self.prefix:
                    allowed |= (q_pos >= start) & (q_pos < end) & (kv_pos >= start) & (kv_pos < end)
            if sliding_window is not None:
                allowed &= kv_pos > q_pos - sliding_window
            mask = torch.zeros(allowed.shape, dtype=self.dtype, device=device)
            self.masks[sliding_window] = mask.masked_fill_(~allowed, float("-inf"))
        return self.masks[sliding_window]


class TorchNativeAttnBackend(AttentionBackend):
    def __init__(self, kv_pool: KVPool, req_to_token_pool: ReqToTokenPool) -> None:
        self.kv_pool = kv_pool
        self.req_to_token = req_to_token_pool.req_to_token
        self._reqs: list[_ReqAttn] = []

    def prepare_metadata(self, batch: ForwardBatch) -> None:
        self._reqs = []
        q_start = 0
        for row, prefix, extend, spans in zip(
            batch.req_pool_indices, batch.prefix_lens, batch.extend_lens, batch.bidirectional_spans
        ):
            kv_indices = self.req_to_token[row, : prefix + extend]
            self._reqs.append(
                _ReqAttn(q_start, extend, prefix, kv_indices, spans, self.kv_pool.dtype)
            )
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
            if softcap:
                oi = _softcapped_attention(qi, ki, vi, r.mask(sliding_window), scaling, softcap)
            elif r.q_len > 1 and q.device.type == "cpu" and r.is_plain_causal(sliding_window):
                oi = _causal_after_prefix(qi, ki, vi, r.prefix, scaling)
            else:
                oi = F.scaled_dot_product_attention(
                    qi,
                    ki,
                    vi,
                    attn_mask=r.mask(sliding_window),
                    scale=scaling,
                    enable_gqa=ki.shape[1] != qi.shape[1],
                )
            out[r.q_start : r.q_start + r.q_len] = oi[0].transpose(0, 1)
        return out.unsqueeze(0)


def _causal_after_prefix(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, prefix: int, scaling: float
) -> torch.Tensor:
    """Queries at positions [prefix, prefix + n) see every prefix key and their own chunk
    causally. Two fused CPU flash calls (prefix: unmasked; chunk: causal) merged by their
    log-sum-exp, so no (n x seq_len) mask is built or read."""
    groups = q.shape[1] // k.shape[1]
    if groups > 1:
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    out_new, lse_new = flash(q, k[:, :, prefix:], v[:, :, prefix:], 0.0, True, scale=scaling)
    if prefix == 0:
        return out_new
    out_old, lse_old = flash(q, k[:, :, :prefix], v[:, :, :prefix], 0.0, False, scale=scaling)
    top = torch.maximum(lse_old, lse_new)
    w_old, w_new = torch.exp(lse_old - top), torch.exp(lse_new - top)
    merged = out_old * w_old.unsqueeze(-1) + out_new * w_new.unsqueeze(-1)
    return merged / (w_old + w_new).unsqueeze(-1)


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
