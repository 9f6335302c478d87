"""Decode steps of narrow models run single-threaded, prompt chunks with every thread, and the
process's thread setting is restored after each step."""

from __future__ import annotations

import pytest
import torch
from conftest import make_image, model_dir, placeholder

import sglang
from sglang.srt.managers.compute_env import (
    WAIT_SPINS,
    compute_env_defaults,
    decode_threads,
    intra_op_threads,
)
from sglang.srt.model_executor.host_memory import FORWARD_MALLOC_ENV


def test_decode_thread_rule() -> None:
    assert decode_threads(0, 256) == 1
    assert decode_threads(0, 767) == 1
    assert decode_threads(0, 768) is None  # wider models keep every thread
    assert decode_threads(0, 1536) is None
    assert decode_threads(3, 256) == 3 and decode_threads(2, 4096) == 2


def test_compute_process_waits_briefly_unless_the_environment_says_otherwise() -> None:
    assert compute_env_defaults({}) == {"GOMP_SPINCOUNT": WAIT_SPINS, **FORWARD_MALLOC_ENV}
    # Either OpenMP variable decides alone: PASSIVE must not gain a spin count (libgomp would
    # then spin despite it), nor a chosen count be replaced.
    for chosen in ({"OMP_WAIT_POLICY": "PASSIVE"}, {"GOMP_SPINCOUNT": "0"}):
        assert "GOMP_SPINCOUNT" not in compute_env_defaults(chosen)
        assert "OMP_WAIT_POLICY" not in compute_env_defaults(chosen)
    malloc_name = next(iter(FORWARD_MALLOC_ENV))
    assert malloc_name not in compute_env_defaults({malloc_name: "1"})


def test_intra_op_threads_restores_even_on_error() -> None:
    before = torch.get_num_threads()
    with intra_op_threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
    with pytest.raises(RuntimeError), intra_op_threads(1):
        raise RuntimeError("step failed")
    assert torch.get_num_threads() == before
    with intra_op_threads(None):
        assert torch.get_num_threads() == before


def _threads_per_step(engine: sglang.Engine, monkeypatch) -> list[tuple[bool, int]]:
    seen: list[tuple[bool, int]] = []
    forward = engine.runner.forward

    def recording(batch):
        seen.append((batch.is_decode, torch.get_num_threads()))
        return forward(batch)

    monkeypatch.setattr(engine.runner, "forward", recording)
    return seen


@pytest.mark.skipif(torch.get_num_threads() < 2, reason="needs two intra-op threads")
def test_engine_decodes_single_threaded_and_restores(monkeypatch) -> None:
    default = torch.get_num_threads()
    engine = sglang.Engine(dtype="float32", model_path=model_dir("qwen2_5_vl"))
    seen = _threads_per_step(engine, monkeypatch)
    prompt = f"Describe {placeholder('qwen2_5_vl')} briefly."
    params = {"temperature": 0, "max_new_tokens": 6}
    single = engine.generate(prompt, params, image_data=[make_image(1)])
    assert {threads for decode, threads in seen if decode} == {1}
    assert {threads for decode, threads in seen if not decode} == {default}
    assert torch.get_num_threads() == default

    wide = sglang.Engine(
        dtype="float32", model_path=model_dir("qwen2_5_vl"), decode_threads=default
    )
    seen = _threads_per_step(wide, monkeypatch)
    same = wide.generate(prompt, params, image_data=[make_image(1)])
    assert {threads for _, threads in seen} == {default}
    assert same["output_ids"] == single["output_ids"]
