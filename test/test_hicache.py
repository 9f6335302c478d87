"""The hierarchical cache's storage tier: prefix KV pages written by one engine and loaded by
another (a restarted worker, another worker of a fleet) give the output computed from scratch,
token for token in float32; foreign, corrupt and missing pages are computed; a store that fails
fails no request."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

import numpy as np
import pytest
import torch
from conftest import make_image, model_dir, placeholder

import sglang
from sglang.srt.mem_cache.kv_page_store import KVPageStore, page_keys
from sglang.srt.mem_cache.store_backend import FileBlobs
from sglang.srt.mem_cache.wire import InvalidEntry
from sglang.srt.server_args import ServerArgs

FAMILY = "qwen2_5_vl"
PH = placeholder(FAMILY)
GREEDY = {"temperature": 0, "max_new_tokens": 6}
PAGE = 8
VIDEO = "<|vision_start|><|video_pad|><|vision_end|>"


def _engine(root: str, family: str = FAMILY, **kwargs) -> sglang.Engine:
    extra = {"file_storage_path": root, "prefetch_threshold": 0, **kwargs.pop("extra", {})}
    return sglang.Engine(
        model_path=model_dir(family),
        dtype="float32",
        enable_hierarchical_cache=True,
        hicache_storage_backend="file",
        page_size=PAGE,
        hicache_storage_backend_extra_config=json.dumps(extra),
        **kwargs,
    )


def _reference(family: str = FAMILY, **kwargs) -> sglang.Engine:
    return sglang.Engine(model_path=model_dir(family), dtype="float32", **kwargs)


def _hicache(engine: sglang.Engine) -> dict:
    return engine.get_server_info()["hicache"]


@pytest.fixture
def root(tmp_path) -> Iterator[str]:
    yield str(tmp_path / "hicache")


def _images(seed: int) -> list:
    return [make_image(seed), make_image(seed + 1)]


CHAT = f"A {PH} and a {PH}: tell me what differs between the two pictures, in detail please."


@pytest.mark.parametrize("chunk", [None, 12])
def test_an_image_prefix_loaded_from_the_store_gives_the_computed_output(root, chunk) -> None:
    kwargs = {"chunked_prefill_size": chunk} if chunk else {}
    images = _images(500)
    expected = _reference(**kwargs).generate(CHAT, GREEDY, image_data=images)
    writer = _engine(root, **kwargs)
    first = writer.generate(CHAT, GREEDY, image_data=images)
    writer.shutdown()
    assert first["output_ids"] == expected["output_ids"]
    saved = _hicache(writer)["pages_saved"]
    prompt_len = first["meta_info"]["prompt_tokens"]
    assert saved == (prompt_len + 5) // PAGE  # every full page of prompt and output

    reader = _engine(root, **kwargs)  # a restarted worker
    again = reader.generate(CHAT, GREEDY, image_data=images)
    assert again["output_ids"] == expected["output_ids"]
    loaded = (prompt_len - 1) // PAGE * PAGE  # the last prompt token is always computed
    assert again["meta_info"]["cached_tokens"] == loaded
    assert _hicache(reader)["tokens_loaded"] == loaded
    assert reader.runner.embedder.stats.as_dict()["encoded_items"] == 0  # no image encoded
    reader.scheduler.check_integrity()


def test_the_next_turn_on_another_worker_prefills_only_its_new_tokens(root) -> None:
    turn1 = CHAT
    images = _images(510)
    a, b = _engine(root), _engine(root)
    out1 = a.generate(turn1, GREEDY, image_data=images)
    a.shutdown()  # drains the writer
    turn2 = turn1 + a.tokenizer.decode(out1["output_ids"]) + " And the colours?"
    out2 = b.generate(turn2, GREEDY, image_data=images)
    expected = _reference().generate(turn2, GREEDY, image_data=images)
    assert out2["output_ids"] == expected["output_ids"]
    cached = out2["meta_info"]["cached_tokens"]
    assert cached >= (out1["meta_info"]["prompt_tokens"] // PAGE) * PAGE
    b.scheduler.check_integrity()


def test_a_prefix_that_ends_inside_an_image_is_loaded_and_the_rest_computed(root) -> None:
    # The stored prompt ends one token after the image; its last full page ends inside the
    # image's placeholders, so the reader loads part of the image and encodes it for the rest.
    images = [make_image(520)]
    short = f"Look: {PH}"
    longer = f"Look: {PH} and say what you see there, briefly."
    writer = _engine(root)
    writer.generate(short, {"temperature": 0, "max_new_tokens": 1}, image_data=images)
    writer.shutdown()
    reader = _engine(root)
    out = reader.generate(longer, GREEDY, image_data=images)
    expected = _reference().generate(longer, GREEDY, image_data=images)
    assert out["output_ids"] == expected["output_ids"]
    # "Look: " is 5 tokens and the image 25 (tokens 5-29): pages of 8 end at 24, inside it.
    assert out["meta_info"]["cached_tokens"] == 24
    assert reader.runner.embedder.stats.as_dict()["encoded_items"] == 1
    reader.scheduler.check_integrity()


def test_a_video_chat_continues_from_stored_pages(root) -> None:
    frames = np.random.default_rng(7).integers(0, 256, (7, 50, 70, 3), np.uint8)
    turn1 = f"<|im_start|>user\n{VIDEO}What happens in the clip?<|im_end|>\n<|im_start|>assistant\n"
    writer = _engine(root)
    first = writer.generate(turn1, GREEDY, video_data=frames)
    turn2 = turn1 + first["text"] + "<|im_end|>\n<|im_start|>user\nAnd then?<|im_end|>\n"
    reader = _engine(root)
    out = reader.generate(turn2, GREEDY, video_data=frames)
    assert (
        out["output_ids"] == _reference().generate(turn2, GREEDY, video_data=frames)["output_ids"]
    )
    assert out["meta_info"]["cached_tokens"] >= first["meta_info"]["prompt_tokens"] // PAGE * PAGE
    assert reader.runner.embedder.stats.as_dict()["encoded_items"] == 0
    reader.scheduler.check_integrity()


def test_a_batch_of_stored_and_new_prefixes_gives_each_its_output(root) -> None:
    prompts = [f"Picture {PH}: number {i}, what is in it, and why?" for i in range(4)]
    images = [[make_image(530 + i)] for i in range(4)]
    expected = _reference(chunked_prefill_size=16).generate(prompts, GREEDY, image_data=images)
    writer = _engine(root)
    writer.generate(prompts[:2], GREEDY, image_data=images[:2])  # two of four stored
    reader = _engine(root, chunked_prefill_size=16)
    out = reader.generate(prompts, GREEDY, image_data=images)
    assert [o["output_ids"] for o in out] == [e["output_ids"] for e in expected]
    cached = [o["meta_info"]["cached_tokens"] for o in out]
    shared = cached[2]  # the words before the image, the same in every prompt
    assert 0 < shared == cached[3] < PAGE and cached[0] == cached[1] > PAGE
    assert _hicache(reader)["tokens_loaded"] == cached[0] + cached[1] - shared
    reader.scheduler.check_integrity()


def test_a_hybrid_model_is_refused_with_a_reason(root) -> None:
    with pytest.raises(ValueError, match="linear-attention state"):
        _engine(root, family="qwen3_5")


def test_a_text_prefix_of_another_fingerprint_is_never_read(root) -> None:
    prompt = "The quick brown fox jumps over the lazy dog. " * 4
    writer = _engine(root)
    writer.generate(prompt, GREEDY)
    writer.shutdown()
    other = _engine(root, kv_cache_dtype="bfloat16")  # another KV dtype: another fingerprint
    out = other.generate(prompt, GREEDY)
    assert out["meta_info"]["cached_tokens"] == 0 and _hicache(other)["tokens_loaded"] == 0
    # Pages of the first fingerprint put under the second's names are refused on arrival.
    w, o = writer.scheduler.hicache.store, other.scheduler.hicache.store
    other.shutdown()
    names = os.listdir(root)
    foreign = [n for n in names if w.fingerprint in n]
    own = [n for n in names if o.fingerprint in n]
    assert foreign and len(own) == len(foreign)
    for mine, theirs in zip(sorted(own), sorted(foreign)):
        with open(os.path.join(root, theirs), "rb") as f, open(os.path.join(root, mine), "wb") as g:
            g.write(f.read())
    third = _engine(root, kv_cache_dtype="bfloat16")
    third.flush_cache()
    third.generate(prompt, GREEDY)
    assert _hicache(third)["tokens_loaded"] == 0 and _hicache(third)["rejected"] >= 1


def test_corrupt_and_truncated_pages_are_deleted_and_computed(root) -> None:
    prompt = "Pack my box with five dozen liquor jugs, then count them twice. " * 3
    expected = _reference().generate(prompt, GREEDY)
    writer = _engine(root)
    writer.generate(prompt, GREEDY)
    writer.shutdown()
    names = sorted(os.listdir(root))
    first, second = (os.path.join(root, n) for n in names[:2])
    for path, damage in ((first, lambda b: b[:-7]), (second, lambda b: b[:-1] + b"\x00")):
        with open(path, "rb") as f:
            blob = f.read()
        with open(path, "wb") as f:
            f.write(damage(blob))
    reader = _engine(root)
    out = reader.generate(prompt, GREEDY)
    assert out["output_ids"] == expected["output_ids"]
    stats = _hicache(reader)
    assert stats["rejected"] >= 1 and stats["errors"] == 0
    reader.shutdown()
    assert len(os.listdir(root)) >= len(names) - 1  # the bad page was rewritten by the reader


def test_an_unreachable_store_fails_no_request() -> None:
    engine = sglang.Engine(
        model_path=model_dir(FAMILY),
        dtype="float32",
        enable_hierarchical_cache=True,
        hicache_storage_backend="redis",
        hicache_storage_backend_extra_config=json.dumps(
            {"url": "redis://127.0.0.1:1/0", "prefetch_threshold": 0}
        ),
        page_size=PAGE,
    )
    prompt = "Nothing listens on port one, so every store operation fails. " * 3
    expected = _reference().generate(prompt, GREEDY)
    for _ in range(2):
        assert engine.generate(prompt, GREEDY)["output_ids"] == expected["output_ids"]
    engine.shutdown()
    stats = _hicache(engine)
    assert stats["errors"] >= 1 and stats["available"] is False and stats["pages_saved"] == 0
    engine.scheduler.check_integrity()


def test_write_back_writes_what_the_radix_cache_evicts(root) -> None:
    prompt = "Sphinx of black quartz, judge my vow; the five boxing wizards jump. " * 3
    engine = _engine(root, hicache_write_policy="write_back")
    engine.generate(prompt, GREEDY)
    engine.scheduler.hicache.drain()
    assert _hicache(engine)["pages_saved"] == 0  # nothing evicted yet
    engine.scheduler.tree.evict(engine.scheduler.tree.evictable_size)
    engine.shutdown()
    assert _hicache(engine)["pages_saved"] > 0
    reader = _engine(root)
    out = reader.generate(prompt, GREEDY)
    assert out["output_ids"] == _reference().generate(prompt, GREEDY)["output_ids"]
    assert out["meta_info"]["cached_tokens"] > 0


# Pieces ----------------------------------------------------------------------------------------
def test_page_keys_name_the_whole_prefix() -> None:
    a = page_keys(list(range(32)), 8, "f")
    assert len(a) == 4 and len(set(a)) == 4
    assert page_keys(list(range(31)), 8, "f") == a[:3]  # only full pages
    b = page_keys([99, *range(1, 32)], 8, "f")
    assert all(x != y for x, y in zip(a, b))  # a change in page 0 renames every later page
    assert page_keys(list(range(32)), 8, "g") != a  # another fingerprint: other names


def test_a_page_round_trips_and_a_foreign_one_is_refused(tmp_path) -> None:
    shapes = [(2, 4), (1, 8)]
    store = KVPageStore(FileBlobs(str(tmp_path)), "f" * 32, 4, shapes, torch.float32)
    page = [torch.randn(4, *shapes[i // 2]) for i in range(4)]
    blob = store.encode("k", page)
    back = store.decode("k", blob)
    assert all(torch.equal(x, y) for x, y in zip(page, back))
    with pytest.raises(InvalidEntry):
        store.decode("other key", blob)
    wider = KVPageStore(FileBlobs(str(tmp_path)), "f" * 32, 4, [(2, 4), (2, 8)], torch.float32)
    with pytest.raises(InvalidEntry):
        wider.decode("k", blob)


@pytest.mark.parametrize(
    "flags, message",
    [
        ({"enable_hierarchical_cache": True}, "storage backend"),
        ({"hicache_storage_backend": "file"}, "needs --enable-hierarchical-cache"),
        (
            {"enable_hierarchical_cache": True, "hicache_storage_backend": "file",
             "hicache_write_policy": "sometimes"},
            "hicache_write_policy",
        ),
        (
            {"enable_hierarchical_cache": True, "hicache_storage_backend": "file",
             "hicache_storage_backend_extra_config": '{"colour": 1}'},
            "unknown hicache extra config",
        ),
        (
            {"enable_hierarchical_cache": True, "hicache_storage_backend": "file",
             "disable_radix_cache": True},
            "radix cache",
        ),
    ],
)  # fmt: skip
def test_bad_hierarchical_cache_flags_are_refused(flags: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ServerArgs(**flags)
