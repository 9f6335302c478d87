"""The SDPA backend over the KV pool equals a naive masked attention, for packed requests with
different prefix/extend lengths, GQA, sliding windows, soft-capping and bidirectional spans."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang.srt.core.forward_batch import ForwardBatch
from sglang.srt.layers.attention import create_attention_backend
from sglang.srt.mem_cache.memory_pool import KVPool, ReqToTokenPool

HEADS, KV_HEADS, DIM = 4, 2, 8


def _naive(q, k, v, prefix, spans, window, softcap, scaling):
    """q: (heads, n, d) for positions prefix..prefix+n; k, v: (kv_heads, prefix+n, d)."""
    groups = HEADS // KV_HEADS
    k, v = k.repeat_interleave(groups, 0), v.repeat_interleave(groups, 0)
    scores = q @ k.transpose(1, 2) * scaling
    if softcap:
        scores = torch.tanh(scores / softcap) * softcap
    n, total = q.shape[1], k.shape[1]
    allowed = torch.zeros(n, total, dtype=torch.bool)
    for i in range(n):
        qp = prefix + i
        for j in range(total):
            same_image = any(s <= qp < e and s <= j < e for s, e in spans)
            ok = j <= qp or same_image
            if window is not None:
                ok = ok and j > qp - window
            allowed[i, j] = ok
    scores = scores.masked_fill(~allowed, -math.inf)
    return torch.softmax(scores, -1) @ v


requests = st.lists(
    st.tuples(st.integers(0, 12), st.integers(1, 9), st.booleans()), min_size=1, max_size=4
)


@pytest.mark.parametrize("backend_name", ["cpu_native", "torch_native"])
@settings(max_examples=examples(60), deadline=None)
@given(reqs=requests, window=st.sampled_from([None, 3, 8]), softcap=st.sampled_from([None, 5.0]))
def test_backend_matches_naive_attention(backend_name, reqs, window, softcap) -> None:
    torch.manual_seed(0)
    pool = KVPool(256, [(KV_HEADS, DIM)], torch.float32, "cpu")
    rows = ReqToTokenPool(8, 64, "cpu")
    backend = create_attention_backend(backend_name, kv_pool=pool, req_to_token_pool=rows)
    full_k, full_v, row_ids, out_locs, spans_all = [], [], [], [], []
    for prefix, extend, has_image in reqs:
        total = prefix + extend
        k, v = torch.randn(KV_HEADS, total, DIM), torch.randn(KV_HEADS, total, DIM)
        row = rows.alloc()
        slots = pool.alloc(total)
        rows.req_to_token[row, :total] = slots
        pool.set_kv(0, slots[:prefix], k[:, :prefix].transpose(0, 1), v[:, :prefix].transpose(0, 1))
        out_locs.append(slots[prefix:])
        full_k.append(k)
        full_v.append(v)
        row_ids.append(row)
        spans_all.append([(max(prefix - 2, 0), prefix + min(extend, 3))] if has_image else [])
    extend_lens = [e for _, e, _ in reqs]
    batch = ForwardBatch(
        reqs=[],
        input_ids=torch.zeros(sum(extend_lens), dtype=torch.int64),
        positions=torch.zeros(sum(extend_lens)),
        out_cache_loc=torch.cat(out_locs),
        req_pool_indices=row_ids,
        prefix_lens=[p for p, _, _ in reqs],
        extend_lens=extend_lens,
        bidirectional_spans=spans_all,
        is_decode=False,
    )
    q = torch.randn(1, HEADS, sum(extend_lens), DIM)
    k_new = torch.cat([k[:, p:] for k, (p, _, _) in zip(full_k, reqs)], 1).unsqueeze(0)
    v_new = torch.cat([v[:, p:] for v, (p, _, _) in zip(full_v, reqs)], 1).unsqueeze(0)
    backend.prepare_metadata(batch)
    out = backend.forward(
        q, k_new, v_new, 0, batch, scaling=DIM**-0.5, sliding_window=window, softcap=softcap
    )
    start = 0
    for (prefix, extend, _), k, v, spans in zip(reqs, full_k, full_v, spans_all):
        ref = _naive(
            q[0, :, start : start + extend], k, v, prefix, spans, window, softcap, DIM**-0.5
        )
        torch.testing.assert_close(
            out[0, start : start + extend], ref.transpose(0, 1), rtol=1e-5, atol=1e-5
        )
        start += extend


def test_the_cpu_default_is_the_native_backend_and_torch_native_is_torch_only() -> None:
    """SGLang's ``torch_native`` is torch's operators alone; the native kernels are
    ``cpu_native``, the default on a CPU."""
    from sglang.srt.layers.attention import default_attention_backend

    assert default_attention_backend("cpu") == "cpu_native"
    assert default_attention_backend("cuda") == "torch_native"
    pool = KVPool(16, [(KV_HEADS, DIM)], torch.float32, "cpu")
    rows = ReqToTokenPool(2, 16, "cpu")
    plain = create_attention_backend("torch_native", kv_pool=pool, req_to_token_pool=rows)
    assert plain.prefill_kernel is None and plain.decode_kernel is None
