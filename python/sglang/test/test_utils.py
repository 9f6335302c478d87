"""SGLang's ``sglang.test.test_utils`` for this server: the names that SGLang's test kits,
``vlm_utils``, ``tool_call_test_runner`` and lmms-eval's ``srt_api`` backend import, with
SGLang's signatures. ``popen_launch_server`` starts ``python -m sglang.launch_server`` and waits
for ``/health_generate``, as SGLang's does for its own server."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import shlex
import socket
import subprocess
import sys
import threading
import time
import unittest
from collections.abc import Callable, Sequence
from typing import IO, Any
from urllib.parse import urlsplit

import requests

from sglang.srt.utils import get_bool_env_var, kill_process_tree

logger = logging.getLogger(__name__)

# SGLang's default test checkpoints (Hugging Face ids); the kits read some of them.
DEFAULT_MODEL_NAME_FOR_TEST = "meta-llama/Llama-3.1-8B-Instruct"
DEFAULT_SMALL_MODEL_NAME_FOR_TEST = "meta-llama/Llama-3.2-1B-Instruct"
DEFAULT_SMALL_VLM_MODEL_NAME_FOR_TEST = "Qwen/Qwen2.5-VL-3B-Instruct"

DEFAULT_TIMEOUT_FOR_SERVER_LAUNCH = 600


def is_in_ci() -> bool:
    return get_bool_env_var("SGLANG_IS_IN_CI")


def is_in_amd_ci() -> bool:
    return get_bool_env_var("SGLANG_IS_IN_CI_AMD")


def _first_visible_gpu() -> int:
    first = os.environ.get("CUDA_VISIBLE_DEVICES", "0")[:1]
    return int(first) if first.isdigit() else 0


# SGLang's port plan: one block of ports per visible GPU, CI's apart from a developer's.
if is_in_ci():
    DEFAULT_PORT_FOR_SRT_TEST_RUNNER = 10000 + _first_visible_gpu() * 2000
else:
    DEFAULT_PORT_FOR_SRT_TEST_RUNNER = 20000 + _first_visible_gpu() * 1000
# SGLANG_TEST_URL (ours) moves the kits' fixed URL, e.g. to a free port on a shared machine.
DEFAULT_URL_FOR_TEST = os.environ.get(
    "SGLANG_TEST_URL", f"http://127.0.0.1:{DEFAULT_PORT_FOR_SRT_TEST_RUNNER + 1000}"
)


def auto_config_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _port_is_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def find_available_port(base_port: int) -> int:
    """A free port at a random offset above ``base_port``, as SGLang picks one."""
    port = base_port + random.randint(100, 1000)
    while not _port_is_free(port):
        port = port + 42 if port < 60000 else port - 10000 + random.randint(0, 100)
    return port


def try_cached_model(model_repo: str) -> str:
    """``$DEFAULT_MODEL_CACHE_DIR/<repo>`` where that folder exists, else the repo id."""
    cache_dir = os.environ.get("DEFAULT_MODEL_CACHE_DIR")
    if cache_dir and model_repo and os.path.isdir(os.path.join(cache_dir, model_repo)):
        return os.path.abspath(os.path.join(cache_dir, model_repo))
    return model_repo


def _tee(source: IO[str], sinks: Sequence[IO[str]]) -> None:
    for line in iter(source.readline, ""):
        for sink in sinks:
            sink.write(line)
            sink.flush()
    source.close()


def _wait_healthy(
    process: subprocess.Popen, base_url: str, api_key: str | None, timeout: float
) -> str | None:
    """None once ``/health_generate`` answers 200, else why not."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    deadline = time.monotonic() + timeout
    with requests.Session() as session:
        while time.monotonic() < deadline:
            if process.poll() is not None:
                return f"Server process exited with code {process.returncode}"
            try:
                resp = session.get(f"{base_url}/health_generate", headers=headers, timeout=5)
                if resp.status_code == 200:
                    return None
            except requests.RequestException:
                pass
            time.sleep(0.5)
    return "Server failed to start within the timeout period"


def popen_launch_server(
    model: str,
    base_url: str,
    timeout: float,
    api_key: str | None = None,
    other_args: Sequence[str] | None = None,
    env: dict[str, str] | None = None,
    return_stdout_stderr: tuple[IO[str], IO[str]] | None = None,
    device: str = "auto",
    pd_separated: bool = False,
    num_replicas: int | None = None,
) -> subprocess.Popen:
    """Start the server for ``model`` on ``base_url``'s host and port and return its process
    once ``/health_generate`` answers. ``other_args`` go to the server as they are; ``env``
    adds to this process's environment; ``return_stdout_stderr`` (two open files) receives
    the server's output, which is also echoed here. ``device="auto"`` leaves the choice to the
    server. Raises (and kills what it started) when the server exits or ``timeout`` passes."""
    if pd_separated or num_replicas is not None:
        raise NotImplementedError("this server has no prefill/decode disaggregation")
    url = urlsplit(base_url)
    if not url.hostname or not url.port:
        raise ValueError(f"base_url needs a host and a port: {base_url!r}")
    command = [sys.executable, "-m", "sglang.launch_server", "--model-path", model]
    command += [str(arg) for arg in other_args or ()]
    if device != "auto":
        command += ["--device", device]
    command += ["--host", url.hostname, "--port", str(url.port)]
    if api_key:
        command += ["--api-key", api_key]
    print(f"command={shlex.join(command)}", flush=True)

    child_env = {**os.environ, **(env or {})}
    if return_stdout_stderr is None:
        process = subprocess.Popen(command, env=child_env)
    else:
        process = subprocess.Popen(
            command,
            env=child_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        assert process.stdout is not None and process.stderr is not None
        out, err = return_stdout_stderr
        pipes = ((process.stdout, (out, sys.stdout)), (process.stderr, (err, sys.stderr)))
        for source, sinks in pipes:
            threading.Thread(target=_tee, args=(source, sinks), daemon=True).start()

    error = _wait_healthy(process, base_url, api_key, timeout)
    if error is None:
        return process
    with contextlib.suppress(Exception):
        kill_process_tree(process.pid)
    with contextlib.suppress(Exception):
        process.wait(timeout=5)
    if "exited" in error:
        raise Exception(f"{error}. Check server logs for errors.")
    raise TimeoutError(error)


def collect_process_tree_pids(pid: int, include_parent: bool = True) -> list[int]:
    """The pids of ``pid``'s process tree now (take it before a kill: afterwards it is gone)."""
    import psutil

    try:
        pids = [child.pid for child in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        pids = []
    return [*pids, pid] if include_parent else pids


def terminate_and_kill_process_tree(
    process: subprocess.Popen, terminate_timeout: float = 60, **kill_kwargs: Any
) -> None:
    """SIGTERM the server (it shuts down its own children), wait up to ``terminate_timeout``
    seconds, then SIGKILL whatever of its tree is left; ``kill_kwargs`` go to
    ``kill_process_tree``."""
    import psutil

    pids = collect_process_tree_pids(process.pid, include_parent=False)
    process.terminate()
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=terminate_timeout)
    kill_process_tree(process.pid, **kill_kwargs)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=5)
    # Once the server is reaped its tree cannot be walked: kill the children seen before.
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            psutil.Process(pid).kill()


class CustomTestCase(unittest.TestCase):
    """SGLang's test base: ``tearDownClass`` runs even when ``setUpClass`` raises (no server
    is left behind), and a failing method is retried ``SGLANG_TEST_MAX_RETRY`` times (default
    1 in CI, else 0)."""

    expect_server_exit = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        setup = cls.setUpClass
        if getattr(setup, "_tears_down_on_error", False):
            return
        original = setup.__func__

        def set_up_class(klass: type) -> None:
            try:
                original(klass)
            except Exception:
                with contextlib.suppress(Exception):
                    klass.tearDownClass()
                raise

        set_up_class._tears_down_on_error = True  # type: ignore[attr-defined]
        cls.setUpClass = classmethod(set_up_class)  # type: ignore[assignment]

    def _callTestMethod(self, method: Callable[[], Any]) -> None:
        retries = os.environ.get("SGLANG_TEST_MAX_RETRY")
        max_retry = int(retries) if retries else (1 if is_in_ci() else 0)
        if self.expect_server_exit:
            max_retry = 0  # a retry would meet the server the test stopped
        for attempt in range(max_retry + 1):
            try:
                super()._callTestMethod(method)  # type: ignore[misc]
                return
            except Exception:
                if attempt == max_retry:
                    raise
                print(f"retrying {self.id()} ({attempt + 1}/{max_retry})", flush=True)

    def setUp(self) -> None:
        print(f"[CI Test Method] {self.__class__.__name__}.{self._testMethodName}", flush=True)


class ModelLaunchSettings:
    """A model and its launch flags, as SGLang's multi-model tests (and its tool-call runner)
    describe one; ``--enable-multimodal`` and ``--trust-remote-code`` are always added."""

    def __init__(
        self,
        model_path: str,
        tp_size: int = 1,
        extra_args: Sequence[str] | None = None,
        env: dict[str, str] | None = None,
        variant: str | None = None,
        launch_timeout: float | None = None,
    ) -> None:
        self.model_path = model_path
        self.tp_size = tp_size
        self.extra_args = list(extra_args or ())
        self.env = env
        self.variant = variant
        self.launch_timeout = launch_timeout
        if tp_size > 1 and "--tp" not in self.extra_args:
            self.extra_args += ["--tp", str(tp_size)]
        for flag in ("--enable-multimodal", "--trust-remote-code"):
            if flag not in self.extra_args:
                self.extra_args.append(flag)


def write_github_step_summary(content: str) -> None:
    path = os.environ.get("GITHUB_STEP_SUMMARY")
    if not path:
        logger.warning("GITHUB_STEP_SUMMARY environment variable not set")
        return
    with open(path, "a", encoding="utf-8") as f:
        f.write(content)


def dump_metric(metric_name: str, value: Any, labels: dict | None = None) -> None:
    """Print ``[METRIC] name=value`` and, with ``SGLANG_TEST_METRICS_OUTPUT``, append a JSON
    line to ``$SGLANG_TEST_METRICS_OUTPUT.<pid>.jsonl``; never raises."""
    try:
        if hasattr(value, "item"):  # numpy and torch scalars
            value = value.item()
        if isinstance(value, bool):
            value = int(value)
        elif not isinstance(value, (int, float, str)):
            try:
                value = float(value)
            except (TypeError, ValueError):
                value = str(value)
        test = os.environ.get("PYTEST_CURRENT_TEST", "").split(" ")[0]
        filename, _, test_case = test.partition("::")
        record = {
            "filename": filename or "unknown.py",
            "test_case": test_case.replace("::", ".") or "unknown_test",
            "metric_name": metric_name,
            "value": value,
            "ts": time.time(),
        }
        if labels:
            record["labels"] = labels
        base = os.environ.get("SGLANG_TEST_METRICS_OUTPUT")
        if base:
            with open(f"{base}.{os.getpid()}.jsonl", "a", encoding="utf-8") as f:
                f.write(json.dumps(record, ensure_ascii=False, default=str) + "\n")
        shown = f" labels={json.dumps(labels, ensure_ascii=False, default=str)}" if labels else ""
        print(f"[METRIC] {metric_name}={value}{shown}")
    except Exception as exc:  # a metric must never fail a test
        logger.warning("dump_metric(%r) failed: %s", metric_name, exc)
