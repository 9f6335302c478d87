"""The kernel cache: a finished build (its library and the record written after it) is loaded
as it is, from any environment with the same torch version, CPU and sources; anything else is
built, under the directory's flock, saying why and about how long it will take.

torch's builder regenerates ``build.ninja`` from the loading environment's paths, so a second
virtualenv that went through it would rebuild what the first built; the library is imported
directly instead. A library without its record (a build killed while linking) is never
imported directly: the builder decides, and a record is written only once it has finished.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch.utils.cpp_extension
from conftest import needs_compiler

from sglang.srt import kernels

SOURCE = kernels.CSRC / "quick_gelu.cpp"


def fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    """Forget the modules this process loaded, as a new process would."""
    monkeypatch.setattr(kernels, "_build", functools.cache(kernels._build.__wrapped__))


@pytest.fixture
def builds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """An empty cache in ``tmp_path``, torch's builder replaced by one that writes a library
    and records each build's name, and the direct import by one that records its path."""
    built: list[str] = []

    def fake_build(name: str, build_directory: str, **_: object) -> object:
        built.append(name)
        (Path(build_directory) / f"{name}.so").write_bytes(b"\x7fELF built")
        return SimpleNamespace(origin="built")

    def fake_import(variant: str, library: Path) -> object:
        built.append(f"imported {library.name}")
        return SimpleNamespace(origin="imported")

    monkeypatch.setenv("SGLANG_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(torch.utils.cpp_extension, "load", fake_build)
    monkeypatch.setattr(kernels, "_import", fake_import)
    fresh(monkeypatch)
    return built


def finish_build(library: Path, seconds: float | None = 1.0, **parts: str) -> None:
    """What a finished build leaves: the library, then its record."""
    library.parent.mkdir(parents=True, exist_ok=True)
    library.write_bytes(b"\x7fELF finished")
    kernels._write_record(library, {**kernels._key(SOURCE)[1], **parts}, seconds)


@needs_compiler
def test_a_second_environment_loads_the_library_without_building(tmp_path: Path) -> None:
    """The suite's build of quick_gelu, copied to another cache, loads in a process where any
    build would fail: torch's builder replaced by one that raises and ``CXX=/bin/false``, as
    a second virtualenv's include paths would make ninja rebuild."""
    assert kernels.load("quick_gelu") is not None
    library = kernels._library("quick_gelu", False)
    assert kernels._record(library) is not None, "a finished build leaves its record"
    copy = tmp_path / "kernels" / library.parent.name
    shutil.copytree(library.parent, copy)
    before = {path.name: path.stat().st_mtime_ns for path in copy.iterdir()}
    code = (
        "import torch.utils.cpp_extension as builder\n"
        "def refuse(**_): raise AssertionError('torch builder called')\n"
        "builder.load = refuse\n"
        "from sglang.srt import kernels\n"
        "print(kernels.load('quick_gelu').isa())\n"
    )
    env = {**os.environ, "SGLANG_CACHE_DIR": str(tmp_path), "CXX": "/bin/false"}
    env[kernels.REQUIRE_ENV] = "1"
    env.pop(kernels.DISABLE_ENV, None)
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == [kernels.expected_isa("quick_gelu")]
    assert {path.name: path.stat().st_mtime_ns for path in copy.iterdir()} == before


def test_a_missing_library_is_built_and_recorded(builds: list[str], caplog) -> None:
    caplog.set_level(logging.INFO, logger=kernels.__name__)
    assert kernels.load("quick_gelu").origin == "built"
    library = kernels._library("quick_gelu", False)
    assert builds == ["sglang_quick_gelu"]
    record = kernels._record(library)
    assert record is not None and record["size"] == library.stat().st_size
    assert isinstance(record["seconds"], float)
    before, after = (r.getMessage() for r in caplog.records)
    assert "none of this kernel in the cache yet" in before
    assert f"about {kernels.MEASURED_BUILD_S} s" in before
    assert after.startswith("built native CPU kernel quick_gelu in ")


def test_a_finished_build_is_imported_without_the_builder(builds: list[str]) -> None:
    library = kernels._library("quick_gelu", False)
    finish_build(library)
    assert kernels.load("quick_gelu").origin == "imported"
    assert builds == ["imported sglang_quick_gelu.so"]


@pytest.mark.parametrize("state", ["no record", "record of another size", "broken record"])
def test_a_library_without_its_record_is_never_imported_directly(
    builds: list[str], state: str
) -> None:
    """A build killed while linking leaves a truncated library: the builder decides."""
    library = kernels._library("quick_gelu", False)
    finish_build(library)
    if state == "no record":
        (library.parent / kernels.RECORD).unlink()
    elif state == "record of another size":
        library.write_bytes(b"\x7fEL")
    else:
        (library.parent / kernels.RECORD).write_text('{"library": "sglang_quick_gelu.so"')
    assert kernels.unbuilt() and "quick_gelu" in kernels.unbuilt()
    assert kernels.load("quick_gelu").origin == "built"
    assert builds == ["sglang_quick_gelu"]
    assert kernels._record(library) is not None


def test_a_library_that_does_not_import_is_built_again(
    builds: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    library = kernels._library("quick_gelu", False)
    finish_build(library)

    def undefined_symbol(variant: str, library: Path) -> object:
        raise ImportError("undefined symbol: _ZN3c10")

    monkeypatch.setattr(kernels, "_import", undefined_symbol)
    assert kernels.load("quick_gelu").origin == "built"
    assert builds == ["sglang_quick_gelu"]


def test_a_rebuild_says_what_changed_and_how_long_the_last_build_took(
    builds: list[str], tmp_path: Path, caplog
) -> None:
    caplog.set_level(logging.INFO, logger=kernels.__name__)
    older = tmp_path / "kernels" / "quick_gelu-0123456789abcdef" / "sglang_quick_gelu.so"
    finish_build(older, seconds=42.0, torch="2.0.0", source="0000000000000000")
    assert kernels.load("quick_gelu").origin == "built"
    before = caplog.records[0].getMessage()
    assert "no build for this torch/CPU/source key" in before
    assert f"torch 2.0.0 -> {torch.__version__}" in before
    assert "its source or a csrc/ header changed" in before and "CPU's flags" not in before
    assert "last build of this kernel took 42 s" in before


def test_a_loader_waits_for_a_live_build_and_takes_what_it_built(
    builds: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import fcntl

    library = kernels._library("quick_gelu", False)
    library.parent.mkdir(parents=True)
    (library.parent / "lock").touch()  # torch's own marker, which the live build holds
    loaded: list[object] = []
    with open(library.parent / "build.flock", "w") as live_build:
        fcntl.flock(live_build, fcntl.LOCK_EX)
        loader = threading.Thread(target=lambda: loaded.append(kernels.load("quick_gelu")))
        loader.start()
        loader.join(0.5)
        assert loader.is_alive() and (library.parent / "lock").exists()
        finish_build(library)  # the live build ends
        (library.parent / "lock").unlink()
    loader.join(10)
    assert not loader.is_alive() and [m.origin for m in loaded] == ["imported"]
    assert builds == ["imported sglang_quick_gelu.so"]


def test_prebuild_says_what_it_builds_before_it_builds(
    builds: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Names, count and an estimate first, then one line per finished kernel with its seconds
    (and a failed one's last line of output)."""
    monkeypatch.setattr(kernels, "kernel_names", lambda: ["quick_gelu", "rms_norm"])
    lines: list[str] = []
    older = tmp_path / "kernels" / "quick_gelu-0123456789abcdef" / "sglang_quick_gelu.so"
    finish_build(older, seconds=60.0, torch="2.0.0")

    def child(args: list[str], **_: object) -> subprocess.CompletedProcess[str]:
        name, portable = args[-2], args[-1] == "1"
        lines.append(f"child {name}")
        if name == "rms_norm":
            return subprocess.CompletedProcess(args, 0, "", "warning\nRuntimeError: no ninja")
        finish_build(kernels._library(name, portable))
        return subprocess.CompletedProcess(args, 0, "", "")

    monkeypatch.setattr(kernels.subprocess, "run", child)
    report: Callable[[str], None] = lines.append
    kernels.prebuild(portable=("quick_gelu",), workers=1, report=report)
    head, *why = lines[: lines.index("child quick_gelu")]
    assert head.startswith(f"building 3 native CPU kernels into {tmp_path / 'kernels'}, 1 at a")
    # 60 s for quick_gelu (its last build), MEASURED_BUILD_S for the others (none recorded)
    assert f"about {kernels._duration(60 + 2 * kernels.MEASURED_BUILD_S)}" in head
    assert any(line.endswith(": quick_gelu") and "torch 2.0.0" in line for line in why)
    assert any(line.endswith(": rms_norm, quick_gelu (portable)") for line in why)
    done = [line for line in lines if not line.startswith(("child", "building", "  "))]
    assert [line.split(" in ")[0] for line in done if line.startswith("built")] == [
        "built quick_gelu",
        "built quick_gelu (portable)",
    ]
    assert "rms_norm did not build (" in done[1] and done[1].endswith("RuntimeError: no ninja")
    assert kernels.unbuilt(portable=("quick_gelu",)) == ["rms_norm"]


def test_the_build_record_is_plain_json(builds: list[str]) -> None:
    kernels.load("quick_gelu")
    record = json.loads((kernels._library("quick_gelu", False).parent / kernels.RECORD).read_text())
    assert set(record) == {"library", "size", "seconds", "torch", "cpu", "source"}
