"""Attention read in place from the KV pool (views of slot runs, a gather of the rest, GQA by
stride-0 expand, log-sum-exp merges) equals naive causal attention, for prefill chunks over a
cached prefix and decode batches, whatever the slot layout; the allocator keeps runs."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang.srt.core.forward_batch import ForwardBatch
from sglang.srt.layers.attention import create_attention_backend, torch_native
from sglang.srt.mem_cache.memory_pool import KVPool, ReqToTokenPool

DIM = 8


def _naive_causal(q, k, v, prefix, scaling):
    """q: (heads, n, d) at positions prefix..prefix+n-1; k, v: (kv_heads, prefix+n, d)."""
    groups = q.shape[0] // k.shape[0]
    k, v = k.repeat_interleave(groups, 0), v.repeat_interleave(groups, 0)
    scores = q.double() @ k.double().transpose(1, 2) * scaling
    n, total = q.shape[1], k.shape[1]
    q_pos = torch.arange(prefix, prefix + n)[:, None]
    scores = scores.masked_fill(torch.arange(total)[None, :] > q_pos, -math.inf)
    return (torch.softmax(scores, -1) @ v.double()).float()


def _scattered_slots(pool: KVPool, n: int, pieces: int, draw_gap) -> torch.Tensor:
    """``n`` slots in up to ``pieces`` runs, with other allocations in between."""
    cuts = sorted({0, n, *(draw_gap(0, n) for _ in range(pieces - 1))})
    parts = []
    for a, b in zip(cuts, cuts[1:]):
        parts.append(pool.alloc(b - a))
        pool.alloc(draw_gap(0, 3))
    return torch.cat(parts) if parts else torch.empty(0, dtype=torch.int64)


requests = st.lists(
    st.tuples(st.integers(0, 40), st.integers(1, 12), st.integers(1, 4)), min_size=1, max_size=5
)


@pytest.mark.parametrize("backend_name", ["cpu_native", "torch_native"])
@settings(max_examples=examples(80), deadline=None)
@given(
    reqs=requests,
    heads=st.sampled_from([(4, 2), (4, 4), (6, 2)]),
    min_view_run=st.sampled_from([1, 3, 64]),
    decode=st.booleans(),
    data=st.data(),
)
def test_pool_attention_matches_naive(
    backend_name, reqs, heads, min_view_run, decode, data
) -> None:
    num_heads, kv_heads = heads
    if decode:
        reqs = [(prefix, 1, pieces) for prefix, _, pieces in reqs]
    torch.manual_seed(0)
    pool = KVPool(2048, [(kv_heads, DIM)], torch.float32, "cpu")
    rows = ReqToTokenPool(8, 64, "cpu")
    draw = lambda a, b: data.draw(st.integers(a, b))  # noqa: E731
    ks, vs, row_ids, out_locs = [], [], [], []
    for prefix, extend, pieces in reqs:
        total = prefix + extend
        k, v = torch.randn(kv_heads, total, DIM), torch.randn(kv_heads, total, DIM)
        slots = torch.cat(
            [_scattered_slots(pool, prefix, pieces, draw), _scattered_slots(pool, extend, 2, draw)]
        )
        row = rows.alloc()
        rows.req_to_token[row, :total] = slots
        pool.set_kv(0, slots[:prefix], k[:, :prefix].transpose(0, 1), v[:, :prefix].transpose(0, 1))
        ks.append(k)
        vs.append(v)
        row_ids.append(row)
        out_locs.append(slots[prefix:])
    extend_lens = [e for _, e, _ in reqs]
    n = sum(extend_lens)
    batch = ForwardBatch(
        reqs=[],
        input_ids=torch.zeros(n, dtype=torch.int64),
        positions=torch.zeros(n),
        out_cache_loc=torch.cat(out_locs),
        req_pool_indices=row_ids,
        prefix_lens=[p for p, _, _ in reqs],
        extend_lens=extend_lens,
        bidirectional_spans=[[] for _ in reqs],
        is_decode=decode,
    )
    q = torch.randn(1, n, num_heads, DIM).transpose(1, 2)  # a transposed view, as HF passes it
    k_new = torch.cat([k[:, p:] for k, (p, _, _) in zip(ks, reqs)], 1).unsqueeze(0)
    v_new = torch.cat([v[:, p:] for v, (p, _, _) in zip(vs, reqs)], 1).unsqueeze(0)
    backend = create_attention_backend(backend_name, kv_pool=pool, req_to_token_pool=rows)
    original = torch_native.MIN_VIEW_RUN
    torch_native.MIN_VIEW_RUN = min_view_run
    try:
        backend.prepare_metadata(batch)
        out = backend.forward(q, k_new, v_new, 0, batch, scaling=DIM**-0.5)
    finally:
        torch_native.MIN_VIEW_RUN = original
    start = 0
    for (prefix, extend, _), k, v in zip(reqs, ks, vs):
        ref = _naive_causal(q[0, :, start : start + extend], k, v, prefix, DIM**-0.5)
        torch.testing.assert_close(
            out[0, start : start + extend], ref.transpose(0, 1), rtol=1e-5, atol=1e-5
        )
        start += extend


def test_layout_uses_views_for_long_runs() -> None:
    slots = torch.cat([torch.arange(100, 200), torch.arange(5, 8), torch.arange(300, 400)])
    runs, rest = torch_native._split_runs(slots)
    assert sorted(runs) == [(100, 200), (300, 400)]
    assert rest is not None and rest.tolist() == [5, 6, 7]
    layout = torch_native._KVLayout.of(slots, prefix=150, q_len=53)  # prefix ends at slot 346
    assert layout.chunk == (347, 400) and layout.runs == [(100, 200)]
    assert layout.rest is not None and layout.rest.tolist() == [5, 6, 7, *range(300, 347)]
    decode = torch_native._KVLayout.of(slots, prefix=202, q_len=1)
    assert decode.chunk is None and sorted(decode.runs) == [(100, 200), (300, 400)]


def test_allocator_continues_ascending_runs() -> None:
    pool = KVPool(64, [(1, 2)], torch.float32, "cpu")
    a, b = pool.alloc(5), pool.alloc(3)
    assert a.tolist() == [0, 1, 2, 3, 4] and b.tolist() == [5, 6, 7]
    pool.free(a)
    assert pool.alloc(2).tolist() == [0, 1]
    assert pool.alloc(4).tolist() == [2, 3, 4, 8]
    pool.check_integrity(held=9)


@pytest.mark.parametrize("n", [1, 7])
def test_allocator_never_hands_out_a_slot_twice(n: int) -> None:
    pool = KVPool(32, [(1, 2)], torch.float32, "cpu")
    held = [pool.alloc(n) for _ in range(32 // n)]
    for chunk in held[::2]:
        pool.free(chunk)
    again = [pool.alloc(n) for _ in range(len(held[::2]))]
    slots = torch.cat(held[1::2] + again)
    assert slots.unique().numel() == slots.numel()
    pool.check_integrity(held=slots.numel())
