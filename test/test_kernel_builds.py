"""The native CPU kernels build wherever a C++ compiler exists, for the instruction set this CPU
has, and a bfloat16 engine runs on them.

A kernel that failed to build would leave its callers on their torch paths. CI sets
``SGLANG_REQUIRE_CPU_KERNELS=1``, under which ``kernels.load`` raises with the compiler's
message; without it, the kernel tests still fail (they skip only where no compiler exists).
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path

import pytest
from conftest import NATIVE_GEMM_EXPECTED, model_dir, needs_compiler

import sglang
from sglang.srt import kernels
from sglang.srt.kernels import ops
from sglang.srt.layers.quantization import packed_linear


@needs_compiler
@pytest.mark.parametrize("name", kernels.kernel_names())
def test_every_kernel_builds_for_this_cpu(name: str) -> None:
    module = kernels.load(name)
    assert module is not None, f"{name} did not build (the warning above has the compiler output)"
    assert module.isa() == kernels.expected_isa(name), sorted(kernels.cpu_flags())


@needs_compiler
def test_a_failing_build_raises_where_kernels_are_required(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("SGLANG_CACHE_DIR", str(tmp_path))  # nothing built there yet
    monkeypatch.setenv("CXX", "/bin/false")
    monkeypatch.setattr(kernels, "_build", functools.cache(kernels._build.__wrapped__))
    monkeypatch.setenv(kernels.REQUIRE_ENV, "1")
    with pytest.raises(RuntimeError, match="quick_gelu failed to build"):
        kernels.load("quick_gelu")
    monkeypatch.setenv(kernels.REQUIRE_ENV, "0")
    assert kernels.load("quick_gelu") is None  # not required: callers keep their torch path


@needs_compiler
def test_the_build_command_names_what_did_not_build(tmp_path, monkeypatch, capsys) -> None:
    """``python -m sglang.srt.kernels`` (CI runs it while its packages install): exit 0 once
    everything is in the cache, else 1 and the kernels left out (a failing build's own report
    is ``test_a_failing_build_raises_where_kernels_are_required``'s)."""
    from sglang.srt.kernels.__main__ import main

    assert kernels.unbuilt(portable=("linear_quant",)) == []  # the suite's cache: all built
    assert main(["--portable", "linear_quant"]) == 0
    monkeypatch.setenv("SGLANG_CACHE_DIR", str(tmp_path))  # nothing built there
    monkeypatch.setattr(kernels, "prebuild", lambda portable=(), **_: None)  # nothing builds
    assert main(["--portable", "linear_quant"]) == 1
    left_out = capsys.readouterr().err.strip().removeprefix("not built: ").split(", ")
    assert left_out == [*kernels.kernel_names(), "linear_quant (portable)"]
    # a build that fails once (a passing cause) is tried again
    monkeypatch.setenv("SGLANG_CACHE_DIR", str(tmp_path / "retry"))
    calls: list[tuple[str, ...]] = []

    def second_time_lucky(portable: tuple[str, ...] = (), **_: object) -> None:
        calls.append(tuple(portable))
        for name, variant in kernels._unbuilt(portable) if len(calls) == 2 else []:
            library = kernels._library(name, variant)
            library.parent.mkdir(parents=True, exist_ok=True)
            library.write_bytes(b"")
            kernels._write_record(library, kernels._key(kernels.CSRC / f"{name}.cpp")[1], 1.0)

    monkeypatch.setattr(kernels, "prebuild", second_time_lucky)
    assert main(["--portable", "linear_quant"]) == 0 and len(calls) == 2


def test_a_first_build_says_so_before_and_after(tmp_path, monkeypatch, caplog) -> None:
    """A first run must not look like a hang: one line before the compiler starts (what, for
    which ISA, why, roughly how long, where it is cached) and one when done; a cached kernel
    is silent, and imported without the builder."""
    import torch.utils.cpp_extension

    compiles: list[list[str]] = []
    monkeypatch.setattr(kernels, "_import", lambda variant, library: object())

    def fake_build(name: str, build_directory: str, **_: object) -> object:
        compiles.append([r.getMessage() for r in caplog.records])
        (Path(build_directory) / f"{name}.so").write_bytes(b"")
        return object()

    monkeypatch.setenv("SGLANG_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(torch.utils.cpp_extension, "load", fake_build)
    monkeypatch.setattr(kernels, "_build", functools.cache(kernels._build.__wrapped__))
    caplog.set_level(logging.INFO, logger=kernels.__name__)
    kernels.load("quick_gelu")
    (before,) = compiles[0]
    assert before.startswith("building native CPU kernel quick_gelu")
    assert kernels.expected_isa("quick_gelu") in before and str(tmp_path / "kernels") in before
    assert "no build for this torch/CPU/source key" in before and " s on 2 cores" in before
    assert caplog.records[-1].getMessage().startswith("built native CPU kernel quick_gelu in ")

    caplog.clear()
    monkeypatch.setattr(kernels, "_build", functools.cache(kernels._build.__wrapped__))
    kernels.load("quick_gelu")
    assert len(compiles) == 1 and caplog.records == []


def test_a_killed_build_is_not_waited_for_and_a_live_one_is(tmp_path, monkeypatch) -> None:
    """torch's builder waits while its ``lock`` file exists: one that a killed build left is
    removed before building; one that a live build holds (it holds the flock too) is waited
    for."""
    import fcntl
    import threading

    import torch.utils.cpp_extension

    lock_seen: list[bool] = []

    def fake_build(name: str, build_directory: str, **_: object) -> object:
        lock_seen.append((Path(build_directory) / "lock").exists())
        (Path(build_directory) / f"{name}.so").write_bytes(b"")
        return object()

    def fresh_load() -> threading.Thread:
        monkeypatch.setattr(kernels, "_build", functools.cache(kernels._build.__wrapped__))
        loader = threading.Thread(target=kernels.load, args=("quick_gelu",))
        loader.start()
        return loader

    monkeypatch.setenv("SGLANG_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(torch.utils.cpp_extension, "load", fake_build)
    directory = kernels._library("quick_gelu", False).parent
    directory.mkdir(parents=True)
    (directory / "lock").touch()  # left by a killed build
    fresh_load().join(10)
    assert lock_seen == [False]

    (directory / kernels.RECORD).unlink()  # the library gone again: built under the flock
    (directory / "lock").touch()
    with open(directory / "build.flock", "w") as live_build:
        fcntl.flock(live_build, fcntl.LOCK_EX)
        loader = fresh_load()
        loader.join(0.5)
        assert loader.is_alive() and (directory / "lock").exists() and len(lock_seen) == 1
        (directory / "lock").unlink()  # the live build ends
    loader.join(10)
    assert not loader.is_alive() and lock_seen == [False, False]


def test_the_expected_isa_follows_the_cpu_flags(monkeypatch) -> None:
    avx512 = {"avx512f", "avx512dq", "avx512bw", "avx512vl"}
    cases = [  # flags, the shared rule's ISA, the attention kernels', linear_bf16's, linear_quant's
        ({"avx2"}, "portable", "portable", "portable", "portable"),  # no FMA: no AVX2 path
        ({"avx2", "fma"}, "portable", "avx2", "avx2", "avx2"),
        (avx512 | {"avx2", "fma"}, "avx512", "avx512", "avx2", "avx2"),
        (
            avx512 | {"avx512_bf16", "avx2", "fma"},
            *("avx512_bf16", "avx512_bf16", "avx512_bf16", "avx512_bf16"),
        ),
        ({"avx512f", "avx512_bf16"}, "portable", "portable", "avx512_bf16", "portable"),
    ]
    for flags, shared, attention, linear, quant in cases:
        monkeypatch.setattr(kernels, "cpu_flags", lambda flags=flags: frozenset(flags))
        assert kernels.expected_isa("quick_gelu") == shared
        assert kernels.expected_isa("prefill_attention") == attention
        assert kernels.expected_isa("decode_attention") == attention
        assert kernels.expected_isa("linear_bf16") == linear
        assert kernels.expected_isa("linear_quant") == quant
    vnni = avx512 | {"avx512_bf16", "avx512_vnni"}
    cases = [
        (vnni, "avx512_vnni"),
        (vnni - {"avx512_vnni"}, "portable"),
        (vnni - {"avx512_vnni"} | {"avx2"}, "avx2"),
        ({"avx2"}, "avx2"),
        ({"fma"}, "portable"),
    ]
    for flags, want in cases:
        monkeypatch.setattr(kernels, "cpu_flags", lambda flags=flags: frozenset(flags))
        assert kernels.expected_isa("linear_int8dq") == want


@needs_compiler
def test_a_bfloat16_engine_runs_on_the_kernels() -> None:
    engine = sglang.Engine(model_path=model_dir("qwen2_5_vl"), dtype="bfloat16")
    runner = engine.runner
    assert runner.attn_backend.prefill_kernel is not None
    assert runner.attn_backend.decode_kernel is not None
    tower = [m for m in runner.model.model.visual.modules() if hasattr(m, "attention_kernel")]
    assert tower and all(m.attention_kernel is not None for m in tower)
    lm = list(runner.adapter.language_model.modules())
    # the language model's linears: one packed layout on the native GEMM where it builds, else
    # plain weights on the decode kernel
    on_gemm = [m for m in lm if packed_linear.holds_only_packed(m) and m.packed_gemm is not None]
    on_decode_kernel = [m for m in lm if getattr(m, "_decode_kernel", None) is not None]
    assert on_gemm if NATIVE_GEMM_EXPECTED else on_decode_kernel
    assert any(hasattr(m, "_silu_and_mul") for m in lm)
    packed = [m for m in runner.model.modules() if hasattr(m, "packed_weight")]
    if packed_linear.available():  # the tower's linears packed: the native GEMM's or oneDNN's
        assert packed and all((m.packed_gemm is not None) == NATIVE_GEMM_EXPECTED for m in packed)
    else:  # no bfloat16 product of oneDNN's here (AVX2 only): torch's F.linear, unpacked
        assert not packed and not NATIVE_GEMM_EXPECTED
    assert (ops.native_gemm() is not None) == NATIVE_GEMM_EXPECTED
    engine.shutdown()


_ACCESSORS = {
    "decode_attention": ops.decode_attention,
    "gemm_bf16": ops.gemm_bf16,
    "linear_bf16": ops.linear_bf16,
    "linear_int8dq": ops.linear_int8_dynamic,
    "linear_quant": ops.linear_quant,
    "prefill_attention": ops.prefill_attention,
    "quick_gelu": ops.quick_gelu,
    "rms_norm": ops.rms_norm,
    "rotary": ops.rotary,
    "silu_and_mul": ops.silu_and_mul,
    "vision_rotary": ops.vision_rotary,
}


def _protocol_functions(accessor) -> set[str]:
    import typing

    returned = typing.get_type_hints(accessor)["return"]
    (protocol,) = [t for t in typing.get_args(returned) if t is not type(None)]
    return {n for cls in protocol.__mro__ if cls.__module__ == ops.__name__ for n in vars(cls)
            if not n.startswith("_")}  # fmt: skip


def test_every_kernel_has_a_typed_accessor_and_exports_what_it_declares() -> None:
    """``kernels.ops`` covers every csrc kernel, and each built module exports every function
    its protocol declares (a renamed C++ function fails here, not at a caller)."""
    assert sorted(_ACCESSORS) == kernels.kernel_names()
    for name, accessor in _ACCESSORS.items():
        module = accessor()
        if module is None:
            assert kernels.compiler() is None, name  # no compiler: no kernel at all
            continue
        declared = _protocol_functions(accessor)
        assert "isa" in declared and declared <= set(dir(module)), (
            name,
            declared - set(dir(module)),
        )
