"""Start the real server process on a free port for end-to-end tests."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx

from benchmark.servers import (
    healthy_workers,  # noqa: F401 (the router tests' helper)
    redis_server,  # noqa: F401 (the shared store's tests' helper)
    stop_process,
)
from benchmark.servers import launch_router as _launch_router


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def launch_server(
    model_path: str | None, *flags: str, timeout: float = 180
) -> Iterator[tuple[str, int]]:
    """Yield (base URL, server pid); the server is ready (warm) when this yields. No
    ``model_path``: the server's embedded default."""
    with server_process(model_path, *flags, timeout=timeout) as (url, proc):
        yield url, proc.pid


@contextlib.contextmanager
def server_process(
    model_path: str | None, *flags: str, timeout: float = 180
) -> Iterator[tuple[str, subprocess.Popen]]:
    """Yield (base URL, server process) once the server is ready; stop it afterwards. The
    server runs in float32, the exact mode, unless ``flags`` name a ``--dtype``."""
    port = free_port()
    if "--dtype" not in flags:
        flags = ("--dtype", "float32", *flags)
    cmd = [
        sys.executable,
        "-m",
        "sglang.launch_server",
        *(("--model-path", model_path) if model_path is not None else ()),
        "--port",
        str(port),
        "--log-level",
        "warning",
        *flags,
    ]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    log = tempfile.NamedTemporaryFile("w+", prefix="sglang-server-", suffix=".log")
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if proc.poll() is not None:
                log.seek(0)
                raise RuntimeError(f"server exited early:\n{log.read()}")
            try:
                if httpx.get(f"{url}/health_generate", timeout=30).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.3)
        else:
            raise TimeoutError("server did not become ready")
        yield url, proc
    finally:
        stop_process(proc, timeout=20)
        log.close()


def wait_until(
    cond: Callable[[], Any],
    timeout: float,
    what: str,
    proc: subprocess.Popen | None = None,
    log: Any = None,
) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            log.seek(0)
            raise RuntimeError(f"{what}: the process exited\n{log.read()}")
        try:
            value = cond()
        except httpx.HTTPError:
            value = None
        if value:
            return value
        time.sleep(0.2)
    raise TimeoutError(what)


@contextlib.contextmanager
def launch_router(worker_urls: list[str], *flags: str, timeout: float = 60) -> Iterator[str]:
    """The router's URL once it lists every worker as healthy (``benchmark.servers``)."""
    with _launch_router(worker_urls, *flags, timeout=timeout) as (url, _):
        yield url
