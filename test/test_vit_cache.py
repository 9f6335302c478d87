"""Chunk-aware per-image ViT caching: counters prove which images are encoded when."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import hf_greedy, make_image, model_dir, placeholder

import sglang
from sglang.srt.multimodal.embedder import _move_items_to_device

FAMILY = "qwen2_5_vl"
PH = placeholder(FAMILY)
GREEDY = {"temperature": 0, "max_new_tokens": 6}
MODES = ("per-image", "combined", "off")
SEPARATOR = " and then after that there is another picture which is "


class Recorder:
    """Records encoder calls (item hashes) and the chunks each request ran."""

    def __init__(self, engine: sglang.Engine) -> None:
        self.calls: list[list[int]] = []
        self.chunks: list[tuple[int, int]] = []
        embedder, runner, scheduler = engine.runner.embedder, engine.runner, engine.scheduler
        encode_batch, forward, step = embedder._encode_batch, runner.forward, scheduler.step

        def record_encode(items):
            self.calls.append([item.hash for item in items])
            return encode_batch(items)

        def record_forward(batch):
            if not batch.is_decode:
                self.chunks += [(p, p + e) for p, e in zip(batch.prefix_lens, batch.extend_lens)]
            return forward(batch)

        def checked_step():
            out = step()
            scheduler.check_integrity()
            return out

        embedder._encode_batch = record_encode
        runner.forward = record_forward
        scheduler.step = checked_step

    @property
    def per_hash(self) -> Counter:
        return Counter(h for call in self.calls for h in call)


def _engine(mode: str, **kwargs) -> tuple[sglang.Engine, Recorder]:
    engine = sglang.Engine(
        model_path=model_dir(FAMILY), mm_cache_mode=mode, dtype="float32", **kwargs
    )
    return engine, Recorder(engine)


def _image_entry_bytes(engine: sglang.Engine, tokens: int) -> int:
    return tokens * engine.runner.text_config.hidden_size * 4


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl", "llava", "gemma3"])
def test_every_mode_matches_hf(family: str, mode: str) -> None:
    ph = placeholder(family)
    prompt = f"One {ph} two {ph} three"
    images = [make_image(60, 64, 96), make_image(61, 96, 64)]
    ref_ids, _ = hf_greedy(family, prompt, images, 6)
    for chunk in (-1, 5):
        engine = sglang.Engine(
            dtype="float32",
            model_path=model_dir(family),
            mm_cache_mode=mode,
            chunked_prefill_size=chunk,
        )
        for _ in range(2):  # second run: prefix and embedding caches warm
            assert engine.generate(prompt, GREEDY, image_data=images)["output_ids"] == ref_ids
        engine.scheduler.check_integrity()


def _multi_image_prompt(n: int) -> str:
    return "Look:" + SEPARATOR.join(f"{PH}" for _ in range(n)) + " done."


def test_chunked_request_encodes_each_image_once_per_image_vs_combined() -> None:
    n = 4
    prompt, images = _multi_image_prompt(n), [make_image(70 + i) for i in range(n)]
    outputs = {}
    recorders = {}
    for mode, budget_images in [
        ("per-image", 1.5),
        ("combined", 1.5),
        ("combined", 100),
        ("off", 100),
    ]:
        probe, _ = _engine(mode)
        mb = _image_entry_bytes(probe, 25) * budget_images / 2**20
        engine, rec = _engine(mode, chunked_prefill_size=25, mm_embedding_cache_mb=mb)
        engine.runner.embedder.cache.capacity_bytes = int(mb * 2**20)
        outputs[(mode, budget_images)] = engine.generate(prompt, GREEDY, image_data=images)
        recorders[(mode, budget_images)] = (rec, engine)
    assert len({tuple(o["output_ids"]) for o in outputs.values()}) == 1

    rec, engine = recorders[("per-image", 1.5)]
    item_spans = [item.spans[0] for item in _items(engine, prompt, images)]
    touching = [c for c in rec.chunks if any(s < c[1] and c[0] < e for s, e in item_spans)]
    assert len(touching) > n  # the chunk size really cuts through images
    assert sorted(rec.per_hash.values()) == [1] * n
    info = engine.get_server_info()["mm_embedding_cache"]
    assert info["encoded_items"] == n and info["bytes_used"] <= info["capacity_bytes"]

    rec, _ = recorders[("combined", 1.5)]  # the combined entry does not fit: N per chunk
    assert sum(len(call) for call in rec.calls) == n * len(touching)
    rec, _ = recorders[("combined", 100)]  # fits: all N at the first chunk touching an image
    assert [len(call) for call in rec.calls] == [n]
    rec, _ = recorders[("off", 100)]  # no cache: each image once per chunk it overlaps
    overlaps = sum(1 for c in touching for s, e in item_spans if s < c[1] and c[0] < e)
    assert sum(len(call) for call in rec.calls) == overlaps


def _items(engine: sglang.Engine, prompt: str, images: list) -> list:
    loaded = engine.processor.load_images(images)
    return engine.processor.process(prompt, None, loaded)[1]


def test_multiturn_chat_encodes_one_new_image_per_turn() -> None:
    encoded, texts = {}, {}
    for mode in ("per-image", "combined"):
        engine, rec = _engine(mode, chunked_prefill_size=32)
        prompt, images, outs = "Describe this image: " + PH, [make_image(80)], []
        for turn in range(4):
            out = engine.generate(prompt, GREEDY, image_data=images)
            outs.append(out["output_ids"])
            if turn:
                assert out["meta_info"]["cached_tokens"] > 0
            prompt += out["text"] + " Now look at this new image: " + PH
            images = [*images, make_image(81 + turn)]
        encoded[mode] = [len(call) for call in rec.calls]
        texts[mode] = outs
    assert sum(encoded["per-image"]) == 4
    assert sum(encoded["combined"]) == 1 + 2 + 3 + 4
    assert texts["per-image"] == texts["combined"]


@pytest.mark.parametrize("mode", MODES)
def test_each_reply_says_where_its_images_came_from(mode: str) -> None:
    """meta_info["mm_items"] names, per image, the encoder, the embedding cache or the prefix
    cache; checked against the encoder calls each request really made."""
    engine, rec = _engine(mode, chunked_prefill_size=20)  # chunks cut through the images
    a, b, c = make_image(95), make_image(96), make_image(97)
    turns = [
        (f"One {PH} two {PH} end", [a, b]),
        (f"Other text {PH} then {PH} end", [a, c]),  # new text first: no KV prefix for a
        (f"One {PH} two {PH} end", [a, b]),  # the first prompt again: its KV is cached
    ]
    reported = []
    for prompt, images in turns:
        calls_before = len(rec.calls)
        out = engine.generate(prompt, GREEDY, image_data=images)
        sources = [item["source"] for item in out["meta_info"]["mm_items"]]
        encoded_now = {h for call in rec.calls[calls_before:] for h in call}
        hashes = [item.hash for item in _items(engine, prompt, images)]
        assert [h in encoded_now for h in hashes] == [s == "encoded" for s in sources]
        assert [item["tokens"] for item in out["meta_info"]["mm_items"]] == [25, 25]
        reported.append(sources)
    second = {
        "per-image": ["embedding_cache", "encoded"],
        "combined": ["encoded", "encoded"],  # a new set of images is a new entry
        "off": ["encoded", "encoded"],
    }[mode]
    assert reported == [["encoded"] * 2, second, ["prefix_cache"] * 2]


def test_repeated_image_is_encoded_once_and_not_preprocessed_again() -> None:
    engine, rec = _engine("per-image")
    image = make_image(90, 96, 96)
    engine.generate(f"First {PH} request", GREEDY, image_data=image)
    second = engine.generate(f"A different {PH} prompt", GREEDY, image_data=image)
    assert second["meta_info"]["cached_tokens"] < 4  # different text: no KV reuse
    assert rec.per_hash.most_common(1)[0][1] == 1 and len(rec.calls) == 1
    info = engine.get_server_info()["mm_embedding_cache"]
    assert info["hits"] == 1 and info["preprocess_skipped"] == 1
    assert engine.runner.embedder.preprocess.num_preprocessed == 1
    ref_ids, _ = hf_greedy(FAMILY, f"A different {PH} prompt", [image], 6)
    assert second["output_ids"] == ref_ids


def test_budget_of_one_image_still_encodes_each_image_once() -> None:
    probe, _ = _engine("per-image")
    one = _image_entry_bytes(probe, 25)
    engine, rec = _engine("per-image", chunked_prefill_size=7)
    engine.runner.embedder.cache.capacity_bytes = one
    prompt, images = _multi_image_prompt(3), [make_image(100 + i) for i in range(3)]
    out = engine.generate(prompt, GREEDY, image_data=images)
    assert sorted(rec.per_hash.values()) == [1, 1, 1]  # pinned across the chunks of an image
    cache = engine.runner.embedder.cache
    assert cache.bytes_used <= one and cache.counters.evictions == 2 and cache.num_pinned == 0
    assert out["output_ids"] == hf_greedy(FAMILY, prompt, images, 6)[0]


def test_batch_misses_are_deduplicated_into_one_encoder_call() -> None:
    engine, rec = _engine("per-image", chunked_prefill_size=-1)
    shared, other = make_image(110), make_image(111)
    engine.generate(
        [f"a {PH} b", f"c {PH} d {PH}", f"e {PH}"],
        GREEDY,
        image_data=[[shared], [shared, other], [other]],
    )
    assert len(rec.calls) == 1 and sorted(rec.per_hash.values()) == [1, 1]


@pytest.mark.parametrize("num_images", [2, 4, 8])
def test_encoder_batch_stays_under_the_token_budget(num_images: int) -> None:
    prompt, images = _multi_image_prompt(num_images), [make_image(120 + i) for i in range(8)]
    engine, rec = _engine("per-image", chunked_prefill_size=-1, mm_encoder_token_budget=50)
    engine.generate(prompt, GREEDY, image_data=images[:num_images])
    info = engine.get_server_info()["mm_embedding_cache"]
    assert info["max_encoder_call_tokens"] <= 50
    assert info["encoder_calls"] == num_images // 2
    unbounded, _ = _engine("per-image", chunked_prefill_size=-1, mm_encoder_token_budget=10**6)
    unbounded.generate(prompt, GREEDY, image_data=images[:num_images])
    peak = unbounded.get_server_info()["mm_embedding_cache"]["max_encoder_call_tokens"]
    assert peak == 25 * num_images


def test_move_items_to_device_wraps_numpy_without_copy() -> None:
    engine, _ = _engine("per-image")
    (item,) = _items(engine, f"x {PH}", [make_image(130)])
    assert item.features is None  # layout alone expands the prompt
    engine.runner.embedder.preprocess([item])
    assert all(isinstance(v, np.ndarray) for v in item.features.values())
    (moved,) = _move_items_to_device([item], "cpu")
    pixels = moved["pixel_values"]
    assert isinstance(pixels, torch.Tensor)
    assert pixels.data_ptr() == item.features["pixel_values"].__array_interface__["data"][0]


def test_model_adapters_never_move_features() -> None:
    root = Path(sglang.__file__).parent / "srt"
    offenders = []
    for path in root.glob("models/**/*.py"):
        for lineno, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"(pixel_values|features?\b|image_grid_thw)[^=]*\.(to|cuda)\(", line):
                offenders.append(f"{path.name}:{lineno}: {line.strip()}")
    assert not offenders, offenders


def test_server_info_reports_cache_counters() -> None:
    engine, _ = _engine("combined", mm_embedding_cache_mb=7)
    engine.generate(f"x {PH}", GREEDY, image_data=make_image(140))
    info = engine.get_server_info()["mm_embedding_cache"]
    expected = {
        "mode",
        "hits",
        "misses",
        "encoded_items",
        "encoded_tokens",
        "evictions",
        "entries",
        "bytes_used",
        "capacity_bytes",
        "encoder_seconds",
        "preprocess_skipped",
    }
    assert expected <= set(info)
    assert info["mode"] == "combined" and info["capacity_bytes"] == 7 * 2**20
    assert info["misses"] == 1 and info["encoded_items"] == 1 and info["encoder_seconds"] > 0


def test_env_var_sets_the_budget(monkeypatch) -> None:
    monkeypatch.setenv("SGLANG_VLM_CACHE_SIZE_MB", "3")
    engine = sglang.Engine(dtype="float32", model_path=model_dir(FAMILY))
    assert engine.get_server_info()["mm_embedding_cache"]["capacity_bytes"] == 3 * 2**20
