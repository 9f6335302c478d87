"""Attention on torch SDPA over the engine's KV pool: any device, one request at a time."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from sglang.srt.core.perf_counters import causal_attention_flops, causal_keys_seen
from sglang.srt.layers.attention.base import AttentionBackend

if TYPE_CHECKING:
    from sglang.srt.core.forward_batch import ForwardBatch
    from sglang.srt.mem_cache.memory_pool import KVPool, ReqToTokenPool


# A run of contiguous KV slots shorter than this is gathered rather than read as a view (every
# view costs one more flash call and merge); at most MAX_VIEW_RUNS views per request.
MIN_VIEW_RUN = 64
MAX_VIEW_RUNS = 16


@dataclass
class _KVLayout:
    """Where a request's keys sit in the pool, for ``_causal_over_pool``.

    ``runs`` (slot ranges, read as views) and ``rest`` (slots to gather) hold the keys that every
    query sees without a mask; ``chunk`` holds the chunk's own keys, attended causally (a slot
    range or slots), or is None when the chunk is a single query (its key is then in the
    unmasked set)."""

    runs: list[tuple[int, int]]
    rest: torch.Tensor | None
    chunk: tuple[int, int] | torch.Tensor | None

    @classmethod
    def of(cls, kv_indices: torch.Tensor, prefix: int, q_len: int) -> _KVLayout:
        unmasked = prefix + q_len if q_len == 1 else prefix
        runs, rest = _split_runs(kv_indices[:unmasked])
        chunk = None
        if q_len > 1:
            chunk_runs, chunk_rest = _split_runs(kv_indices[prefix:], min_run=q_len)
            chunk = chunk_runs[0] if chunk_runs else chunk_rest
        return cls(runs, rest, chunk)


def _split_runs(
    slots: torch.Tensor, min_run: int | None = None
) -> tuple[list[tuple[int, int]], torch.Tensor | None]:
    """The longest runs of consecutive slots (at least ``min_run`` long, default
    ``MIN_VIEW_RUN``; at most ``MAX_VIEW_RUNS``) as [start, end) ranges, and the remaining
    slots (None if none)."""
    min_run = MIN_VIEW_RUN if min_run is None else min_run
    n = slots.numel()
    if n == 0:
        return [], None
    slots = slots.cpu()
    breaks = torch.nonzero(slots[1:] - slots[:-1] != 1).flatten() + 1
    bounds = [0, *breaks.tolist(), n]
    pieces = sorted(zip(bounds, bounds[1:]), key=lambda p: p[0] - p[1])  # longest first
    long = [p for p in pieces[:MAX_VIEW_RUNS] if p[1] - p[0] >= min_run]
    if len(long) == len(pieces):
        rest = None
    else:
        keep = torch.ones(n, dtype=torch.bool)
        for a, b in long:
            keep[a:b] = False
        rest = slots[keep]
    first = [int(slots[a]) for a, _ in long]
    return [(s, s + b - a) for s, (a, b) in zip(first, long)], rest


@dataclass
class _ReqAttn:
    """One request of the batch: its queries are tokens [prefix, prefix + q_len) of a sequence
    whose KV sits at ``kv_indices``; ``spans`` are image spans attended bidirectionally."""

    q_start: int
    q_len: int
    prefix: int
    kv_indices: torch.Tensor
    spans: list[tuple[int, int]]
    window_bounds_spans: bool = True  # False: a span's tokens see each other beyond the window
    masks: dict[tuple[int | None, bool], torch.Tensor] = field(default_factory=dict)
    _layout: _KVLayout | None = None

    @property
    def seq_len(self) -> int:
        return self.prefix + self.q_len

    def layout(self) -> _KVLayout:
        if self._layout is None:
            self._layout = _KVLayout.of(self.kv_indices, self.prefix, self.q_len)
        return self._layout

    def is_plain_causal(self, sliding_window: int | None, use_spans: bool = True) -> bool:
        no_spans = not (use_spans and self.spans)
        return no_spans and (sliding_window is None or sliding_window >= self.seq_len)

    def mask(
        self, sliding_window: int | None, dtype: torch.dtype, use_spans: bool = True
    ) -> torch.Tensor | None:
        """Additive mask (0 / -inf) in the queries' dtype, built once per batch, window and span
        use: SDPA's fused CPU kernel takes it as is, while a boolean mask is converted on every
        call."""
        if self.is_plain_causal(sliding_window, use_spans):
            sliding_window = None
            if self.q_len == 1:
                return None
        use_spans = use_spans and bool(self.spans)
        key = (sliding_window, use_spans)
        if key not in self.masks:
            device = self.kv_indices.device
            q_pos = torch.arange(self.prefix, self.seq_len, device=device)[:, None]
            kv_pos = torch.arange(self.seq_len, device=device)[None, :]
            allowed = kv_pos <= q_pos
            both_ways = torch.zeros_like(allowed)
            for start, end in self.spans if use_spans else []:
                both_ways |= (q_pos >= start) & (q_pos < end) & (kv_pos >= start) & (kv_pos < end)
            if sliding_window is not None and self.window_bounds_spans:
                allowed = (allowed | both_ways) & (kv_pos > q_pos - sliding_window)
            elif sliding_window is not None:
                allowed = (allowed & (kv_pos > q_pos - sliding_window)) | both_ways
            else:
                allowed |= both_ways
            mask = torch.zeros(allowed.shape, dtype=dtype, device=device)
            self.masks[key] = mask.masked_fill_(~allowed, float("-inf"))
        return self.masks[key]


class TorchNativeAttnBackend(AttentionBackend):
    """Attention in torch's own operators (SGLang's ``torch_native``): per request, fused flash
    calls over pool views (plain causal) or SDPA with a mask (spans, windows, soft-capping).
    ``cpu_native`` (``CpuNativeAttnBackend``) takes the batches its C++ kernels can and leaves
    the rest to these paths."""

    def __init__(self, kv_pool: KVPool, req_to_token_pool: ReqToTokenPool) -> None:
        self.kv_pool = kv_pool
        self.req_to_token = req_to_token_pool.req_to_token
        self._reqs: list[_ReqAttn] = []
        self._req_rows: list[int] = []  # each request's row of req_to_token
        self._keys_seen = 0.0  # of the batch's queries, for the FLOPs of each layer
        self.decode_kernel: Any = None  # CpuNativeAttnBackend's C++ kernels
        self.prefill_kernel: Any = None
        # (rows, q starts, prefixes, q lengths) of the requests given to the prefill kernel, by
        # which requests those are (layers may differ: spans can matter in some layers only)
        self._prefill_args: dict[tuple[int, ...], tuple[torch.Tensor, ...]] = {}
        self._decode_rows: torch.Tensor | None = None  # request rows and lengths of a decode
        self._decode_lens: torch.Tensor | None = None

    def prepare_metadata(self, batch: ForwardBatch) -> None:
        self._reqs = []
        self._req_rows = [int(row) for row in batch.req_pool_indices]
        self._prefill_args = {}
        self._decode_rows = self._decode_lens = None
        if batch.is_decode and self.decode_kernel is not None:
            self._decode_rows = torch.tensor(batch.req_pool_indices, dtype=torch.int64)
            self._decode_lens = torch.tensor(batch.prefix_lens, dtype=torch.int64) + 1
        q_start = 0
        for row, prefix, extend, spans in zip(
            batch.req_pool_indices, batch.prefix_lens, batch.extend_lens, batch.bidirectional_spans
        ):
            kv_indices = self.req_to_token[row, : prefix + extend]
            # Only spans that hold a query of this step change the mask (not so after a prompt).
            spans = [(a, b) for a, b in spans if a < prefix + extend and b > prefix]
            self._reqs.append(
                _ReqAttn(q_start, extend, prefix, kv_indices, spans, self.window_bounds_spans)
            )
            q_start += extend
        self._keys_seen = sum(causal_keys_seen(r.prefix, r.q_len) for r in self._reqs)

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
        save_kv: bool = True,
    ) -> torch.Tensor:
        started = time.perf_counter()
        pool = self.kv_pool
        if save_kv:
            pool.set_kv(layer, batch.out_cache_loc, k[0].transpose(0, 1), v[0].transpose(0, 1))
        k_buf, v_buf = pool.k_buffer[layer], pool.v_buffer[layer]
        if self._decode_rows is not None and k_buf.dtype == q.dtype:
            out = self._decode(q, k_buf, v_buf, scaling, sliding_window, softcap)
            self._count(started, q, batch)
            return out
        use_spans = sliding_window is not None or not self.spans_in_sliding_layers_only
        out = q.new_empty(q.shape[2], q.shape[1], q.shape[3])
        on_kernel: set[int] = set()
        if self._prefill_kernel_takes(q, k_buf, softcap):
            on_kernel = self._prefill(out, q, k_buf, v_buf, scaling, sliding_window, use_spans)
        for i, r in enumerate(self._reqs):
            if i in on_kernel:
                continue
            qi = q[:, :, r.q_start : r.q_start + r.q_len]
            if (
                not softcap
                and q.device.type == "cpu"
                and k_buf.dtype == q.dtype
                and r.is_plain_causal(sliding_window, use_spans)
            ):
                oi = _causal_over_pool(qi, k_buf, v_buf, r.layout(), scaling)
                out[r.q_start : r.q_start + r.q_len] = oi[0].transpose(0, 1)
                continue
            ki = k_buf[r.kv_indices].transpose(0, 1).unsqueeze(0).to(q.dtype)
            vi = v_buf[r.kv_indices].transpose(0, 1).unsqueeze(0).to(q.dtype)
            if softcap:
                oi = _softcapped_attention(
                    qi, ki, vi, r.mask(sliding_window, q.dtype, use_spans), scaling, softcap
                )
            else:
                oi = F.scaled_dot_product_attention(
                    qi,
                    ki,
                    vi,
                    attn_mask=r.mask(sliding_window, q.dtype, use_spans),
                    scale=scaling,
                    enable_gqa=ki.shape[1] != qi.shape[1],
                )
            out[r.q_start : r.q_start + r.q_len] = oi[0].transpose(0, 1)
        self._count(started, q, batch)
        return out.unsqueeze(0)

    def _count(self, started: float, q: torch.Tensor, batch: ForwardBatch) -> None:
        """Prefill attention's seconds and FLOPs; decode attention's seconds apart."""
        if self.perf is None:
            return
        elapsed = time.perf_counter() - started
        if batch.is_decode:
            self.perf.decode_attention_seconds += elapsed
        else:
            flops = causal_attention_flops(q.shape[1], q.shape[3], self._keys_seen)
            self.perf.add_lm_attention(elapsed, flops)

    def _prefill_kernel_takes(
        self, q: torch.Tensor, k_buf: torch.Tensor, softcap: float | None
    ) -> bool:
        return False  # CpuNativeAttnBackend: its kernel takes the batches it can

    def _prefill(self, out: torch.Tensor, *args: Any) -> set[int]:
        raise NotImplementedError

    def _decode(self, q: torch.Tensor, *args: Any) -> torch.Tensor:
        raise NotImplementedError


_flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu


def _causal_over_pool(
    q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor, kv: _KVLayout, scaling: float
) -> torch.Tensor:
    """Causal attention of queries at positions [prefix, prefix + n) read straight from the pool.

    Keys every query sees (the prefix; for a single query, all of them) come as views of
    contiguous slot runs plus one gather of the rest, attended without a mask by fused CPU
    flash calls in which each KV head is one batch entry whose query heads share its K/V through
    a stride-0 expand (GQA without repeating K/V). The chunk's own keys get one causal call.
    Partial results merge by log-sum-exp.
    q: (1, heads, n, dim); returns (1, heads, n, dim)."""
    _, heads, n, dim = q.shape
    kv_heads = k_buf.shape[1]
    groups = heads // kv_heads
    grouped = q.reshape(kv_heads, groups, n, dim)  # batch = KV head, heads = its query heads

    def attend(k: torch.Tensor, v: torch.Tensor, causal: bool) -> tuple[torch.Tensor, ...]:
        """k, v: (kv_heads, len, dim), shared by each group's query heads (stride 0)."""
        shape = (kv_heads, groups, k.shape[1], dim)
        o, lse = _flash(
            grouped, k[:, None].expand(shape), v[:, None].expand(shape), 0.0, causal, scale=scaling
        )
        return o.reshape(1, heads, n, dim), lse.reshape(1, heads, n)

    parts = [
        attend(k_buf[a:b].transpose(0, 1), v_buf[a:b].transpose(0, 1), False) for a, b in kv.runs
    ]
    if kv.rest is not None:
        parts.append(attend(k_buf[kv.rest].transpose(0, 1), v_buf[kv.rest].transpose(0, 1), False))
    if kv.chunk is not None:
        parts.append(attend(_chunk_keys(k_buf, kv.chunk), _chunk_keys(v_buf, kv.chunk), True))
    return _merge_by_lse(parts)


def _chunk_keys(buf: torch.Tensor, chunk: tuple[int, int] | torch.Tensor) -> torch.Tensor:
    """(kv_heads, n, dim): a view of a contiguous run, else a gather."""
    if isinstance(chunk, tuple):
        return buf[chunk[0] : chunk[1]].transpose(0, 1)
    return buf[chunk].transpose(0, 1)


def _merge_by_lse(parts: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """Softmax-weighted combination of attention outputs over disjoint key sets."""
    if len(parts) == 1:
        return parts[0][0]
    lses = torch.stack([lse for _, lse in parts])
    weights = torch.exp(lses - lses.amax(0, keepdim=True)).unsqueeze(-1)
    merged = parts[0][0] * weights[0]
    for (out, _), w in zip(parts[1:], weights[1:]):
        merged.addcmul_(out, w)
    return merged / weights.sum(0)


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
