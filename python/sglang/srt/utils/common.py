"""Process and environment helpers under SGLang's names and signatures."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import psutil


def get_bool_env_var(name: str, default: str = "false") -> bool:
    """SGLang's reading of a boolean variable: ``1`` / ``true`` (any case) are true."""
    return os.getenv(name, default).strip().lower() in ("1", "true")


def is_cuda() -> bool:
    import torch

    return torch.cuda.is_available() and torch.version.cuda is not None


def kill_process_tree(
    parent_pid: int | None,
    include_parent: bool = True,
    skip_pid: int | None = None,
    wait_timeout: float | None = 60,
) -> None:
    """SIGKILL every descendant of ``parent_pid`` (but ``skip_pid``) and, with
    ``include_parent``, the process itself; then wait up to ``wait_timeout`` seconds for them
    to be gone (``None``: do not wait). ``parent_pid`` None means this process, children only.
    Killing this very process exits it."""
    import psutil  # a test and client helper: the serving runtime does not need psutil

    if parent_pid is None:
        parent_pid, include_parent = os.getpid(), False
    try:
        parent = psutil.Process(parent_pid)
        children = parent.children(recursive=True)
    except psutil.NoSuchProcess:
        return
    killed: list[psutil.Process] = []
    for child in children:
        if child.pid == skip_pid:
            continue
        with contextlib.suppress(psutil.NoSuchProcess):
            child.kill()
            killed.append(child)
    if include_parent:
        if parent_pid == os.getpid():
            parent.kill()
            sys.exit(0)
        with contextlib.suppress(psutil.NoSuchProcess):
            parent.kill()
            # A process that ignores SIGKILL (PID 1 in a container) may still take SIGQUIT.
            parent.send_signal(signal.SIGQUIT)
            killed.append(parent)
    if wait_timeout is None or not killed:
        return
    _, alive = psutil.wait_procs(killed, timeout=wait_timeout)
    # A killed child whose parent is not this process stays a zombie until its parent reaps it.
    alive = [p for p in alive if _status(p) not in (None, psutil.STATUS_ZOMBIE)]
    if alive:
        raise RuntimeError(
            f"kill_process_tree: {[p.pid for p in alive]} still alive after {wait_timeout} s"
        )


def _status(process: psutil.Process) -> str | None:
    import psutil

    try:
        return process.status()
    except psutil.NoSuchProcess:
        return None


@contextlib.contextmanager
def temp_set_env(*, allow_sglang: bool = False, **env_vars: object) -> Iterator[None]:
    """Set environment variables for the ``with`` block (``None`` unsets one), then restore
    them. ``SGLANG_*`` / ``SGL_*`` names are refused unless ``allow_sglang``, as in SGLang."""
    if not allow_sglang:
        refused = [k for k in env_vars if k.startswith(("SGLANG_", "SGL_"))]
        if refused:
            raise ValueError(f"temp_set_env should not be used for sglang env vars: {refused}")
    saved = {key: os.environ.get(key) for key in env_vars}
    try:
        for key, value in env_vars.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = str(value)
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
