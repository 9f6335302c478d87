"""The shared embedding store: its entry format, its checks on arrival, its failure handling, and
engines sharing a real Redis (started by the test on loopback, stopped after)."""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Iterator

import hypothesis.strategies as st
import pytest
import redis
import torch
from conftest import make_image, model_dir, placeholder
from hypothesis import given, settings
from server_utils import redis_server

import sglang
from sglang.srt.mem_cache.embedding_store import (
    EmbeddingStore,
    InvalidEntry,
    decode_entry,
    encode_entry,
    open_embedding_store,
)
from sglang.srt.mem_cache.mm_embedding_cache import CachedEmbedding
from sglang.srt.mem_cache.store_backend import BlobBackend
from sglang.srt.model_executor.mm_fingerprint import checkpoint_identity

FAMILY = "qwen2_5_vl"
PH = placeholder(FAMILY)
GREEDY = {"temperature": 0, "max_new_tokens": 6}
FP = "f" * 32


def _entry(tokens: int, hidden: int, extras: int, dtype: torch.dtype, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    make = lambda: torch.randn(tokens, hidden, generator=g).to(dtype)  # noqa: E731
    return CachedEmbedding(make(), [make() for _ in range(extras)])


# The entry format -----------------------------------------------------------------------------
@settings(max_examples=40, deadline=None)
@given(
    tokens=st.integers(1, 40),
    hidden=st.integers(1, 24),
    extras=st.integers(0, 3),
    dtype=st.sampled_from([torch.bfloat16, torch.float16, torch.float32]),
    key=st.integers(0, 2**64 - 1),
)
def test_entry_round_trips_bit_for_bit(tokens, hidden, extras, dtype, key) -> None:
    entry = _entry(tokens, hidden, extras, dtype)
    back = decode_entry(encode_entry(entry, FP, key), FP, key, tokens, dtype)
    for a, b in zip((entry.embedding, *entry.extras), (back.embedding, *back.extras), strict=True):
        assert a.dtype == b.dtype and torch.equal(a, b)
        assert b.untyped_storage().nbytes() == b.numel() * b.element_size()  # owns its bytes


@settings(max_examples=60, deadline=None)
@given(cut=st.integers(0, 10_000), flip=st.integers(0, 10_000))
def test_truncated_or_altered_entries_are_rejected(cut: int, flip: int) -> None:
    blob = encode_entry(_entry(5, 8, 1, torch.bfloat16), FP, 7)
    with pytest.raises(InvalidEntry):
        decode_entry(blob[: cut % len(blob)], FP, 7, 5)
    altered = bytearray(blob)
    altered[flip % len(blob)] ^= 0x20
    with contextlib.suppress(InvalidEntry):  # a flip inside JSON whitespace may be harmless...
        back = decode_entry(bytes(altered), FP, 7, 5)
        assert torch.equal(back.embedding, decode_entry(blob, FP, 7, 5).embedding)  # ...only


@pytest.mark.parametrize(
    "reader",
    [
        {"fingerprint": "0" * 32},  # another model or processor
        {"key": 8},  # stored under another item's name
        {"num_tokens": 6},  # the item needs another token count
        {"dtype": torch.float32},  # the reader runs in another dtype
    ],
)
def test_entry_for_another_reader_is_rejected(reader: dict) -> None:
    blob = encode_entry(_entry(5, 8, 0, torch.bfloat16), FP, 7)
    expected = {"fingerprint": FP, "key": 7, "num_tokens": 5, "dtype": torch.bfloat16}
    decode_entry(blob, **expected)
    with pytest.raises(InvalidEntry):
        decode_entry(blob, **{**expected, **reader})


def test_nothing_but_tensors_is_decoded() -> None:
    for blob in (b"", b"\x80\x04K\x01.", b"SGLEMB01\xff\xff\xff\x7f{}", b"SGLEMB01\x02\0\0\0{}"):
        with pytest.raises(InvalidEntry):
            decode_entry(blob, FP, 7, 5)


# Failure handling, on a backend that fails on demand ------------------------------------------
class FlakyBlobs(BlobBackend):
    kind = "memory"

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}
        self.failing = False
        self.calls = 0

    def _op(self) -> None:
        self.calls += 1
        if self.failing:
            raise ConnectionError("store is down")

    def get_many(self, names):
        self._op()
        return [self.data.get(n) for n in names]

    def put_many(self, blobs, ttl_s):
        self._op()
        self.data.update(blobs)

    def exists(self, name):
        self._op()
        return name in self.data

    def delete(self, name):
        self._op()
        self.data.pop(name, None)


def FlakyStore(retry_after_s: float) -> EmbeddingStore:
    return EmbeddingStore(FlakyBlobs(), FP, None, retry_after_s)


def test_a_failing_store_reads_as_empty_and_is_left_alone_until_retry() -> None:
    store = FlakyStore(retry_after_s=0.3)
    entry = _entry(3, 4, 0, torch.float32)
    store.save({1: entry})
    assert store.exists(1) and torch.equal(store.load({1: 3})[1].embedding, entry.embedding)
    store.blobs.failing = True
    assert store.load({1: 3}) == {} and not store.available
    calls = store.blobs.calls
    assert store.load({1: 3}) == {} and store.save({2: entry}) is None and not store.exists(1)
    assert store.blobs.calls == calls  # not tried while marked down
    assert store.guard.errors == 1 and store.guard.skipped == 3
    store.blobs.failing = False
    time.sleep(0.35)
    assert store.available and 1 in store.load({1: 3})
    assert store.stats()["last_error"] == "ConnectionError: store is down"


def test_rejected_entries_are_deleted_and_counted() -> None:
    store = FlakyStore(retry_after_s=1)
    store.blobs.data[store.name(1)] = encode_entry(_entry(3, 4, 0, torch.float32), FP, 1)[:-1]
    assert store.load({1: 3}) == {} and store.counters.rejected == 1
    assert store.name(1) not in store.blobs.data


# Checkpoint identity --------------------------------------------------------------------------
def test_checkpoint_identity_sees_a_fine_tune_of_the_same_shape(tmp_path) -> None:
    import shutil

    from safetensors.torch import load_file, save_file

    src = model_dir(FAMILY)
    copy = tmp_path / "copy"
    shutil.copytree(src, copy)
    assert checkpoint_identity(src) == checkpoint_identity(str(copy))
    (weights,) = copy.glob("*.safetensors")
    tensors = load_file(weights)
    name = next(n for n in tensors if "visual" in n and n.endswith("weight"))
    tensors = {k: v + 1e-3 if k != name else v for k, v in tensors.items()}  # all but one moved
    save_file(tensors, weights, metadata={"format": "pt"})
    assert checkpoint_identity(src) != checkpoint_identity(str(copy))


# Engines sharing a real Redis -----------------------------------------------------------------
@pytest.fixture
def store_url() -> Iterator[str]:
    with redis_server("--maxmemory", "64mb", "--maxmemory-policy", "allkeys-lru") as (url, _):
        yield url


def _engine(url: str, **kwargs) -> sglang.Engine:
    return sglang.Engine(
        model_path=model_dir(FAMILY),
        dtype="float32",
        enable_mm_global_cache=True,
        mm_global_cache_url=url,
        chunked_prefill_size=20,  # chunks cut through the 25-token images
        **kwargs,
    )


def _store(engine: sglang.Engine) -> dict:
    return engine.get_server_info()["mm_global_cache"]


def _encoded(engine: sglang.Engine) -> int:
    return engine.get_server_info()["mm_embedding_cache"]["encoded_items"]


PROMPT = f"One {PH} two {PH} end"


def _images(offset: int = 0) -> list:
    return [make_image(300 + offset), make_image(301 + offset)]


def test_a_second_engine_encodes_nothing_the_first_encoded(store_url: str) -> None:
    first = _engine(store_url)
    out = first.generate(PROMPT, GREEDY, image_data=_images())
    assert _encoded(first) == 2 and _store(first)["saved"] == 2
    reference = sglang.Engine(model_path=model_dir(FAMILY), dtype="float32")
    assert (
        out["output_ids"] == reference.generate(PROMPT, GREEDY, image_data=_images())["output_ids"]
    )
    second = _engine(store_url)  # a restarted worker, or another worker of the fleet
    again = second.generate(PROMPT, GREEDY, image_data=_images())
    assert again["output_ids"] == out["output_ids"]
    assert _encoded(second) == 0 and _store(second)["hits"] == 2
    assert [item["source"] for item in again["meta_info"]["mm_items"]] == ["global_cache"] * 2
    assert second.runner.embedder.preprocess.num_preprocessed == 0
    second.scheduler.check_integrity()


def test_entries_of_another_fingerprint_are_never_read(store_url: str) -> None:
    _engine(store_url).generate(PROMPT, GREEDY, image_data=_images(10))
    other = _engine(store_url, mm_global_cache_namespace="another deployment")
    other.generate(PROMPT, GREEDY, image_data=_images(10))
    assert _encoded(other) == 2 and _store(other)["hits"] == 0
    # An entry of the first fingerprint copied under the second's name is refused on arrival.
    client = redis.Redis.from_url(store_url)
    first_names = {
        n
        for n in client.keys("sglang:mm:*")
        if other.runner.embedder.store.fingerprint not in n.decode()
    }
    third = _engine(store_url, mm_global_cache_namespace="a third one")
    fingerprint = third.runner.embedder.store.fingerprint
    for name in first_names:
        forged = name.decode().split(":")
        forged[2] = fingerprint
        client.set(":".join(forged), client.get(name))
    third.generate(PROMPT, GREEDY, image_data=_images(10))
    assert _encoded(third) == 2 and _store(third)["rejected"] == 2


def test_a_corrupt_or_truncated_entry_is_rejected_and_encoded_again(store_url: str) -> None:
    first = _engine(store_url)
    out = first.generate(PROMPT, GREEDY, image_data=_images(20))
    client = redis.Redis.from_url(store_url)
    names = sorted(client.keys("sglang:mm:*"))
    assert len(names) == 2
    truncated, corrupt = names
    client.set(truncated, client.get(truncated)[:-100])
    flipped = bytearray(client.get(corrupt))
    flipped[-10] ^= 0xFF
    client.set(corrupt, bytes(flipped))
    second = _engine(store_url)
    again = second.generate(PROMPT, GREEDY, image_data=_images(20))
    assert again["output_ids"] == out["output_ids"]
    assert _encoded(second) == 2 and _store(second)["rejected"] == 2
    # Re-encoded entries replace the bad ones: a third engine reads both.
    third = _engine(store_url)
    third.generate(PROMPT, GREEDY, image_data=_images(20))
    assert _encoded(third) == 0 and _store(third)["hits"] == 2


def test_a_store_killed_mid_run_fails_no_request() -> None:
    with redis_server() as (url, proc):
        engine = _engine(url, mm_global_cache_timeout=0.5)
        reference = engine.generate(PROMPT, GREEDY, image_data=_images(30))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        outs = [engine.generate(PROMPT, GREEDY, image_data=_images(40 + 10 * i)) for i in range(2)]
        assert all(len(o["output_ids"]) == GREEDY["max_new_tokens"] for o in outs)
        stats = _store(engine)
        assert stats["errors"] >= 1 and stats["skipped"] >= 1 and not stats["available"]
        assert _encoded(engine) == 6
        again = engine.generate(PROMPT, GREEDY, image_data=_images(30))  # local cache still hits
        assert again["output_ids"] == reference["output_ids"]
        engine.scheduler.check_integrity()


def test_store_open_refuses_unknown_schemes_and_flags_that_cannot_share() -> None:
    with pytest.raises(ValueError, match="redis"):
        open_embedding_store("memcached://127.0.0.1:1", FP, None, 1.0)
    with pytest.raises(ValueError, match="per-image"):
        sglang.Engine(
            model_path=model_dir(FAMILY), enable_mm_global_cache=True, mm_cache_mode="combined"
        )
    with pytest.raises(ValueError, match="redis"):
        sglang.Engine(model_path=model_dir(FAMILY), mm_global_cache_url="http://127.0.0.1:80")
