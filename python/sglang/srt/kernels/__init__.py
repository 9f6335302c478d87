"""Native CPU kernels (C++ in ``csrc/``), compiled at first use for the machine that loads them.

The build uses the installed torch (no build isolation, no CUDA), ``-O3 -march=native`` (the
code is compiled for the ISA present; the build directory is keyed by the CPU's flags, the torch
version, the source and every header of ``csrc/``, so a machine never loads a kernel built
for another) and OpenMP for ``at::parallel_for``. A build that finishes leaves a record
(``build.json``: the library's size, the key's parts, the seconds it took) beside its library;
a library with its record is imported directly, without torch's builder, so that a second
environment with the same torch version, CPU and sources (another virtualenv, whose build
commands name other include paths) rebuilds nothing. A library without one (an interrupted
build) goes through the builder, under an ``flock``. Where no compiler is found or the build
fails, ``load`` returns None and callers keep their torch path; ``SGLANG_DISABLE_CPU_KERNELS=1``
forces that (read at each call, so callers that load per call follow it). With
``SGLANG_REQUIRE_CPU_KERNELS=1`` (CI sets it) a build that fails raises instead, with the
compiler's output. Each module's ``isa()`` names the instruction set it was compiled for
(``expected_isa`` says which this CPU should give).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import importlib.util
import itertools
import json
import logging
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType
from typing import Any

logger = logging.getLogger(__name__)

CSRC = Path(__file__).parent / "csrc"
DISABLE_ENV = "SGLANG_DISABLE_CPU_KERNELS"
REQUIRE_ENV = "SGLANG_REQUIRE_CPU_KERNELS"
RECORD = "build.json"  # written beside a library once its build has finished
# One kernel's build where the cache records none: measured, `python -m sglang.srt.kernels
# --portable linear_quant linear_int8dq` into an empty cache, two at a time on the 2 cores of an
# Intel Xeon (Ice Lake, 2.6 GHz) that other work shared: 26-72 s a kernel, 5.8 min for all 13.
# CI's builds, beside its pip install, took 90-115 s each.
MEASURED_BUILD_S = 55
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
# FMAs; linear_int8dq: vpmaddubsw; decode_attention: its float32 task; prefill_attention: its
# float32 tiles; linear_bf16: float32 rows times widened bfloat16 weights).
AVX2_FALLBACK = {
    "linear_bf16": ("avx2", "fma"),
    "linear_quant": ("avx2", "fma"),
    "linear_int8dq": ("avx2",),
    "decode_attention": ("avx2", "fma"),
    "prefill_attention": ("avx2", "fma"),
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


def cache_dir() -> Path:
    """Where builds are kept: ``$SGLANG_CACHE_DIR/kernels``, else ``~/.cache/sglang/kernels``."""
    root = os.environ.get("SGLANG_CACHE_DIR") or Path.home() / ".cache" / "sglang"
    return Path(root) / "kernels"


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _key(source: Path) -> tuple[str, dict[str, str]]:
    """The key that names ``source``'s build directory, and the parts it is made of (the
    torch version, digests of the CPU flags and of the sources), which a build's record keeps
    so that a later build under another key can say what changed."""
    import torch

    headers = sorted(source.parent.glob("*.h"))  # any kernel may include any of them
    texts = [source.read_text(), *(h.read_text() for h in headers)]
    flags = " ".join(sorted(cpu_flags()))
    key = hashlib.sha256()
    for part in (torch.__version__, flags, *texts):
        key.update(part.encode())
    parts = {"torch": torch.__version__, "cpu": _digest(flags), "source": _digest("\0".join(texts))}
    return key.hexdigest()[:16], parts


def _build_dir(name: str, source: Path) -> Path:
    return cache_dir() / f"{name}-{_key(source)[0]}"


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


def prebuild(
    portable: Iterable[str] = (),
    workers: int | None = None,
    report: Callable[[str], None] | None = None,
) -> None:
    """Build every kernel, and the portable variants named, into the cache, as many at once as
    there are cores, each in its own process (a compiler runs on one core): a fresh cache
    otherwise builds them one after another at first use. ``report`` is given, before any
    build starts, what will be built (names, count, estimate, why) and then one line per
    finished build with its seconds. A build that fails is left for ``load`` to report (or
    raise) when its kernel is first loaded."""
    jobs = _unbuilt(portable)
    if not jobs:
        return
    workers = max(1, min(workers or os.cpu_count() or 1, len(jobs)))
    if report is not None:
        for line in _plan(jobs, workers):
            report(line)
    code = (
        "import sys; from sglang.srt import kernels; "
        "(kernels.load_portable if sys.argv[2] == '1' else kernels.load)(sys.argv[1])"
    )
    finished = itertools.count(1)

    def build(job: tuple[str, bool]) -> None:
        start = time.perf_counter()
        args = [sys.executable, "-c", code, job[0], "1" if job[1] else "0"]
        result = subprocess.run(args, capture_output=True, text=True, check=False)
        if report is None:
            return
        seconds, done = time.perf_counter() - start, f"{next(finished)}/{len(jobs)}"
        record = _record(_library(*job))
        if record is not None and record.get("seconds") is None:  # ninja found it up to date
            report(f"{_label(*job)} was built: recorded it ({seconds:.0f} s, {done})")
        elif record is not None:
            report(f"built {_label(*job)} in {seconds:.0f} s ({done})")
        else:
            said = result.stderr.strip().splitlines() or ["no output"]
            report(f"{_label(*job)} did not build ({seconds:.0f} s, {done}): {said[-1][:300]}")

    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(build, jobs))


def _label(name: str, portable: bool) -> str:
    return f"{name}{' (portable)' * portable}"


def _plan(jobs: list[tuple[str, bool]], workers: int) -> list[str]:
    """What ``prebuild`` says before it starts: the count, the place, an estimate of the time
    (from the last recorded build of each kernel, else ``MEASURED_BUILD_S``) and, kernel by
    kernel, why each is built."""
    recorded = [_last_seconds(_variant(*job)) for job in jobs]
    seconds = [MEASURED_BUILD_S if s is None else s for s in recorded]
    wall = max(sum(seconds) / workers, max(seconds))
    if all(s is None for s in recorded):
        basis = f"none recorded in this cache; ~{MEASURED_BUILD_S} s a kernel, measured on 2 cores"
    elif None in recorded:
        basis = f"the last build of each where recorded, else ~{MEASURED_BUILD_S} s"
    else:
        basis = "the last build of each in this cache"
    lines = [
        f"building {len(jobs)} native CPU kernel{'s' * (len(jobs) > 1)} into {cache_dir()}, "
        f"{workers} at a time: about {_duration(wall)} ({basis})"
    ]
    reasons: dict[str, list[str]] = {}
    for job in jobs:
        _, parts = _key(CSRC / f"{job[0]}.cpp")
        reasons.setdefault(_why(_variant(*job), _library(*job), parts), []).append(_label(*job))
    lines += [f"  {why}: {', '.join(names)}" for why, names in reasons.items()]
    return lines


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


def unbuilt(portable: Iterable[str] = ()) -> list[str]:
    """The kernels (and the portable variants named) with no finished build in the cache."""
    return [_label(name, variant) for name, variant in _unbuilt(portable)]


def _unbuilt(portable: Iterable[str]) -> list[tuple[str, bool]]:
    jobs = [(name, False) for name in kernel_names()] + [(name, True) for name in portable]
    return [job for job in jobs if _record(_library(*job)) is None]


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


def _variant(name: str, portable: bool) -> str:
    return f"{name}_portable" if portable else name


def _library(name: str, portable: bool) -> Path:
    """Where the build of kernel ``name`` (its portable variant) for this CPU and source lands."""
    variant = _variant(name, portable)
    return _build_dir(variant, CSRC / f"{name}.cpp") / f"sglang_{variant}.so"


def _record(library: Path) -> dict[str, Any] | None:
    """The record of the finished build that made ``library``, or None where there is none (a
    build never finished there) or it does not describe the file there now."""
    try:
        record = json.loads((library.parent / RECORD).read_text())
        if record["library"] == library.name and record["size"] == library.stat().st_size:
            return record
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return None


def _write_record(library: Path, parts: dict[str, str], seconds: float | None) -> None:
    """Marks ``library`` as finished: flushed to disk first, then its record written whole
    (renamed into place), so that no reader ever takes a half-written library for a built one."""
    with open(library, "rb") as handle:
        os.fsync(handle.fileno())
    record = {"library": library.name, "size": library.stat().st_size, "seconds": seconds, **parts}
    partial = library.parent / f"{RECORD}.{os.getpid()}.tmp"
    partial.write_text(json.dumps(record, indent=1) + "\n")
    os.replace(partial, library.parent / RECORD)


def _records(variant: str) -> list[tuple[Path, dict[str, Any]]]:
    """The build directories of ``variant`` in the cache (any key) with their records, newest
    record first."""
    found: list[tuple[float, Path, dict[str, Any]]] = []
    for path in cache_dir().glob(f"{variant}-*/{RECORD}"):
        try:
            record = json.loads(path.read_text())
            if isinstance(record, dict):
                found.append((path.stat().st_mtime, path.parent, record))
        except (OSError, ValueError):
            continue
    found.sort(key=lambda entry: entry[0], reverse=True)
    return [(directory, record) for _, directory, record in found]


def _last_seconds(variant: str) -> float | None:
    """How long the newest recorded build of ``variant`` in the cache took, if one is recorded."""
    for _, record in _records(variant):
        if isinstance(record.get("seconds"), int | float):
            return float(record["seconds"])
    return None


def _why(variant: str, library: Path, parts: dict[str, str]) -> str:
    """Why ``library`` is to be built: what differs from the newest other build of the kernel."""
    if library.is_file():
        return (
            "its library has no record of a finished build (an interrupted build, or one "
            "from before records were kept)"
        )
    other = next((r for d, r in _records(variant) if d != library.parent), None)
    if other is None:
        return "no build for this torch/CPU/source key (none of this kernel in the cache yet)"
    changed = []
    if other.get("torch") != parts["torch"]:
        changed.append(f"torch {other.get('torch')} -> {parts['torch']}")
    if other.get("cpu") != parts["cpu"]:
        changed.append("another CPU's flags")
    if other.get("source") != parts["source"]:
        changed.append("its source or a csrc/ header changed")
    since = f"{', '.join(changed)} since its newest other build" if changed else "a new key"
    return f"no build for this torch/CPU/source key ({since})"


def _estimate(variant: str) -> str:
    seconds = _last_seconds(variant)
    if seconds is None:
        return f"no build of it recorded here: about {MEASURED_BUILD_S} s on 2 cores"
    return f"last build of this kernel took {seconds:.0f} s"


def _import(variant: str, library: Path) -> ModuleType:
    """What torch's loader does once its build is done: import the library as a module."""
    import torch  # noqa: F401  (loads the torch libraries the kernel's library links against)

    spec = importlib.util.spec_from_file_location(f"sglang_{variant}", library)
    if spec is None or spec.loader is None:
        raise ImportError(f"{library} cannot be imported")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@contextlib.contextmanager
def _sole_builder(directory: Path) -> Iterator[None]:
    """Held while building into ``directory``. torch's builder marks a build with a ``lock``
    file and waits, without limit, while one exists: a build that was killed (a server stopped
    during its first start) would leave every later start waiting forever. This lock is an
    ``flock``, which the kernel drops when its holder dies, so its holder knows that any
    ``lock`` file there is stale, and removes it."""
    with open(directory / "build.flock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        (directory / "lock").unlink(missing_ok=True)
        yield


@functools.cache
def _build(name: str, portable: bool = False) -> ModuleType | None:
    variant = _variant(name, portable)
    try:
        library = _library(name, portable)
        broken = False
        if _record(library) is not None:
            try:
                return _import(variant, library)
            except ImportError as exc:  # a finished build this torch cannot load: build again
                logger.warning("native CPU kernel %s did not load (%s): rebuilding", variant, exc)
                broken = True
        library.parent.mkdir(parents=True, exist_ok=True)
        with _sole_builder(library.parent):
            if not broken and _record(library) is not None:
                return _import(variant, library)  # another process built it while this waited
            return _compile(name, portable, library, broken)
    except Exception as exc:  # no compiler, no ninja, a failed build: the torch path stays
        if _required():
            raise RuntimeError(f"native CPU kernel {name} failed to build: {exc}") from exc
        logger.warning("native CPU kernel %s unavailable, using torch: %s", name, exc)
        return None


def _compile(name: str, portable: bool, library: Path, broken: bool) -> ModuleType:
    """Builds ``library`` with torch's builder (ninja) and records the build once it finished.
    Called with the directory's flock held."""
    from torch.utils.cpp_extension import load as build

    variant, directory = _variant(name, portable), library.parent
    source = CSRC / f"{name}.cpp"
    _, parts = _key(source)
    (directory / RECORD).unlink(missing_ok=True)
    if broken:
        library.unlink(missing_ok=True)
    logger.info(
        "building native CPU kernel %s for this CPU (%s): %s; %s; cached in %s",
        variant,
        "portable" if portable else expected_isa(name),
        "its library did not load" if broken else _why(variant, library, parts),
        _estimate(variant),
        directory,
    )
    defines = ["-DSGLANG_PORTABLE_KERNELS"] if portable else []
    before = _stamp(library)
    start = time.perf_counter()
    module = build(
        name=f"sglang_{variant}",
        sources=[str(source)],
        build_directory=str(directory),
        extra_cflags=["-O3", "-march=native", "-fopenmp", *defines],
        extra_ldflags=["-fopenmp"],
        verbose=False,
    )
    seconds = time.perf_counter() - start
    compiled = _stamp(library) != before  # else ninja found an unrecorded library up to date
    _write_record(library, parts, round(seconds, 1) if compiled else None)
    if compiled:
        logger.info("built native CPU kernel %s in %.1f s", variant, seconds)
    else:
        logger.info("native CPU kernel %s was up to date; recorded it as built", variant)
    return module


def _stamp(library: Path) -> tuple[int, int] | None:
    try:
        stat = library.stat()
    except FileNotFoundError:
        return None
    return stat.st_ino, stat.st_mtime_ns
