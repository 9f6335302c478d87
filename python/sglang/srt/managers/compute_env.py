"""Process-level settings for the compute (scheduler) process, applied before it starts.

OpenMP worker threads that finish a parallel region spin for a while before they sleep
(libgomp's default). On a CPU shared with other processes (or with this server's own API
process) a spinning worker holds a core that the other worker, preempted, needs to reach the
next barrier, and every region then waits a scheduler time slice. Sleeping at once
(``OMP_WAIT_POLICY=PASSIVE``) removes that: measured on the 2-core development machine under a
load average of ~12, a 448x448 image through the small model's vision tower took 0.83-0.87 s
instead of 2.6-3.3 s, and 64 decode-size attention calls 48-50 ms instead of 0.35-1.5 s. A value
already in the environment wins (``OMP_WAIT_POLICY=ACTIVE`` restores spinning).

glibc's malloc hands large blocks (activations of tens of MB) back to the kernel when they are
freed and maps them anew on the next allocation, so every forward pays page faults on fresh
zeroed pages: 140k minor faults and 0.2 s of system time per 720p image through the small
vision tower. With the mmap and trim thresholds raised, freed blocks stay in the heap and are
reused: 0 faults, 0.03 s system time, 7-11% less wall time (same machine, same load). The
heap then keeps its peak size, as tcmalloc-style allocators do.
"""

from __future__ import annotations

import os

COMPUTE_ENV_DEFAULTS = {
    "OMP_WAIT_POLICY": "PASSIVE",
    "MALLOC_MMAP_THRESHOLD_": str(16 << 30),
    "MALLOC_TRIM_THRESHOLD_": str(16 << 30),
}


def apply_compute_env_defaults() -> None:
    """Set the defaults in this process's environment, which a spawned child inherits. Must run
    before the child starts (glibc and OpenMP read their settings once, when they load)."""
    for name, value in COMPUTE_ENV_DEFAULTS.items():
        os.environ.setdefault(name, value)
