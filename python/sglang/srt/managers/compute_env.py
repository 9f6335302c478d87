"""Process-level settings for the compute (scheduler) process, applied before it starts.

OpenMP worker threads that finish a parallel region spin for a while before they sleep
(libgomp's default: ~3 ms). On a CPU shared with other processes (or with this server's own API
process) a spinning worker holds a core that the other worker, preempted, needs to reach the
next barrier, and every region then waits a scheduler time slice: measured on the 2-core
development machine under a load average of ~12, a 448x448 image through the small model's
vision tower took 2.6-3.3 s spinning and 0.83-0.87 s with workers that sleep at once
(``OMP_WAIT_POLICY=PASSIVE``), and 64 decode-size attention calls 0.35-1.5 s against 48-50 ms.
Sleeping at once costs a wake-up per region instead (~30 us, ~80 us once the idle core has
halted; a decode step of the 7B-shaped model is ~70 regions, between which the Python of the
model runs), so the default is a short spin: ``GOMP_SPINCOUNT=20000`` (~0.2 ms), which covers
the gaps within a step but not a preemption. Measured on a 2-core AMD EPYC (Zen 3), int8dq
decode of the 7B-shaped checkpoint with 8 layers, two engines taking turns, medians of 8:
175.6 ms a token with PASSIVE against 163.2 with the short spin (5,000 spins: the same as
20,000; libgomp's default 300,000: the same again); the 720p image through the small tower the
same as PASSIVE, quiet and under 10 busy processes, where a 100,000-spin wait lost 1.3x. An
``OMP_WAIT_POLICY`` or ``GOMP_SPINCOUNT`` already in the environment wins
(``OMP_WAIT_POLICY=PASSIVE`` sleeps at once, ``ACTIVE`` spins without end).

glibc's malloc hands large blocks (activations of tens of MB) back to the kernel when they are
freed and maps them anew on the next allocation, so every forward pays page faults on fresh
zeroed pages: 140k minor faults and 0.2 s of system time per 720p image through the small
vision tower. With the mmap and trim thresholds raised, freed blocks stay in the heap and are
reused: 0 faults, 0.03 s system time, 7-11% less wall time (same machine, same load). The
heap then keeps its peak size, as tcmalloc-style allocators do.

With workers that sleep, every parallel region of a small op pays a wake-up, and a decode step
is hundreds of small ops (one attention call per request and layer, matrices of a few rows). On
the benchmark models (hidden size 256) a decode step with one thread took 3.2 / 6.7 / 19 / 58 ms
at batch 1 / 4 / 16 / 64 against 8.6 / 16 / 48 / 131 ms with two sleeping workers (spinning
workers: 2.7 / 6.4 / 17 ms, on both cores). The balance turns with the size of the matrices,
whose reading is a decode step's cost: two threads read memory faster than one. Measured per
decode step on the 2-core AMD EPYC (AVX512-BF16), one thread against two, bfloat16 with the
native matrix-vector kernel: hidden 256 (4 layers) 1.6 / 3.6 ms at batch 1; hidden 896 (8
layers) 22.0 / 23.5 ms at batch 1, 36 / 28 ms at batch 4, 111 / 66 ms at batch 16; hidden 1536
(the 2B-shaped model, 4 layers) 34.6 / 29.8, 50 / 35, 100 / 60 (batch 8) and 147 / 84 ms; in
float32 hidden 896 ties (73 / 75 ms at batch 1, 142 / 144 at batch 4) and hidden 1536 gains
(104 / 99 ms, 264 / 217 ms at batch 8). So decode steps run single-threaded below hidden size
768, which also leaves the other core to the API process; prompt chunks and image encoding
keep every thread (a 1283-token chunk over 9k cached tokens: 0.35 s with two threads, 0.66 s
with one).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping

from sglang.srt.model_executor.host_memory import FORWARD_MALLOC_ENV

WAIT_SPINS = "20000"


def compute_env_defaults(environ: Mapping[str, str]) -> dict[str, str]:
    """The settings to add to ``environ``: glibc's thresholds and OpenMP's short spin, each
    unless the environment already says (either OpenMP variable decides the waiting)."""
    defaults = {name: value for name, value in FORWARD_MALLOC_ENV.items() if name not in environ}
    if "OMP_WAIT_POLICY" not in environ and "GOMP_SPINCOUNT" not in environ:
        defaults["GOMP_SPINCOUNT"] = WAIT_SPINS
    return defaults


def apply_compute_env_defaults() -> None:
    """Set the defaults in this process's environment, which a spawned child inherits. Must run
    before the child starts (glibc and OpenMP read their settings once, when they load)."""
    os.environ.update(compute_env_defaults(os.environ))


SINGLE_THREAD_DECODE_BELOW_HIDDEN = 768


def decode_threads(requested: int, hidden_size: int) -> int | None:
    """Intra-op threads for decode steps: ``requested`` if positive, else 1 for language models
    narrower than ``SINGLE_THREAD_DECODE_BELOW_HIDDEN``; None keeps the process's setting."""
    if requested > 0:
        return requested
    return 1 if hidden_size < SINGLE_THREAD_DECODE_BELOW_HIDDEN else None


@contextlib.contextmanager
def intra_op_threads(threads: int | None) -> Iterator[None]:
    """Run the block with ``threads`` intra-op threads (None: unchanged), then restore."""
    import torch  # here, not at the top: the launcher applies the defaults before torch loads

    before = torch.get_num_threads()
    if threads is None or threads == before:
        yield
        return
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)
