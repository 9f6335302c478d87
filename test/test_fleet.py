"""A fleet behind the real sglang-router: two workers, round-robin, an 8-turn image chat whose
turns alternate between the workers. With the shared embedding store (a real Redis started here)
each image is encoded once across the fleet and a restarted worker encodes nothing; without it,
a worker re-encodes the images the other one saw."""

from __future__ import annotations

import base64
import contextlib
import io
import socket
from collections.abc import Iterator

import httpx
import pytest
import torch
from conftest import make_image, model_dir
from server_utils import free_port, launch_router, launch_server, redis_server

from sglang.srt.mem_cache.embedding_store import decode_entry
from sglang.srt.multimodal.remote_encoder import unpack_reply
from sglang_dev.video_clips import encode_clip, random_frames

FAMILY = "qwen2_5_vl"
TURNS = 8
WORKER_FLAGS = ("--chunked-prefill-size", "64", "--max-total-tokens", "8192")


def _image_part(seed: int) -> dict:
    buf = io.BytesIO()
    make_image(seed, 64, 48).save(buf, format="PNG")
    data = base64.b64encode(buf.getvalue()).decode()
    return {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{data}"}}


def _play_chat(url: str, turns: int = TURNS) -> tuple[list[str], list[dict]]:
    """An image chat of ``turns`` rounds, one new image per round; (replies, its messages)."""
    messages: list[dict] = []
    replies = []
    for turn in range(turns):
        text = {"type": "text", "text": f"Round {turn}: what changed?"}
        messages.append({"role": "user", "content": [_image_part(500 + turn), text]})
        body = {"messages": messages, "max_tokens": 4, "temperature": 0, "ignore_eos": True}
        resp = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120)
        assert resp.status_code == 200, resp.text
        reply = resp.json()["choices"][0]["message"]["content"]
        replies.append(reply)
        messages.append({"role": "assistant", "content": reply})
    return replies, messages


def _info(url: str) -> dict:
    return httpx.get(f"{url}/server_info", timeout=30).json()


def _encoded(urls: list[str]) -> list[int]:
    return [_info(u)["mm_embedding_cache"]["encoded_items"] for u in urls]


@contextlib.contextmanager
def _fleet(*flags: str) -> Iterator[tuple[str, list[str]]]:
    with contextlib.ExitStack() as stack:
        workers = [
            stack.enter_context(launch_server(model_dir(FAMILY), *WORKER_FLAGS, *flags))
            for _ in "ab"
        ]
        urls = [url for url, _ in workers]
        router = stack.enter_context(launch_router(urls, "--policy", "round_robin"))
        yield router, urls


@pytest.fixture(scope="module")
def alone() -> tuple[list[str], list[int]]:
    """The chat on a fleet without the store: (replies, encodes per worker)."""
    with _fleet() as (router, urls):
        replies, _ = _play_chat(router)
        return replies, _encoded(urls)


def test_round_robin_fleet_encodes_each_image_once_with_the_shared_store(alone) -> None:
    replies_alone, encoded_alone = alone
    assert all(encoded_alone) and sum(encoded_alone) > TURNS  # each worker re-encodes
    with redis_server("--maxmemory", "64mb", "--maxmemory-policy", "allkeys-lru") as (store, _):
        flags = ("--enable-mm-global-cache", "--mm-global-cache-url", store)
        with _fleet(*flags) as (router, urls):
            replies, messages = _play_chat(router)
            encoded = _encoded(urls)
            hits = [_info(u)["mm_global_cache"]["hits"] for u in urls]
        assert replies == replies_alone  # float32: shared embeddings change no token
        assert sum(encoded) == TURNS and all(encoded), encoded
        assert sum(hits) > 0

        # A worker started after the chat (a restart) encodes nothing for it.
        with launch_server(model_dir(FAMILY), *WORKER_FLAGS, *flags) as (url, _):
            body = {"messages": messages[:-1], "max_tokens": 4, "temperature": 0}
            resp = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120)
            assert resp.status_code == 200, resp.text
            assert resp.json()["choices"][0]["message"]["content"] == replies[-1]
            info = _info(url)
            assert info["mm_embedding_cache"]["encoded_items"] == 0
            assert info["mm_global_cache"]["hits"] == TURNS


# Encoder disaggregation ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def encoder() -> Iterator[str]:
    with launch_server(model_dir(FAMILY), "--encoder-only") as (url, _):
        yield url


def _language_flags(*encoders: str) -> tuple[str, ...]:
    return (*WORKER_FLAGS, "--language-only", "--encoder-urls", *encoders)


def test_encoder_and_language_workers_serve_the_chat_with_parity(alone, encoder) -> None:
    replies_alone, _ = alone
    info = _info(encoder)
    memory = info["memory"]
    assert info["encoder_only"] and memory["language_model_weights_bytes"] < 2048
    before = info["mm_embedding_cache"]["encoded_items"]
    with contextlib.ExitStack() as stack:
        urls = [
            stack.enter_context(launch_server(model_dir(FAMILY), *_language_flags(encoder)))[0]
            for _ in "ab"
        ]
        router = stack.enter_context(launch_router(urls, "--policy", "round_robin"))
        replies, _ = _play_chat(router)
        assert _encoded(urls) == [0, 0]
        remote = [_info(u)["encoder_workers"] for u in urls]
    assert replies == replies_alone  # float32: the encoder's embeddings are the local ones
    assert all(r["remote_items"] > 0 and r["remote_failures"] == 0 for r in remote)
    assert _info(encoder)["mm_embedding_cache"]["encoded_items"] - before == TURNS


@contextlib.contextmanager
def _silent_port() -> Iterator[str]:
    """A port that accepts connections and never answers (a hung encoder)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"


def test_an_encoder_that_is_down_slow_or_foreign_fails_no_request(alone, encoder) -> None:
    replies_alone, _ = alone
    dead = f"http://127.0.0.1:{free_port()}"
    timeout = ("--encoder-timeout", "2")
    with _silent_port() as hung:
        cases = {
            "down": _language_flags(dead),
            "hung": (*_language_flags(hung), *timeout),
            "foreign": (*_language_flags(encoder), "--mm-global-cache-namespace", "other"),
        }
        for name, flags in cases.items():
            with launch_server(model_dir(FAMILY), *flags) as (url, _):
                replies, _ = _play_chat(url, turns=2)
                stats = _info(url)["encoder_workers"]
                assert replies == replies_alone[:2], name
                assert stats["remote_items"] == 0 and stats["remote_failures"] == 1, name
                assert stats["remote_skipped"] == 1, name  # not tried again for 10 s
                assert _encoded([url]) == [2], name


def test_encode_refuses_bad_requests_and_keeps_serving(encoder) -> None:
    fingerprint = _info(encoder)["fingerprint"]
    pixels = {"shape": [48, 64, 3], "data": base64.b64encode(bytes(48 * 64 * 3)).decode()}
    good = {"key": "00" * 8, "modality": "image", "num_tokens": 24, "pixels": pixels}
    bad_items = [
        {**good, "pixels": {**pixels, "data": "not base64!"}},
        {**good, "pixels": {**pixels, "shape": [48, 65, 3]}},  # bytes do not fill the shape
        {**good, "pixels": {**pixels, "shape": [10**5, 10**5, 3]}},  # over the pixel limit
        {**good, "modality": "audio"},
        {**good, "num_tokens": 25},  # the image has 24 rows
        {**good, "encoded": base64.b64encode(b"GIF89a-corrupt").decode(), "pixels": None},
        {"key": "zz"},
    ]
    for item in bad_items:
        resp = httpx.post(
            f"{encoder}/encode", json={"fingerprint": fingerprint, "items": [item]}, timeout=60
        )
        assert resp.status_code == 400, (item, resp.text)
    resp = httpx.post(f"{encoder}/encode", content=b"{not json", timeout=60)
    assert resp.status_code == 400
    resp = httpx.post(
        f"{encoder}/encode", json={"fingerprint": "0" * 32, "items": [good]}, timeout=60
    )
    assert resp.status_code == 409 and "fingerprint" in resp.text
    resp = httpx.post(
        f"{encoder}/encode", json={"fingerprint": fingerprint, "items": [good]}, timeout=60
    )
    assert resp.status_code == 200
    (blob,) = unpack_reply(resp.content, 1)
    assert decode_entry(blob, fingerprint, 0, 24).num_tokens == 24
    # The encoder's cache is keyed by the pixels, not by the key a sender claims: the same
    # pixels under another key are a hit, returned under that key.
    encoded = _info(encoder)["mm_embedding_cache"]["encoded_items"]
    other = {"fingerprint": fingerprint, "items": [{**good, "key": "ab" * 8}]}
    resp = httpx.post(f"{encoder}/encode", json=other, timeout=60)
    (again,) = unpack_reply(resp.content, 1)
    assert torch.equal(
        decode_entry(again, fingerprint, 0xABABABABABABABAB, 24).embedding,
        decode_entry(blob, fingerprint, 0, 24).embedding,
    )
    assert _info(encoder)["mm_embedding_cache"]["encoded_items"] == encoded
    assert httpx.get(f"{encoder}/health_generate", timeout=60).status_code == 200


def _clip_part(seed: int) -> dict:
    clip = encode_clip(random_frames(seed, 12, 48, 64), 4.0, "mp4", "libx264", 10)
    url = "data:video/mp4;base64," + base64.b64encode(clip).decode()
    return {"type": "video_url", "video_url": {"url": url}}


def _ask(url: str, parts: list[dict]) -> str:
    content = [*parts, {"type": "text", "text": "Describe."}]
    body = {"messages": [{"role": "user", "content": content}], "max_tokens": 4, "temperature": 0}
    resp = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120)
    assert resp.status_code == 200, resp.text
    return resp.json()["choices"][0]["message"]["content"]


def test_two_encoders_share_a_request_and_encode_video_frame_groups(encoder) -> None:
    requests = {
        "images": [_image_part(600 + i) for i in range(4)],
        "video": [_clip_part(7)],
    }
    with contextlib.ExitStack() as stack:
        second = stack.enter_context(launch_server(model_dir(FAMILY), "--encoder-only"))[0]
        encoders = [encoder, second]
        before = _encoded(encoders)
        language = stack.enter_context(
            launch_server(model_dir(FAMILY), *_language_flags(*encoders))
        )[0]
        plain = stack.enter_context(launch_server(model_dir(FAMILY), *WORKER_FLAGS))[0]
        for name, parts in requests.items():
            assert _ask(language, parts) == _ask(plain, parts), name
        after = _encoded(encoders)
        assert _encoded([language]) == [0]
        stats = _info(language)["encoder_workers"]
    assert all(a > b for a, b in zip(after, before)), (before, after)  # both took a share
    groups = sum(after) - sum(before) - len(requests["images"])
    assert groups >= 2 and stats["remote_failures"] == 0  # the video went as frame groups


def test_encoder_sheds_load_past_its_queue_and_answers_health_while_busy(monkeypatch) -> None:
    """The app over a runner whose encode blocks: health answers at once, requests past the
    queue bound get 503 (their senders encode locally), the queued one completes."""
    import asyncio
    import threading
    from types import SimpleNamespace

    from sglang.srt.entrypoints import encode_server
    from sglang.srt.mem_cache.mm_embedding_cache import CachedEmbedding
    from sglang.srt.server_args import ServerArgs

    release = threading.Event()

    def encode(items):
        release.wait(30)
        return {it.hash: CachedEmbedding(torch.zeros(it.num_tokens, 4)) for it in items}

    runner = SimpleNamespace(fingerprint="f" * 32, encode=encode)
    monkeypatch.setattr(encode_server, "MAX_WAITING_REQUESTS", 1)
    app = encode_server.create_encoder_app(runner, ServerArgs())
    pixels = {"shape": [8, 8, 3], "data": base64.b64encode(bytes(192)).decode()}
    body = {"fingerprint": "f" * 32, "items": [{"key": "01" * 8, "modality": "image",
                                                 "num_tokens": 3, "pixels": pixels}]}  # fmt: skip

    async def scenario() -> list[int]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://encoder") as client:
            first = asyncio.create_task(client.post("/encode", json=body))
            await asyncio.sleep(0.2)
            health = await client.get("/health")
            second = await client.post("/encode", json=body)
            release.set()
            return [health.status_code, second.status_code, (await first).status_code]

    assert asyncio.run(scenario()) == [200, 503, 200]


def test_a_served_chat_outlives_its_store(alone) -> None:
    replies_alone, _ = alone
    with redis_server() as (store, proc):
        flags = (*WORKER_FLAGS, "--enable-mm-global-cache", "--mm-global-cache-url", store)
        with launch_server(model_dir(FAMILY), *flags) as (url, _):
            first, _ = _play_chat(url, turns=2)
            proc.kill()
            proc.wait()
            replies, _ = _play_chat(url, turns=4)  # the first two turns again, then two new
            stats = _info(url)["mm_global_cache"]
    assert first == replies_alone[:2] and replies == replies_alone[:4]
    assert stats["saved"] == 2 and stats["errors"] >= 1 and not stats["available"]
