"""Process-level settings for the compute (scheduler) process, applied before it starts.

OpenMP worker threads that finish a parallel region spin for a while before they sleep
(libgomp's default). On a CPU shared with other processes (or with this server's own API
process) a spinning worker holds a core that the other worker, preempted, needs to reach the
next barrier, and every region then waits a scheduler time slice. Sleeping at once
(``OMP_WAIT_POLICY=PASSIVE``) removes that: measured on the 2-core development machine under a
load average of ~12, a 448x448 image through the small model's vision tower took 0.83-0.87 s
instead of 2.6-3.3 s, and 64 decode-size attention calls 48-50 ms instead of 0.35-1.5 s. A value
already in the environment wins (``OMP_WAIT_POLICY=ACTIVE`` restores spinning).
"""

from __future__ import annotations

import os

COMPUTE_ENV_DEFAULTS = {"OMP_WAIT_POLICY": "PASSIVE"}


def apply_compute_env_defaults() -> None:
    """Set the defaults in this process's environment, which a spawned child inherits. Must run
    before the child imports torch (OpenMP reads its settings once, when it loads)."""
    for name, value in COMPUTE_ENV_DEFAULTS.items():
        os.environ.setdefault(name, value)
