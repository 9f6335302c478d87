"""Property: whatever the image layout, chunk size, cache budget and mode, the embeddings merged
chunk by chunk equal a one-shot reference, the cache stays within budget, and no image is encoded
twice while the cache can hold it."""

from __future__ import annotations

import functools
from collections import Counter

import torch
from conftest import examples, make_image, model_dir, placeholder
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sglang
from sglang.srt.core.req import Req
from sglang.srt.mem_cache.mm_embedding_cache import MultimodalEmbeddingCache
from sglang.srt.multimodal.embedder import MultimodalEmbedder, _move_items_to_device
from sglang.srt.sampling.sampling_params import SamplingParams

FAMILY = "qwen3_vl"  # deepstack extras travel with the embedding
SIZES = [(32, 32), (64, 32), (48, 80), (64, 64)]


@functools.cache
def _engine() -> sglang.Engine:
    return sglang.Engine(dtype="float32", model_path=model_dir(FAMILY))


def _request(layout: list[tuple[int, int]], seed: int) -> Req:
    engine, ph = _engine(), placeholder(FAMILY)
    prompt = "".join("word " * gap + ph for gap, _ in layout) + " end"
    images = [make_image(seed + i, *SIZES[size]) for i, (_, size) in enumerate(layout)]
    ids, items = engine.processor.process(prompt, None, engine.processor.load_images(images))
    return Req(rid="r", input_ids=ids, sampling_params=SamplingParams(), mm_items=items)


def _reference(req: Req) -> tuple[torch.Tensor, list[torch.Tensor]]:
    engine = _engine()
    hidden = engine.runner.text_config.hidden_size
    embeds = torch.zeros(len(req.input_ids), hidden)
    extras: list[torch.Tensor] = []
    engine.runner.embedder.preprocess(req.mm_items)
    with torch.no_grad():
        features = _move_items_to_device(req.mm_items, "cpu")
        entries = engine.runner.adapter.encode(features, [it.num_tokens for it in req.mm_items])
    for item, entry in zip(req.mm_items, entries):
        positions, rows = item.token_offsets(0, len(req.input_ids))
        embeds[positions] = entry.embedding[rows]
    positions = torch.cat([torch.as_tensor(i.token_offsets(0, 10**9)[0]) for i in req.mm_items])
    for layer in range(len(entries[0].extras)):
        extras.append(torch.cat([e.extras[layer] for e in entries])[torch.argsort(positions)])
    return embeds, extras


@settings(max_examples=examples(25), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    layout=st.lists(
        st.tuples(st.integers(0, 6), st.integers(0, len(SIZES) - 1)), min_size=1, max_size=4
    ),
    chunk=st.integers(1, 40),
    budget_images=st.sampled_from([0.5, 1, 2, 100]),
    encoder_budget=st.sampled_from([16, 40, 10**6]),
    mode=st.sampled_from(["per-image", "combined", "off"]),
    seed=st.integers(0, 50),
)
def test_chunked_merge_equals_one_shot(layout, chunk, budget_images, encoder_budget, mode, seed):
    engine = _engine()
    req = _request(layout, seed)
    ref_embeds, ref_extras = _reference(_request(layout, seed))
    hidden = engine.runner.text_config.hidden_size
    largest = max(item.num_tokens for item in req.mm_items)
    entry_bytes = largest * hidden * 4 * (1 + len(ref_extras))
    cache = MultimodalEmbeddingCache(int(entry_bytes * budget_images))
    embedder = MultimodalEmbedder(
        engine.runner.adapter,
        engine.runner.embedder.preprocess,
        cache,
        "cpu",
        torch.float32,
        encoder_budget,
        mode,
    )
    encoded: Counter = Counter()
    original = embedder._encode_batch

    def counting(items):
        encoded.update(item.hash for item in items)
        assert sum(i.num_tokens for i in items) <= max(encoder_budget, largest)
        return original(items)

    embedder._encode_batch = counting
    merged = torch.zeros_like(ref_embeds)
    for lo in range(0, len(req.input_ids), chunk):
        hi = min(lo + chunk, len(req.input_ids))
        part = torch.zeros(hi - lo, hidden)
        kwargs = embedder.embed([req], [lo], [hi - lo], part)
        merged[lo:hi] = part
        if kwargs:
            mask = kwargs["visual_pos_masks"][0]
            positions = torch.nonzero(mask).flatten() + lo
            image_positions = (
                torch.cat([torch.as_tensor(i.token_offsets(0, 10**9)[0]) for i in req.mm_items])
                .sort()
                .values
            )
            index = torch.searchsorted(image_positions, positions)
            for layer, got in enumerate(kwargs["deepstack_visual_embeds"]):
                torch.testing.assert_close(got, ref_extras[layer][index], rtol=1e-4, atol=1e-5)
        embedder.release(req, hi)
        cache.check_integrity()
    embedder.release(req)
    assert cache.num_pinned == 0
    torch.testing.assert_close(merged, ref_embeds, rtol=1e-4, atol=1e-5)
    distinct = {item.hash: item.num_tokens for item in req.mm_items}
    if mode == "per-image" and budget_images >= len(distinct) * 1.0 and budget_images >= 1:
        assert set(encoded.values()) == {1}
