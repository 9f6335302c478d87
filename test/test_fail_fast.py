"""When the scheduler dies or wedges, the server says so and exits; when the server dies, the
scheduler follows. A supervisor can then restart it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import psutil
import pytest
from conftest import model_dir
from server_utils import server_process

from sglang.launch_server import FATAL_GRACE_S

LONG = {"max_new_tokens": 2000, "ignore_eos": True, "temperature": 0}


def _scheduler_of(server_pid: int) -> psutil.Process:
    children = psutil.Process(server_pid).children()
    (scheduler,) = [c for c in children if "spawn_main" in " ".join(c.cmdline())]
    return scheduler


def _gone(proc: psutil.Process) -> bool:
    try:
        return proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _wait_running(url: str, n: int) -> None:
    deadline = time.time() + 60
    while httpx.get(f"{url}/server_info", timeout=10).json()["num_running_reqs"] < n:
        assert time.time() < deadline, "requests never started"
        time.sleep(0.05)


def _client(url: str, i: int, out: dict) -> None:
    body = {"text": f"request {i}", "sampling_params": LONG, "stream": i % 2 == 1}
    try:
        resp = httpx.post(f"{url}/generate", json=body, timeout=60)
        out[i] = (resp.status_code, resp.text, time.time())
    except httpx.HTTPError as exc:
        out[i] = (None, repr(exc), time.time())


def test_killed_scheduler_fails_requests_at_once_and_the_server_exits_nonzero():
    with server_process(model_dir("qwen2")) as (url, proc):
        scheduler = _scheduler_of(proc.pid)
        results: dict[int, tuple] = {}
        threads = [threading.Thread(target=_client, args=(url, i, results)) for i in range(4)]
        for t in threads:
            t.start()
        _wait_running(url, 2)
        killed_at = time.time()
        scheduler.send_signal(signal.SIGKILL)
        health = None
        while time.time() - killed_at < 10:
            try:
                health = httpx.get(f"{url}/health", timeout=2).status_code
            except httpx.HTTPError:
                break  # already gone
            if health == 503:
                break
            time.sleep(0.05)
        assert health in (503, None)
        for t in threads:
            t.join(timeout=30)
        assert len(results) == 4
        for status, text, finished_at in results.values():
            assert finished_at - killed_at < 10, "a client waited on a dead scheduler"
            if status == 200:  # a stream that had started: it ends with an error event
                assert '"code": 503' in text and text.rstrip().endswith("data: [DONE]")
            else:
                assert status in (503, None), (status, text)
        assert proc.wait(timeout=30) != 0
        assert _gone(scheduler)


def test_sigterm_stops_a_busy_server_promptly():
    with server_process(model_dir("qwen2")) as (url, proc):
        scheduler = _scheduler_of(proc.pid)
        results: dict[int, tuple] = {}
        thread = threading.Thread(target=_client, args=(url, 0, results))
        thread.start()
        _wait_running(url, 1)
        term_at = time.time()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)
        thread.join(timeout=20)
        status, text, finished_at = results[0]
        # The request is aborted, or it completed inside the graceful-shutdown window.
        stopped = status != 200 or "abort" in text or "503" in text
        assert stopped or finished_at - term_at < FATAL_GRACE_S + 1.0, (status, text[-300:])
        deadline = time.time() + 10
        while not _gone(scheduler):
            assert time.time() < deadline
            time.sleep(0.1)


def test_scheduler_exits_when_the_server_is_killed_mid_forward():
    with server_process(model_dir("qwen2")) as (url, proc):
        scheduler = _scheduler_of(proc.pid)
        thread = threading.Thread(target=_client, args=(url, 0, {}))
        thread.start()
        _wait_running(url, 1)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        deadline = time.time() + 5
        while not _gone(scheduler):
            assert time.time() < deadline, "the scheduler outlived its server"
            time.sleep(0.05)
        thread.join(timeout=20)


WEDGED = """
import os, time
from sglang.srt.managers import scheduler_process

class Loop:
    step_started = time.monotonic() - 10  # a step that began 10 s ago and never ended

scheduler_process._watchdog(Loop(), os.getppid(), timeout=1.0)
print("watchdog returned")
"""


@pytest.mark.skipif(sys.platform != "linux", reason="Linux process semantics")
def test_watchdog_exits_when_a_step_wedges():
    start = time.time()
    done = subprocess.run(
        [sys.executable, "-c", WEDGED], capture_output=True, text=True, timeout=30, env=os.environ
    )
    assert done.returncode == 1 and "watchdog returned" not in done.stdout
    assert "over 1 s" in done.stderr and time.time() - start < 20
