"""Prefix KV shared across a fleet (real processes, a real Redis on loopback): two round-robin
workers behind the real sglang-router serve an 8-round image chat in which each round's worker
prefills only the round's new tokens, as one sticky worker does; a restarted worker and the
survivor of a killed worker serve the next turn from the store; the store killed mid-run fails
no request."""

from __future__ import annotations

import base64
import contextlib
import io
import json
import os
import re
import signal
import subprocess
from collections.abc import Iterator

import httpx
import psutil
import pytest
from conftest import make_image, model_dir
from server_utils import healthy_workers, launch_router, launch_server, redis_server, wait_until

FAMILY = "qwen2_5_vl"
TURNS = 8
PAGE = 16
BASE_FLAGS = ("--chunked-prefill-size", "64", "--max-total-tokens", "8192", "--enable-cache-report")


def _tier_flags(store: str) -> tuple[str, ...]:
    extra = {"url": store, "prefetch_threshold": 0}
    return (
        *BASE_FLAGS,
        "--enable-hierarchical-cache",
        "--hicache-storage-backend", "redis",
        "--hicache-storage-backend-extra-config", json.dumps(extra),
        "--page-size", str(PAGE),
        "--enable-mm-global-cache", "--mm-global-cache-url", store,
        "--enable-metrics",
    )  # fmt: skip


def _image_part(seed: int) -> dict:
    buf = io.BytesIO()
    make_image(seed, 64, 48).save(buf, format="PNG")
    data = base64.b64encode(buf.getvalue()).decode()
    return {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{data}"}}


def _round(url: str, messages: list[dict]) -> tuple[str, int, int]:
    """(reply, prompt tokens, cached tokens) of one chat request."""
    body = {"messages": messages, "max_tokens": 4, "temperature": 0, "ignore_eos": True}
    resp = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120)
    assert resp.status_code == 200, resp.text
    out = resp.json()
    usage = out["usage"]
    cached = usage["prompt_tokens_details"]["cached_tokens"]
    return out["choices"][0]["message"]["content"], usage["prompt_tokens"], cached


def _user(turn: int, seed: int) -> dict:
    text = {"type": "text", "text": f"Round {turn}: what changed in this picture?"}
    return {"role": "user", "content": [_image_part(seed + turn), text]}


def _play(
    urls: list[str], seed: int = 700, turns: int = TURNS, messages: list[dict] | None = None
) -> dict:
    """A chat with one new image per round, round r sent to ``urls[r % len(urls)]``: its
    replies, prompt and cached tokens per round, and its messages."""
    messages = list(messages or [])
    out: dict[str, list] = {"replies": [], "prompt": [], "cached": []}
    start = sum(m["role"] == "user" for m in messages)
    for turn in range(start, start + turns):
        messages.append(_user(turn, seed))
        reply, prompt, cached = _round(urls[turn % len(urls)], messages)
        messages.append({"role": "assistant", "content": reply})
        for k, v in zip(("replies", "prompt", "cached"), (reply, prompt, cached)):
            out[k].append(v)
    out["messages"] = messages
    return out


def _info(url: str) -> dict:
    return httpx.get(f"{url}/server_info", timeout=30).json()


def _new_tokens(chat: dict, turn: int) -> int:
    return chat["prompt"][turn] - chat["cached"][turn]


@pytest.fixture(scope="module")
def sticky() -> dict[int, dict]:
    """Two chats (by image seed) on one worker without any store: the reference replies and
    the prefill of a worker that holds the whole conversation."""
    with launch_server(model_dir(FAMILY), *BASE_FLAGS) as (url, _):
        return {seed: _play([url], seed) for seed in (700, 800)}


@pytest.fixture(scope="module")
def store() -> Iterator[tuple[str, subprocess.Popen]]:
    flags = ("--maxmemory", "256mb", "--maxmemory-policy", "allkeys-lru")
    with redis_server(*flags) as (url, proc):
        yield url, proc


@pytest.fixture(scope="module")
def fleet(store) -> Iterator[tuple[str, list[tuple[str, int]]]]:
    """Two workers with the KV tier behind a round-robin router: (router, [(url, pid)])."""
    with contextlib.ExitStack() as stack:
        workers = [
            stack.enter_context(launch_server(model_dir(FAMILY), *_tier_flags(store[0])))
            for _ in "ab"
        ]
        health = ("--health-check-interval-secs", "1", "--health-failure-threshold", "2")
        urls = [u for u, _ in workers]
        router = stack.enter_context(launch_router(urls, "--policy", "round_robin", *health))
        yield router, workers


def test_round_robin_workers_prefill_only_each_rounds_new_tokens(sticky, store, fleet) -> None:
    router, workers = fleet
    chat, reference = _play([router]), sticky[700]
    infos = [_info(u) for u, _ in workers]
    assert chat["replies"] == reference["replies"]  # float32: loaded KV changes no token
    assert chat["prompt"] == reference["prompt"]
    for turn in range(1, TURNS):  # the previous round ran on the other worker
        assert _new_tokens(chat, turn) <= _new_tokens(reference, turn) + PAGE, turn
    loaded = [i["hicache"]["tokens_loaded"] for i in infos]
    assert all(loaded), loaded
    assert sum(i["mm_embedding_cache"]["encoded_items"] for i in infos) == TURNS

    # A worker started after the chat (a restart) prefills only the last round's new tokens.
    with launch_server(model_dir(FAMILY), *_tier_flags(store[0])) as (url, _):
        reply, prompt, cached = _round(url, chat["messages"][:-1])
        info = _info(url)
    assert reply == reference["replies"][-1]
    assert prompt - cached <= _new_tokens(reference, TURNS - 1) + PAGE
    assert info["mm_embedding_cache"]["encoded_items"] == 0


def test_the_survivor_of_a_killed_worker_serves_the_next_turn_from_the_store(sticky, fleet) -> None:
    router, workers = fleet
    urls = [u for u, _ in workers]
    encoded_before = [_info(u)["mm_embedding_cache"]["encoded_items"] for u in urls]
    first = _play([router], seed=800, turns=3)
    # Rounds 0 and 2 ran on one worker, which encoded their images (the store held round 1's):
    # that one holds the conversation's latest KV, and is killed.
    encoded = [
        _info(u)["mm_embedding_cache"]["encoded_items"] - e for u, e in zip(urls, encoded_before)
    ]
    assert sorted(encoded) == [1, 2], encoded
    victim_url, victim_pid = workers[encoded.index(2)]
    children = psutil.Process(victim_pid).children(recursive=True)
    os.kill(victim_pid, signal.SIGKILL)
    for child in children:
        with contextlib.suppress(psutil.NoSuchProcess):
            child.kill()
    survivor = next(u for u in urls if u != victim_url)
    wait_until(lambda: healthy_workers(router) == {survivor}, 30, "the router kept it")
    rest = _play([router], seed=800, turns=2, messages=first["messages"])
    reference = sticky[800]
    assert first["replies"] + rest["replies"] == reference["replies"][:5]
    for turn in range(2):
        assert (
            rest["prompt"][turn] - rest["cached"][turn] <= _new_tokens(reference, 3 + turn) + PAGE
        )


def test_a_store_killed_mid_run_fails_no_request(sticky, store, fleet) -> None:
    router, _ = fleet  # one worker left; its radix cache is flushed, the store holds the chat
    (worker,) = healthy_workers(router)
    assert httpx.post(f"{worker}/flush_cache", timeout=30).status_code == 200
    first = _play([worker], turns=2)
    assert first["cached"][1] > 0
    store[1].kill()
    store[1].wait()
    rest = _play([worker], turns=2, messages=first["messages"])
    info = _info(worker)
    metrics = httpx.get(f"{worker}/metrics", timeout=30).text
    assert first["replies"] + rest["replies"] == sticky[700]["replies"][:4]
    stats = info["hicache"]
    assert stats["errors"] >= 1 and stats["available"] is False
    assert re.search(r"^sglang:hicache_available\{[^}]*\} 0\.0$", metrics, re.M)
    assert re.search(r"^sglang:hicache_errors\{[^}]*\} [1-9]", metrics, re.M)
