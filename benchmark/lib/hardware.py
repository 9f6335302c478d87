"""The machine under a benchmark: CPU and GPU description, matmul peaks and memory bandwidth, a
process tree's CPU time, pausing peers."""

from __future__ import annotations

import contextlib
import os
import platform
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any


def matmul_peak_gflops(
    size: int = 1024, seconds: float = 1.5, dtype: str = "float32"
) -> dict[str, Any]:
    """The machine's matrix-multiply rate in ``dtype`` with torch's default threads: the best of
    repeated size^3 products over about ``seconds`` (best, because other load only slows it).
    In bfloat16, where the engine's own GEMM serves the packed linears (``packed_linear``), the
    faster of torch's product and it (both rates are reported). ``int8``: the rate of
    ``vpdpbusd`` itself on every thread (``linear_int8dq.peak_ops``), the peak int8dq's MFU is
    counted against."""
    import torch

    if dtype == "int8":
        from sglang.srt import kernels

        int8 = kernels.load("linear_int8dq")
        rate = int8.peak_ops(seconds) / 1e9 if int8 is not None else 0.0
        return {"gflop_per_s": rate, "instruction": "vpdpbusd", "size": None,
                "threads": torch.get_num_threads(), "dtype": dtype}  # fmt: skip

    from sglang.srt.kernels import ops

    kind = getattr(torch, dtype)
    a, b = torch.randn(size, size).to(kind), torch.randn(size, size).to(kind)
    rates = {"torch": _best_rate(lambda: torch.mm(a, b), size, seconds)}
    native = ops.native_gemm() if kind == torch.bfloat16 else None
    if native is not None:
        packed = native.pack(b.t().contiguous())
        rates["native"] = _best_rate(lambda: native.linear(a, packed, None, size), size, seconds)
    return {
        "gflop_per_s": max(rates.values()),
        **{f"{name}_gflop_per_s": rate for name, rate in rates.items()},
        "size": size,
        "threads": torch.get_num_threads(),
        "dtype": dtype,
    }


def cuda_matmul_peak_gflops(size: int = 8192, repeats: int = 10) -> dict[str, Any]:
    """The GPU's bfloat16 matrix-multiply rate: the best of ``repeats`` size^3 products, each
    timed with CUDA events."""
    import torch

    a, b = (torch.randn(size, size, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    torch.mm(a, b)
    best = float("inf")
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.mm(a, b)
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / 1e3)
    return {"gflop_per_s": 2 * size**3 / best / 1e9, "size": size, "dtype": "bfloat16"}


def _best_rate(product: Callable[[], Any], size: int, seconds: float) -> float:
    product()  # warm-up: packing and kernel selection
    best, deadline = float("inf"), time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        start = time.perf_counter()
        product()
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best / 1e9


def memory_bandwidth_gbs(megabytes: int = 512, seconds: float = 1.0) -> dict[str, Any]:
    """Host memory bandwidth from a copy probe: bytes read plus bytes written per second, best
    of repeated copies of a buffer far larger than the caches."""
    import torch

    src = torch.ones(megabytes * 2**20 // 4)
    dst = torch.empty_like(src)
    dst.copy_(src)
    best, deadline = float("inf"), time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        start = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - start)
    moved = 2 * src.numel() * src.element_size()
    threads = torch.get_num_threads()
    return {"gb_per_s": moved / best / 1e9, "megabytes": megabytes, "threads": threads}


def cpu_info() -> dict[str, Any]:
    """``lscpu``'s model name and the ISA flags that matter for bfloat16 / int8 matmuls."""
    text = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    flags = set(fields.get("Flags", "").split())
    wanted = ("amx_bf16", "amx_int8", "amx_tile", "avx512_bf16", "avx512_vnni", "avx512f", "avx2")
    return {
        "model_name": fields.get("Model name", platform.processor()).strip(),
        "cores": os.cpu_count(),
        "isa": {flag: flag in flags for flag in wanted},
    }


def gpu_info() -> dict[str, Any] | None:
    """The CUDA device torch sees (None without one): name, memory, multiprocessors, and the
    torch, CUDA and driver versions."""
    import torch

    if not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(0)
    query = ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]
    try:
        driver = subprocess.run(query, capture_output=True, text=True, check=False).stdout.strip()
    except OSError:
        driver = ""
    return {
        "name": props.name,
        "memory_gib": round(props.total_memory / 2**30, 1),
        "multiprocessors": props.multi_processor_count,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "driver": driver or None,
    }


def gpu_line(info: dict[str, Any]) -> str:
    return (
        f"GPU: {info['name']}, {info['memory_gib']} GiB, {info['multiprocessors']} SMs; "
        f"torch {info['torch']}, CUDA {info['cuda']}, driver {info['driver']}"
    )


def cpu_line(info: dict[str, Any]) -> str:
    have = [flag for flag, ok in info["isa"].items() if ok]
    return f"CPU: {info['model_name']}, {info['cores']} cores; ISA: {' '.join(have) or 'none'}"


def process_tree_cpu_seconds(pid: int | None) -> float | None:
    """User + system CPU seconds used so far by process ``pid`` and its live descendants: work
    per request that other load on the machine does not inflate (unlike wall time)."""
    procs = _process_tree(pid)
    if procs is None:
        return None
    import psutil

    total = 0.0
    for proc in procs:
        try:
            times = proc.cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system
    return total


def _process_tree(pid: int | None) -> list[Any] | None:
    """psutil handles of process ``pid`` and its live descendants (None: no such process)."""
    if pid is None:
        return None
    import psutil

    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return None


@contextlib.contextmanager
def paused(pids: list[int | None]) -> Iterator[None]:
    """Stops (SIGSTOP) the processes ``pids`` and their descendants for the block, then resumes
    them: servers left idle beside the one measured (vLLM's polls its queues while idle, ~0.4
    of a core) cannot take CPU from it."""
    import psutil

    procs = [proc for pid in pids for proc in _process_tree(pid) or []]
    stopped = []
    try:
        for proc in procs:
            try:
                proc.suspend()
                stopped.append(proc)
            except psutil.Error:
                continue
        yield
    finally:
        for proc in reversed(stopped):
            try:
                proc.resume()
            except psutil.Error:
                continue


def _status_bytes(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    return 0


_STATUS_KEYS = {"peak_mb": "VmHWM", "rss_mb": "VmRSS", "anon_mb": "RssAnon", "file_mb": "RssFile"}


def rss_snapshot(pid: int) -> dict[str, Any]:
    """Peak (VmHWM) and current RSS of each process of the server's tree, in MiB; current RSS
    split into anonymous memory and file pages (weights mapped from a safetensors file whose
    dtype is the run dtype stay file pages, which the kernel can drop and read back)."""
    procs = []
    import psutil

    for proc in _process_tree(pid) or []:
        try:
            row = {k: _status_bytes(proc.pid, key) / 2**20 for k, key in _STATUS_KEYS.items()}
            procs.append({"pid": proc.pid, **row})
        except (OSError, psutil.Error):
            continue
    totals = {k: sum(p[k] for p in procs) for k in _STATUS_KEYS}  # peaks: sum of each one's
    return {**totals, "max_process_peak_mb": max((p["peak_mb"] for p in procs), default=0.0),
            "processes": procs}  # fmt: skip
