"""Behind sglang-router: two real workers and the real router (a test dependency) on loopback.

What the router (0.3.2) was seen to do with a worker: ``GET /health``, ``/server_info`` and
``/model_info`` when it registers it; ``GET /health`` on its health-check interval;
``GET /get_load`` for its own ``GET /get_loads`` and, under ``power_of_two``, every 30 s; requests
re-serialized (chat ``max_tokens`` arrives as ``max_completion_tokens``, plus defaults of its own
for fields such as ``logprobs`` and ``separate_reasoning``).
"""

from __future__ import annotations

import base64
import contextlib
import io
import os
import signal
import threading
from collections.abc import Iterator

import httpx
import psutil
import pytest
from conftest import make_image, model_dir
from server_utils import healthy_workers, launch_router, launch_server, wait_until

import sglang

FAMILY = "qwen2_5_vl"  # the default tiny model
WORKER_FLAGS = (
    "--enable-cache-report",
    "--max-total-tokens",
    "4096",
    "--context-length",
    "2048",
    "--chunked-prefill-size",
    "256",
    "--max-running-requests",
    "2",
)
# Fast enough to see a dead worker within seconds; lenient enough for a busy 2-core machine.
HEALTH_FLAGS = (
    "--health-check-interval-secs",
    "1",
    "--health-failure-threshold",
    "2",
    "--health-check-timeout-secs",
    "10",
)
ROUTING_KEY = "X-SMG-Routing-Key"
TIMEOUT = 120


@pytest.fixture(scope="module")
def workers() -> Iterator[list[tuple[str, int]]]:
    """Two workers: [(url, pid)]. The failover test kills one, so it runs last."""
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(launch_server(model_dir(FAMILY), *WORKER_FLAGS)) for _ in "ab"]


@pytest.fixture(scope="module")
def urls(workers) -> list[str]:
    return [url for url, _ in workers]


@pytest.fixture(scope="module")
def manual_router(urls) -> Iterator[str]:
    with launch_router(urls, "--policy", "manual", *HEALTH_FLAGS) as url:
        yield url


@pytest.fixture(scope="module")
def cache_router(urls) -> Iterator[str]:
    with launch_router(urls, "--policy", "cache_aware", *HEALTH_FLAGS) as url:
        yield url


# Helpers -----------------------------------------------------------------------------------------
def _info(url: str) -> dict:
    return httpx.get(f"{url}/server_info", timeout=30).json()


def _image_part(seed: int) -> dict:
    buf = io.BytesIO()
    make_image(seed, 64, 48).save(buf, format="PNG")
    data = base64.b64encode(buf.getvalue()).decode()
    return {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{data}"}}


def _chat(router: str, messages: list[dict], headers: dict | None = None, **extra) -> dict:
    body = {"messages": messages, "max_tokens": 4, "temperature": 0, "ignore_eos": True, **extra}
    resp = httpx.post(
        f"{router}/v1/chat/completions", json=body, headers=headers or {}, timeout=TIMEOUT
    )
    assert resp.status_code == 200, resp.text
    return resp.json()


def _served_by(before: list[dict], after: list[dict]) -> int:
    """The one worker whose scheduler ran between two snapshots."""
    stepped = [
        i for i, (b, a) in enumerate(zip(before, after)) if a["forward_steps"] > b["forward_steps"]
    ]
    assert len(stepped) == 1, stepped
    return stepped[0]


def _encoded(infos: list[dict]) -> list[int]:
    return [info["mm_embedding_cache"]["encoded_items"] for info in infos]


def _router_loads(router: str) -> dict[str, int]:
    loads = httpx.get(f"{router}/get_loads", timeout=30).json()["workers"]
    return {entry["worker"]: entry["load"] for entry in loads}


def _worker_load(url: str) -> dict:
    (entry,) = httpx.get(f"{url}/get_load", timeout=30).json()
    return entry


@contextlib.contextmanager
def _streaming(url: str, n: int, max_new_tokens: int = 1000, headers: dict | None = None):
    """n long streaming /generate requests running in the background; leaving the block closes
    them (a closed stream aborts its request). Yields the list of per-request outcomes."""
    stop = threading.Event()
    outcomes: list[str] = []

    def run(i: int) -> None:
        body = {
            "text": f"Long story number {i} about a little red house",
            "sampling_params": {"max_new_tokens": max_new_tokens, "ignore_eos": True},
            "stream": True,
        }
        try:
            with httpx.stream(
                "POST", f"{url}/generate", json=body, headers=headers or {}, timeout=TIMEOUT
            ) as resp:
                for line in resp.iter_lines():
                    if stop.is_set():
                        outcomes.append("closed")
                        return
                    if line == "data: [DONE]":
                        outcomes.append("done")
                        return
            outcomes.append("cut")
        except httpx.HTTPError as exc:
            outcomes.append(f"error: {type(exc).__name__}")

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    try:
        yield outcomes
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=TIMEOUT)
        assert not any(t.is_alive() for t in threads), "a stream did not end"


def _queued_load(url: str) -> dict | None:
    """The worker's load once two requests run and one waits (not while they arrive)."""
    entry = _worker_load(url)
    return entry if entry["num_waiting_reqs"] == 1 and entry["num_reqs"] == 3 else None


def _wait_idle(urls: list[str]) -> None:
    wait_until(lambda: all(_worker_load(u)["num_reqs"] == 0 for u in urls), 60, "workers stay busy")


# The load report, exactly ------------------------------------------------------------------------
def test_load_report_counts_running_waiting_and_held_tokens() -> None:
    engine = sglang.Engine(dtype="float32", model_path=model_dir(FAMILY), max_running_requests=1)
    tokenized, _ = engine.tokenize(
        ["hello there my friend", "once upon a time in a land"],
        {"max_new_tokens": 3, "temperature": 0},
        None,
        None,
    )
    first, second = (len(t.input_ids) for t in tokenized)
    reqs = [engine.scheduler.add_request(t) for t in tokenized]

    def load() -> dict:
        return engine.get_server_info()["load"]

    assert load() == {
        "dp_rank": 0,
        "num_reqs": 2,
        "num_waiting_reqs": 2,
        "num_tokens": first + second,  # prompts waiting for KV slots
    }
    engine.scheduler.step()  # prefill of the first request; the second waits (one may run)
    assert load() == {
        "dp_rank": 0,
        "num_reqs": 2,
        "num_waiting_reqs": 1,
        "num_tokens": first + second,  # the first prompt's KV, the second prompt waiting
    }
    engine.scheduler.step()  # one decode step: one more slot held
    assert load()["num_tokens"] == first + 1 + second
    while not all(r.finished for r in reqs):
        engine.scheduler.step()
    # Finished prefixes stay cached but can be evicted at will: they are not load.
    assert engine.scheduler.tree.evictable_size > 0
    assert load() == {"dp_rank": 0, "num_reqs": 0, "num_waiting_reqs": 0, "num_tokens": 0}


# What the router reads from a worker -------------------------------------------------------------
def test_worker_reports_what_the_router_reads(urls) -> None:
    info = _info(urls[0])
    assert info["dp_size"] == 1 and info["version"] == sglang.__version__
    assert info["model_path"] == model_dir(FAMILY)
    model = httpx.get(f"{urls[0]}/model_info").json()
    assert model["model_type"] == FAMILY
    assert model["architectures"] == ["Qwen2_5_VLForConditionalGeneration"]
    assert httpx.get(f"{urls[0]}/get_load").json() == [
        {"dp_rank": 0, "num_reqs": 0, "num_waiting_reqs": 0, "num_tokens": 0}
    ]


# Bodies as the router re-serializes them (observed from sglang-router 0.3.2), sent straight to a
# worker: every extra field carries the router's default and must be accepted.
ROUTER_BODIES = {
    "/v1/chat/completions": {
        "messages": [{"role": "user", "content": "hi"}],
        "model": "unknown",
        "logprobs": False,
        "max_completion_tokens": 3,
        "stream": False,
        "no_stop_trim": False,
        "ignore_eos": True,
        "continue_final_message": False,
        "skip_special_tokens": True,
        "separate_reasoning": True,
        "stream_reasoning": True,
        "return_hidden_states": False,
    },
    "/generate": {
        "text": "hi",
        "model": None,
        "sampling_params": {"max_new_tokens": 3, "ignore_eos": True},
        "return_text_in_logprobs": False,
        "stream": False,
        "log_metrics": True,
        "return_hidden_states": False,
        "background": False,
        "no_logs": False,
        "return_bytes": False,
        "return_entropy": False,
        "data_parallel_rank": 0,  # added under --dp-aware
    },
    "/v1/completions": {
        "model": "m",
        "prompt": "Once upon",
        "max_tokens": 3,
        "temperature": 0.0,
        "stream": False,
        "echo": False,
        "no_stop_trim": False,
        "ignore_eos": True,
        "skip_special_tokens": True,
        "return_hidden_states": False,
    },
}


@pytest.mark.parametrize("path", sorted(ROUTER_BODIES))
def test_router_reserialized_bodies_are_accepted(urls, path) -> None:
    resp = httpx.post(f"{urls[1]}{path}", json=ROUTER_BODIES[path], timeout=TIMEOUT)
    assert resp.status_code == 200, resp.text
    out = resp.json()
    usage = out["meta_info"] if path == "/generate" else out["usage"]
    assert usage["completion_tokens"] == 3  # max_completion_tokens / max_new_tokens honoured


# Affinity ----------------------------------------------------------------------------------------
def test_manual_policy_pins_image_chat_no_reencode_after_first_turn(manual_router, urls) -> None:
    """A multi-turn image chat pinned by X-SMG-Routing-Key: each image is encoded once, on
    the turn that brings it; later turns reuse its embedding and the KV prefix."""
    headers = {ROUTING_KEY: "conversation-7"}
    turns = [
        (_image_part(101), "What is in this picture?", 1),
        (None, "And the colours?", 0),
        (_image_part(102), "Compare it with this one.", 1),
        (None, "Which one is brighter?", 0),
    ]
    history: list[dict] = []
    before = [_info(u) for u in urls]
    served = []
    for image, text, new_images in turns:
        content = ([image] if image else []) + [{"type": "text", "text": text}]
        history.append({"role": "user", "content": content})
        out = _chat(manual_router, history, headers)
        assert out["usage"]["completion_tokens"] == 4  # max_tokens arrives re-serialized
        if len(history) > 1:
            assert out["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
        history.append({"role": "assistant", "content": out["choices"][0]["message"]["content"]})
        after = [_info(u) for u in urls]
        served.append(_served_by(before, after))
        assert sum(_encoded(after)) - sum(_encoded(before)) == new_images, len(history)
        before = after
    assert len(set(served)) == 1, served


def test_cache_aware_policy_keeps_a_conversation_on_one_worker(cache_router, urls) -> None:
    system = (
        "You are a patient guide to a small town by a green forest. You describe its streets, "
        "its river and the little red house at the edge of the trees, and you answer briefly."
    )
    history = [{"role": "system", "content": system}]
    served = []
    for question in ("Where is the house?", "Who lives there?", "Is there a river?", "Fish?"):
        history.append({"role": "user", "content": question})
        before = [_info(u) for u in urls]
        out = _chat(cache_router, history)
        served.append(_served_by(before, [_info(u) for u in urls]))
        history.append({"role": "assistant", "content": out["choices"][0]["message"]["content"]})
    assert len(set(served)) == 1, served


# Loads -------------------------------------------------------------------------------------------
def test_loads_are_reported_to_the_router(cache_router, urls) -> None:
    busy, idle = urls
    _wait_idle(urls)
    assert _router_loads(cache_router) == {busy: 0, idle: 0}
    with _streaming(busy, 3):  # two run (--max-running-requests 2), one waits
        load = wait_until(
            lambda: _queued_load(busy), 60, "the worker never reported a waiting request"
        )
        assert load["num_reqs"] == 3 and load["num_tokens"] > 0
        seen = _router_loads(cache_router)  # the router asks each worker's /get_load now
        assert seen[busy] >= load["num_tokens"] and seen[idle] == 0
    wait_until(
        lambda: _router_loads(cache_router) == {busy: 0, idle: 0},
        60,
        "loads did not return to zero once the requests were aborted",
    )


# Failover (kills a worker: keep this test last) --------------------------------------------------
def test_killed_worker_is_taken_out_and_the_rest_keep_serving(
    workers, manual_router, cache_router
) -> None:
    urls = [u for u, _ in workers]
    _wait_idle(urls)
    key = {ROUTING_KEY: "doomed-conversation"}
    before = [_info(u) for u in urls]
    _chat(manual_router, [{"role": "user", "content": "hello"}], key)
    victim = _served_by(before, [_info(u) for u in urls])
    survivor = 1 - victim
    victim_url, victim_pid = workers[victim]
    children = psutil.Process(victim_pid).children(recursive=True)
    try:
        with _streaming(manual_router, 1, headers=key) as outcomes:
            wait_until(lambda: _worker_load(victim_url)["num_reqs"] == 1, 60, "never started")
            os.kill(victim_pid, signal.SIGKILL)
            wait_until(lambda: outcomes, 60, "the in-flight stream did not end")
        assert outcomes[0] != "done", outcomes  # cut short, not completed
        for router in (manual_router, cache_router):
            wait_until(
                lambda r=router: healthy_workers(r) == {urls[survivor]},
                30,
                "the router kept the dead worker",
            )
        steps = _info(urls[survivor])["forward_steps"]
        for i in range(3):
            message = [{"role": "user", "content": f"still there {i}?"}]
            assert _chat(manual_router, message, key)["usage"]["completion_tokens"] == 4
            assert _chat(cache_router, message)["usage"]["completion_tokens"] == 4
        assert _info(urls[survivor])["forward_steps"] > steps
    finally:
        for child in children:
            with contextlib.suppress(psutil.NoSuchProcess):
                child.kill()
