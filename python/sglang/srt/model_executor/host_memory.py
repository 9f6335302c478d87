"""Host and device memory as the launch sees it, and the bytes tensors hold.

Host memory is cgroup-aware: the total is the cgroup's memory limit when one is set, else
``MemTotal``; what is available is the smaller of ``MemAvailable`` and the cgroup's limit minus
its usage. ``SGLANG_AVAILABLE_MEMORY_BYTES`` replaces the available figure (a testing aid: it
lets a test see the refusal without a small machine).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # imported where used: the launcher reads FORWARD_MALLOC_ENV before torch loads
    import torch

AVAILABLE_ENV = "SGLANG_AVAILABLE_MEMORY_BYTES"
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc mallopt parameters
UNLIMITED = 1 << 60  # cgroup limits at or above this mean "no limit"
_CGROUP_FILES = (  # (limit, usage): cgroup v2, then v1
    ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
    ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"),
)


# Host memory -----------------------------------------------------------------------------------
def _meminfo() -> dict[str, int]:
    out = {}
    for line in Path("/proc/meminfo").read_text().splitlines():
        key, _, rest = line.partition(":")
        out[key] = int(rest.split()[0]) * 1024
    return out


def _read_int(path: str) -> int | None:
    try:
        text = Path(path).read_text().strip()
    except OSError:
        return None
    return UNLIMITED if text == "max" else int(text)


def cgroup_memory() -> tuple[int, int] | None:
    """(limit, usage) of this process' memory cgroup, or None when it sets no limit."""
    for limit_path, usage_path in _CGROUP_FILES:
        limit = _read_int(limit_path)
        if limit is not None and limit < UNLIMITED:
            return limit, _read_int(usage_path) or 0
    return None


def host_memory_total() -> tuple[int, str]:
    """The host memory this process may use, and where the figure comes from."""
    cgroup = cgroup_memory()
    total = _meminfo()["MemTotal"]
    if cgroup is not None and cgroup[0] < total:
        return cgroup[0], "cgroup limit"
    return total, "MemTotal"


def host_memory_available() -> tuple[int, str]:
    """Bytes that can still be allocated without swapping or the cgroup's OOM killer."""
    if os.environ.get(AVAILABLE_ENV):
        return int(os.environ[AVAILABLE_ENV]), AVAILABLE_ENV
    available, source = _meminfo()["MemAvailable"], "MemAvailable"
    cgroup = cgroup_memory()
    if cgroup is not None and cgroup[0] - cgroup[1] < available:
        available, source = max(cgroup[0] - cgroup[1], 0), "cgroup limit - usage"
    return available, source


def device_memory_available(device: str) -> tuple[int, str]:
    if device.startswith("cuda"):
        if os.environ.get(AVAILABLE_ENV):
            return int(os.environ[AVAILABLE_ENV]), AVAILABLE_ENV
        import torch

        return torch.cuda.mem_get_info()[0], "cuda free"
    return host_memory_available()


_MALLOC_ENV = {
    _M_TRIM_THRESHOLD: "MALLOC_TRIM_THRESHOLD_",
    _M_MMAP_THRESHOLD: "MALLOC_MMAP_THRESHOLD_",
}
# The forwards' thresholds: 16 GB, i.e. large freed blocks stay in the heap (compute_env puts
# them in the compute process's environment).
FORWARD_MALLOC_ENV = {name: str(16 << 30) for name in _MALLOC_ENV.values()}
LOAD_MALLOC_THRESHOLD = 1 << 20
_C_INT_MAX = (1 << 31) - 1  # mallopt takes a C int


@contextlib.contextmanager
def heap_returned_while_loading() -> Iterator[None]:
    """Forwards keep freed blocks in the heap (raised glibc mmap and trim thresholds, so they
    reuse memory without page faults: ``compute_env``), and the heap keeps its peak size.
    Loading and quantizing the weights frees gigabytes of temporaries (a 7B model quantized to
    int4 kept 18 GB resident for 6.5 GB of weights), so while they load the thresholds are low;
    afterwards the freed heap goes back to the kernel and the forwards' thresholds are set
    (``forward_malloc_thresholds``)."""
    libc = _libc()
    raised = forward_malloc_thresholds()
    if libc is None or not raised:
        yield
        return
    for opt in raised:
        libc.mallopt(opt, LOAD_MALLOC_THRESHOLD)
    try:
        yield
    finally:
        libc.malloc_trim(0)
        for opt, value in raised.items():
            libc.mallopt(opt, min(value, _C_INT_MAX))


def forward_malloc_thresholds() -> dict[int, int]:
    """The glibc thresholds (mallopt option -> bytes) the forwards run with: the environment's
    (a server sets them for its compute process before it starts: ``compute_env``), else
    ``FORWARD_MALLOC_ENV``'s: an offline ``Engine`` computes in the caller's process, whose
    glibc read no such setting at its start (measured there, bfloat16 2B-shaped checkpoint, one
    640x480 image a request: the tower 1,205-1,281 ms with glibc's defaults, 1,163-1,177 ms with
    the raised thresholds, as with them in the environment at the start)."""
    thresholds = {}
    for opt, name in _MALLOC_ENV.items():
        value = os.environ.get(name) or FORWARD_MALLOC_ENV[name]
        if value.isdigit():
            thresholds[opt] = int(value)
    return thresholds


def _libc() -> Any:
    try:
        libc = ctypes.CDLL("libc.so.6")
        return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None
    except OSError:
        return None


# Loaded sizes ----------------------------------------------------------------------------------
def _storages(t: torch.Tensor) -> Iterator[torch.Tensor]:
    """The plain tensors that hold ``t``'s data (tensor subclasses such as torchao's quantized
    weights keep theirs as inner tensors)."""
    import torch

    if type(t) not in (torch.Tensor, torch.nn.Parameter) and hasattr(t, "__tensor_flatten__"):
        names, _ = t.__tensor_flatten__()
        for name in names:
            yield from _storages(getattr(t, name))
    else:
        yield t


def tensors_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the storages behind ``tensors``, each storage counted once (tied weights)."""
    seen: set[tuple[str, int]] = set()
    total = 0
    for tensor in tensors:
        for t in _storages(tensor):
            storage = t.untyped_storage()
            key = (str(t.device), storage.data_ptr())
            if t.device.type == "meta" or key in seen:
                continue
            seen.add(key)
            total += storage.nbytes()
    return total


def module_bytes(model: torch.nn.Module) -> int:
    """Real bytes of a module's parameters and buffers, as loaded (quantized ones included)."""
    return tensors_bytes([*model.parameters(), *model.buffers()])
