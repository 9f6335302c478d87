"""SGLang's request control on a live server: ``/abort_request`` ends a running stream with an
abort finish, and ``/pause_generation`` in place holds every request until
``/continue_generation`` (or, with abort, ends the running ones), the scheduler holding
nothing of them afterwards."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest
from conftest import model_dir
from server_utils import launch_server

CONTEXT = 256  # streams of CONTEXT - 16 tokens run long enough to be caught running


@pytest.fixture(scope="module")
def server():
    with launch_server(model_dir("qwen2_5_vl"), "--context-length", str(CONTEXT)) as (url, _):
        yield url


def test_abort_request_ends_a_running_stream(server) -> None:
    """The abort goes out once the first chunk is in: the stream then ends with an abort
    finish, short of its length, and the scheduler holds nothing of it."""
    budget = CONTEXT - 16
    body = {
        "text": "Count:",
        "rid": "to-abort",
        "stream": True,
        "sampling_params": {"max_new_tokens": budget, "ignore_eos": True},
    }
    events, aborted = [], None
    with httpx.stream("POST", f"{server}/generate", json=body, timeout=120) as resp:
        for line in resp.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            events.append(json.loads(line[6:]))
            if aborted is None:
                aborted = httpx.post(f"{server}/abort_request", json={"rid": "to-abort"})
    assert aborted is not None and aborted.status_code == 200
    last = events[-1]["meta_info"]
    assert last["finish_reason"]["type"] == "abort"
    assert last["completion_tokens"] < budget
    other = httpx.post(f"{server}/abort_request", json={"rid": "no-such-request"}, timeout=30)
    assert other.status_code == 200
    deadline = time.time() + 30
    while httpx.get(f"{server}/server_info", timeout=30).json()["num_running_reqs"] and (
        time.time() < deadline
    ):
        time.sleep(0.1)
    assert httpx.get(f"{server}/debug/check_integrity", timeout=30).json() == {"ok": True}


def _stream_in_thread(server: str, body: dict) -> tuple[threading.Thread, list[dict]]:
    """Consume a /generate stream on a thread; the returned list fills with its events."""
    events: list[dict] = []

    def consume() -> None:
        with httpx.stream("POST", f"{server}/generate", json=body, timeout=120) as resp:
            for line in resp.iter_lines():
                if line.startswith("data: {"):
                    events.append(json.loads(line[6:]))

    thread = threading.Thread(target=consume)
    thread.start()
    return thread, events


def _wait_for(predicate, timeout: float = 30) -> None:
    deadline = time.time() + timeout
    while not predicate():
        assert time.time() < deadline, "timed out"
        time.sleep(0.01)


def test_pause_in_place_holds_every_request_until_continue(server) -> None:
    """``/pause_generation`` in place: the running stream stops where it is and a request sent
    meanwhile waits; after ``/continue_generation`` both run to their length."""
    budget = CONTEXT - 16
    body = {"text": "Count:", "stream": True}
    body["sampling_params"] = {"max_new_tokens": budget, "ignore_eos": True}
    running, running_events = _stream_in_thread(server, body)
    _wait_for(lambda: running_events)
    paused = httpx.post(f"{server}/pause_generation", json={"mode": "in_place"}, timeout=30)
    assert paused.json() == {"message": "Generation paused successfully.", "status": "ok"}
    time.sleep(0.2)  # a step under way when the pause arrived ends first
    held = len(running_events)
    waiting, waiting_events = _stream_in_thread(server, {**body, "text": "Later:"})
    time.sleep(1.0)
    assert len(running_events) == held and not waiting_events
    assert running_events[-1]["meta_info"]["finish_reason"] is None
    resumed = httpx.post(f"{server}/continue_generation", json={}, timeout=30)
    assert resumed.json()["status"] == "ok"
    running.join(120)
    waiting.join(120)
    for events in (running_events, waiting_events):
        assert events[-1]["meta_info"]["finish_reason"]["type"] == "length"
        assert len(events[-1]["output_ids"]) == budget


def test_pause_with_abort_ends_the_running_requests(server) -> None:
    """The default mode ends what runs (an abort finish); what arrives during the pause waits
    for ``/continue_generation``. A mode this server does not serve is a 400."""
    body = {"text": "Count:", "stream": True}
    body["sampling_params"] = {"max_new_tokens": CONTEXT - 16, "ignore_eos": True}
    running, running_events = _stream_in_thread(server, body)
    _wait_for(lambda: running_events)
    assert httpx.post(f"{server}/pause_generation", json={}, timeout=30).status_code == 200
    running.join(60)
    assert running_events[-1]["meta_info"]["finish_reason"]["type"] == "abort"
    short = {"text": "After:", "sampling_params": {"max_new_tokens": 4}, "stream": True}
    waiting, waiting_events = _stream_in_thread(server, short)
    time.sleep(0.5)
    assert not waiting_events
    retract = httpx.post(f"{server}/pause_generation", json={"mode": "retract"}, timeout=30)
    assert retract.status_code == 400
    httpx.post(f"{server}/continue_generation", json={}, timeout=30).raise_for_status()
    waiting.join(60)
    assert waiting_events[-1]["meta_info"]["completion_tokens"] == 4
