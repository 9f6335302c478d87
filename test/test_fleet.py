"""A fleet behind the real sglang-router: two workers, round-robin, an 8-turn image chat whose
turns alternate between the workers. With the shared embedding store (a real Redis started here)
each image is encoded once across the fleet and a restarted worker encodes nothing; without it,
a worker re-encodes the images the other one saw."""

from __future__ import annotations

import base64
import contextlib
import io
from collections.abc import Iterator

import httpx
import pytest
from conftest import make_image, model_dir
from server_utils import launch_router, launch_server, redis_server

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
