"""Native CPU kernels (C++ in ``csrc/``), compiled at first use for the machine that loads them.

The build uses the installed torch (no build isolation, no CUDA), ``-O3 -march=native`` (the
code is compiled for the ISA present; the build directory is keyed by the CPU's flags, the torch
version, the source and every header of ``csrc/``, so a machine never loads a kernel built
for another) and OpenMP for ``at::parallel_for``. Where no compiler is found or the build fails,
``load`` returns None and callers keep their torch path; ``SGLANG_DISABLE_CPU_KERNELS=1`` forces
that (read at each call, so callers that load per call follow it). With
``SGLANG_REQUIRE_CPU_KERNELS=1`` (CI sets it) a build that fails raises instead, with the
compiler's output. Each module's ``isa()`` names the instruction set it was compiled for
(``expected_isa`` says which this CPU should give).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType

logger = logging.getLogger(__name__)

CSRC = Path(__file__).parent / "csrc"
DISABLE_ENV = "SGLANG_DISABLE_CPU_KERNELS"
REQUIRE_ENV = "SGLANG_REQUIRE_CPU_KERNELS"
AVX512 = ("avx512f", "avx512dq", "avx512bw", "avx512vl")  # vector_math.h's SGLANG_AVX512
# What each kernel's bfloat16 path needs beyond plain x86 (the rest take vector_math.h's rule).
BF16_ONLY = {
    "linear_bf16": ("avx512f",),
    "gemm_bf16": ("avx512f", "avx512bw"),
    "linear_quant": ("avx512f", "avx512bw"),
}
# Kernels whose vector path is AVX512-VNNI's integer products (on the bfloat16 tile's helpers).
VNNI_ONLY = {"linear_int8dq": ("avx512f", "avx512bw", "avx512_bf16", "avx512_vnni")}
# Kernels with an AVX2 path where their AVX-512 one cannot be built (linear_quant: float32
# FMAs; linear_int8dq: vpmaddubsw; decode_attention: its float32 task).
AVX2_FALLBACK = {
    "linear_quant": ("avx2", "fma"),
    "linear_int8dq": ("avx2",),
    "decode_attention": ("avx2", "fma"),
}


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The ISA flags /proc/cpuinfo lists for this CPU (empty where it cannot be read)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def _build_dir(name: str, source: Path) -> Path:
    import torch

    key = hashlib.sha256()
    headers = sorted(source.parent.glob("*.h"))  # any kernel may include any of them
    texts = [source.read_text(), *(h.read_text() for h in headers)]
    for part in (torch.__version__, " ".join(sorted(cpu_flags())), *texts):
        key.update(part.encode())
    root = os.environ.get("SGLANG_CACHE_DIR") or Path.home() / ".cache" / "sglang"
    return Path(root) / "kernels" / f"{name}-{key.hexdigest()[:16]}"


def kernel_names() -> list[str]:
    return sorted(path.stem for path in CSRC.glob("*.cpp"))


def compiler_name() -> str:
    """The C++ compiler torch's extension builder calls: ``$CXX``, else ``c++``."""
    return os.environ.get("CXX", "c++")


def compiler() -> str | None:
    """The path of ``compiler_name()``, or None where there is no such program."""
    return shutil.which(compiler_name())


def expected_isa(name: str) -> str:
    """What ``isa()`` of kernel ``name`` reports when built with ``-march=native`` on this CPU:
    "avx512_vnni", "avx512_bf16", "avx512", "avx2" or "portable"."""
    flags = cpu_flags()
    avx2 = name in AVX2_FALLBACK and all(f in flags for f in AVX2_FALLBACK[name])
    if name in VNNI_ONLY:
        if all(f in flags for f in VNNI_ONLY[name]):
            return "avx512_vnni"
        return "avx2" if avx2 else "portable"
    if name in BF16_ONLY:
        needs = ("avx512_bf16", *BF16_ONLY[name])
        if all(f in flags for f in needs):
            return "avx512_bf16"
        return "avx2" if avx2 else "portable"
    if not all(f in flags for f in AVX512):
        return "avx2" if avx2 else "portable"
    return "avx512_bf16" if "avx512_bf16" in flags else "avx512"


def prebuild(portable: Iterable[str] = (), workers: int | None = None) -> None:
    """Build every kernel, and the portable variants named, into the cache, as many at once as
    there are cores, each in its own process (a compiler runs on one core): a fresh cache
    otherwise builds them one after another at first use, ~30 s each on 2 cores. A build that
    fails is left for ``load`` to report (or raise) when its kernel is first loaded."""
    code = (
        "import sys; from sglang.srt import kernels; "
        "(kernels.load_portable if sys.argv[2] == '1' else kernels.load)(sys.argv[1])"
    )

    def build(job: tuple[str, bool]) -> None:
        args = [sys.executable, "-c", code, job[0], "1" if job[1] else "0"]
        subprocess.run(args, capture_output=True, check=False)

    with ThreadPoolExecutor(workers or os.cpu_count() or 1) as pool:
        list(pool.map(build, _unbuilt(portable)))


def unbuilt(portable: Iterable[str] = ()) -> list[str]:
    """The kernels (and the portable variants named) whose library is not in the cache."""
    return [f"{name}{' (portable)' * variant}" for name, variant in _unbuilt(portable)]


def _unbuilt(portable: Iterable[str]) -> list[tuple[str, bool]]:
    jobs = [(name, False) for name in kernel_names()] + [(name, True) for name in portable]
    return [job for job in jobs if not _library(*job).is_file()]


def _required() -> bool:
    return os.environ.get(REQUIRE_ENV, "0") not in ("", "0")


def load(name: str) -> ModuleType | None:
    """The compiled module of ``csrc/<name>.cpp``, or None where it cannot be built or
    ``SGLANG_DISABLE_CPU_KERNELS`` is set."""
    if os.environ.get(DISABLE_ENV, "0") not in ("", "0"):
        return None
    return _build(name)


def load_portable(name: str) -> ModuleType | None:
    """``csrc/<name>.cpp`` built with ``SGLANG_PORTABLE_KERNELS`` (``vector_math.h``'s plain C++
    paths, as a CPU without AVX-512 gets them), so that tests on any CPU can check those paths
    too. Only kernels whose ISA choice follows ``vector_math.h`` honour the switch."""
    return _build(name, portable=True)


def _library(name: str, portable: bool) -> Path:
    """Where the build of kernel ``name`` (its portable variant) for this CPU and source lands."""
    variant = f"{name}_portable" if portable else name
    return _build_dir(variant, CSRC / f"{name}.cpp") / f"sglang_{variant}.so"


@contextlib.contextmanager
def _sole_builder(directory: Path) -> Iterator[None]:
    """Held while loading or building into ``directory``. torch's builder marks a build with a
    ``lock`` file and waits, without limit, while one exists: a build that was killed (a server
    stopped during its first start) would leave every later start waiting forever. This lock is
    an ``flock``, which the kernel drops when its holder dies, so its holder knows that any
    ``lock`` file there is stale, and removes it."""
    with open(directory / "build.flock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        (directory / "lock").unlink(missing_ok=True)
        yield


@functools.cache
def _build(name: str, portable: bool = False) -> ModuleType | None:
    source = CSRC / f"{name}.cpp"
    try:
        from torch.utils.cpp_extension import load as build

        variant = f"{name}_portable" if portable else name
        library = _library(name, portable)
        directory = library.parent
        directory.mkdir(parents=True, exist_ok=True)
        fresh = not library.is_file()
        if fresh:
            logger.info(
                "building native CPU kernel %s for this CPU (%s): first use only, about 20 s; "
                "cached in %s",
                variant,
                "portable" if portable else expected_isa(name),
                directory,
            )
        start = time.perf_counter()
        defines = ["-DSGLANG_PORTABLE_KERNELS"] if portable else []
        with _sole_builder(directory):
            module = build(
                name=f"sglang_{variant}",
                sources=[str(source)],
                build_directory=str(directory),
                extra_cflags=["-O3", "-march=native", "-fopenmp", *defines],
                extra_ldflags=["-fopenmp"],
                verbose=False,
            )
        if fresh:
            seconds = time.perf_counter() - start
            logger.info("built native CPU kernel %s in %.1f s", variant, seconds)
        return module
    except Exception as exc:  # no compiler, no ninja, a failed build: the torch path stays
        if _required():
            raise RuntimeError(f"native CPU kernel {name} failed to build: {exc}") from exc
        logger.warning("native CPU kernel %s unavailable, using torch: %s", name, exc)
        return None
