"""Start the servers under test as subprocesses: ours, vLLM CPU and ``transformers serve``.

Each runs on a free local port, is waited for on ``GET /health`` and killed (its whole process
group) on exit. Peers run from their own virtualenvs (``benchmark/peers/setup_peers.sh``).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

PEER_VENVS = Path(os.environ.get("PEER_VENVS", Path.home() / ".cache/sglang-bench/venvs"))
ENGINES = ("ours", "vllm", "hf")


@dataclass
class Server:
    base_url: str
    model: str  # the name to put in requests
    engine: str
    label: str
    proc: subprocess.Popen | None = None
    log_path: Path | None = None
    startup_s: float = 0.0
    info: dict = field(default_factory=dict)

    def log_tail(self, n: int = 40) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def peer_python(name: str) -> Path:
    return PEER_VENVS / name / "bin" / "python"


def _wait_healthy(server: Server, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    with httpx.Client(timeout=5) as client:
        while time.monotonic() < deadline:
            if server.proc is not None and server.proc.poll() is not None:
                raise RuntimeError(
                    f"{server.label} exited with {server.proc.returncode}:\n{server.log_tail()}"
                )
            try:
                if client.get(f"{server.base_url}/health").status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
    raise TimeoutError(f"{server.label} not healthy after {timeout:.0f}s:\n{server.log_tail()}")


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def our_command(
    model_path: str | None, port: int, mode: str, extra: list[str] | None = None
) -> list[str]:
    cmd = [sys.executable, "-m", "sglang.launch_server", "--port", str(port)]
    if model_path:
        cmd += ["--model-path", model_path]
    cmd += ["--enable-multimodal", "--mm-cache-mode", mode, "--enable-cache-report"]
    return cmd + list(extra or [])


def vllm_command(
    model_path: str, port: int, max_len: int, dtype: str, videos: int = 0
) -> list[str]:
    limits = json.dumps({"image": 64, "video": videos})
    return [
        str(peer_python("vllm")),
        *("-m", "vllm.entrypoints.openai.api_server", "--model", model_path),
        *("--host", "127.0.0.1", "--port", str(port), "--dtype", dtype),
        *("--max-model-len", str(max_len), "--enable-prompt-tokens-details"),
        *("--gpu-memory-utilization", os.environ.get("VLLM_CPU_MEM_FRACTION", "0.3")),
        # Profiling with a worst-case video (the default) takes tens of minutes on a CPU.
        *("--skip-mm-profiling", "--limit-mm-per-prompt", limits),
    ]


def hf_command(model_path: str, port: int, dtype: str) -> list[str]:
    return [
        str(peer_python("hf").parent / "transformers"),
        *("serve", model_path, "--host", "127.0.0.1", "--port", str(port)),
        *("--device", "cpu", "--dtype", dtype, "--trust-remote-code"),
    ]


@contextlib.contextmanager
def launch(
    engine: str,
    model_path: str | None,
    mode: str = "per-image",
    extra: list[str] | None = None,
    max_len: int | None = None,
    timeout: float = 600,
    log_dir: str | Path | None = None,
    dtype: str = "float32",
    videos: int = 0,
) -> Iterator[Server]:
    """Start ``engine`` on a free port; yield a ``Server`` once ``/health`` answers. ``extra``
    flags go to our server only; ``dtype`` to every engine."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false")
    if engine == "ours":
        extra = ["--dtype", dtype, *(extra or [])]
        # a native kernel that fails to build stops the server instead of timing torch's path
        env.setdefault("SGLANG_REQUIRE_CPU_KERNELS", "1")
        cmd, model, label = our_command(model_path, port, mode, extra), "default", f"ours:{mode}"
    elif engine == "vllm":
        assert model_path, "vLLM needs --model-path"
        max_len = max_len or _context_length(model_path)
        cmd = vllm_command(model_path, port, max_len, dtype, videos)
        model, label = model_path, "vllm"
        env.update(VLLM_SERVER_DEV_MODE="1", VLLM_CPU_KVCACHE_SPACE=env.get("VLLM_KV_GB", "4"))
    elif engine == "hf":
        assert model_path, "transformers serve needs --model-path"
        from benchmark.peers.peer_model import hf_serve_folder

        folder = str(hf_serve_folder(model_path))
        cmd, model, label = hf_command(folder, port, dtype), folder, "hf"
    else:
        raise ValueError(f"unknown engine {engine!r}; expected one of {ENGINES}")
    if engine != "ours" and not Path(cmd[0]).exists():
        raise FileNotFoundError(f"{cmd[0]} missing: run bash benchmark/peers/setup_peers.sh")
    log_root = Path(log_dir or tempfile.mkdtemp(prefix="bench-logs-"))
    log_root.mkdir(parents=True, exist_ok=True)
    log_path = log_root / f"{label.replace(':', '-')}-{port}.log"
    start = time.perf_counter()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    server = Server(base, model, engine, label, proc, log_path)
    try:
        _wait_healthy(server, timeout)
        server.startup_s = time.perf_counter() - start
        if engine == "ours":
            with httpx.Client(timeout=30) as client:
                server.model = _served_name(client, base, model)
        yield server
    finally:
        _stop(proc)


def _context_length(model_path: str, cap: int = 65536) -> int:
    config = json.loads((Path(model_path) / "config.json").read_text())
    text = config.get("text_config", config)
    return min(int(text.get("max_position_embeddings") or cap), cap)


def _served_name(client: httpx.Client, base: str, default: str) -> str:
    try:
        return str(client.get(f"{base}/v1/models").json()["data"][0]["id"])
    except (httpx.HTTPError, json.JSONDecodeError, KeyError, IndexError):
        return default


@contextlib.contextmanager
def launch_router(
    worker_urls: list[str], *flags: str, timeout: float = 60
) -> Iterator[tuple[str, subprocess.Popen]]:
    """sglang-router over ``worker_urls`` on loopback; yield (URL, process) once it lists every
    worker as healthy. Its defaults would bind 0.0.0.0:30000 and a Prometheus exporter on
    0.0.0.0:29000."""
    port = free_port()
    cmd = [
        sys.executable,
        *("-m", "sglang_router.launch_router", "--host", "127.0.0.1", "--port", str(port)),
        *("--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port())),
        *("--worker-urls", *worker_urls, "--log-level", "warn"),
        *("--shutdown-grace-period-secs", "1", *flags),
    ]
    log = tempfile.NamedTemporaryFile("w+", prefix="sglang-router-", suffix=".log")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while not _router_lists(url, set(worker_urls)):
            if proc.poll() is not None:
                log.seek(0)
                raise RuntimeError(f"the router exited:\n{log.read()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"the router did not register {worker_urls}")
            time.sleep(0.2)
        yield url, proc
    finally:
        stop_process(proc)
        log.close()


def healthy_workers(router: str) -> set[str]:
    workers = httpx.get(f"{router}/workers", timeout=10).json()["workers"]
    return {w["url"] for w in workers if w["is_healthy"]}


def _router_lists(router: str, urls: set[str]) -> bool:
    try:
        return healthy_workers(router) == urls
    except httpx.HTTPError:
        return False


def stop_process(proc: subprocess.Popen, timeout: float = 15) -> None:
    """SIGTERM, then SIGKILL if it is still running after ``timeout`` seconds."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextlib.contextmanager
def redis_server(*flags: str, timeout: float = 20) -> Iterator[tuple[str, subprocess.Popen]]:
    """Yield (redis:// URL, process) of a fresh Debian ``redis-server`` on loopback with no
    persistence; stopped afterwards (``scripts/install_test_deps.sh`` installs it)."""
    binary = shutil.which("redis-server")
    assert binary, "redis-server is missing: bash scripts/install_test_deps.sh installs it"
    port = free_port()
    cmd = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    proc = subprocess.Popen([*cmd, *flags], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + timeout
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
                break
            if proc.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"redis-server did not start ({cmd})")
            time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/0", proc
    finally:
        stop_process(proc, timeout=10)


@contextlib.contextmanager
def connect(base_url: str, label: str = "external") -> Iterator[Server]:
    """A server that is already running at ``base_url``."""
    base = base_url.rstrip("/")
    with httpx.Client(timeout=30) as client:
        model = _served_name(client, base, "default")
    yield Server(base, model, "external", label)
