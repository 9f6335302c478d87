"""Memory accounting: weight estimates from safetensors headers against real loaded bytes, the
fit check that refuses a launch before loading, the CPU KV budget rules and the report."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers
from conftest import model_dir
from safetensors import safe_open

import sglang
from sglang.srt.model_executor import host_memory, memory, model_runner
from sglang.srt.model_executor.dtypes import cpu_bfloat16_isa
from sglang.srt.server_args import ServerArgs

FAMILY = "qwen2_5_vl"


def _loaded_bytes(path: str, dtype: torch.dtype) -> int:
    model = transformers.AutoModelForImageTextToText.from_pretrained(path, dtype=dtype)
    return host_memory.module_bytes(model)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_estimate_matches_loaded_bytes(dtype: torch.dtype) -> None:
    path = model_dir(FAMILY)  # a float32 checkpoint: bfloat16 is a conversion
    estimate = memory.estimate_weight_bytes(path, dtype)
    loaded = _loaded_bytes(path, dtype)
    assert estimate is not None
    assert abs(loaded - estimate) <= 0.005 * loaded  # non-persistent buffers (rotary) only


@pytest.mark.parametrize(
    "config, head, vision",
    [
        ("int8wo", "int8", False),
        ("int4wo-128", "int8", False),
        ("int4wo-64", "int4", False),
        ("int8wo", "bfloat16", False),
        ("int8dq", "int8", False),
        ("int8dq", "int8", True),
        ("8da4w-64", "int8", False),
        ("8da4w-32", "int4", True),
    ],
)
def test_quantized_estimate_matches_loaded_bytes(config: str, head: str, vision: bool) -> None:
    """--torchao-config quantizes the language model's linear layers (and the head as
    --cpu-lm-head-dtype says, the tower with --vision-int8dq); the estimate from the float32
    checkpoint's headers matches the bytes of the engine's quantized tensors."""
    pytest.importorskip("torchao")
    eng = sglang.Engine(
        model_path=model_dir(FAMILY),
        torchao_config=config,
        max_total_tokens=64,
        cpu_lm_head_dtype=head,
        vision_int8dq=vision,
    )
    info = eng.get_server_info()["memory"]
    # bfloat16, or float32 activations on a CPU without native bfloat16
    dtype = torch.bfloat16 if cpu_bfloat16_isa() else torch.float32
    assert (info["dtype"], info["quantization"]) == (str(dtype).removeprefix("torch."), config)
    plain = memory.estimate_weight_bytes(model_dir(FAMILY), dtype)
    assert plain is not None and info["weights_bytes"] < plain
    assert info["weights_estimate_bytes"] == pytest.approx(info["weights_bytes"], rel=0.01)
    if head != "int8" or vision:  # the head's width and the tower's show in the estimate
        other = memory.estimate_weight_bytes(model_dir(FAMILY), dtype, config)
        assert other != pytest.approx(info["weights_bytes"], rel=0.01)
    eng.shutdown()


def _int4_bytes(name: str, shape: tuple[int, int], untied_head: bool = False) -> int:
    quant = memory.Quantization.parse("int4wo-128")
    return memory.tensor_bytes_as(name, "F32", shape, torch.bfloat16, quant, untied_head)


def test_int4_estimate_halves_divisible_linears() -> None:
    assert memory.Quantization.parse("int4wo-128") == memory.Quantization(4, 128, tower_int8=True)
    # 8da4w: int4wo's bytes; with --vision-int8dq the tower's int8 linears keep column sums
    assert memory.Quantization.parse("8da4w-128") == memory.Quantization(4, 128, tower_int8=True)
    with_tower = memory.Quantization.parse("8da4w-64", vision_int8dq=True)
    assert with_tower == memory.Quantization(4, 64, dynamic=True, tower_int8=True)
    # half a byte per element + a bfloat16 scale and min per group of 128 columns, any rows
    assert _int4_bytes("model.layers.0.mlp.up_proj.weight", (256, 512)) == 128 * 512 + 4096
    assert _int4_bytes("model.layers.0.self_attn.k_proj.weight", (8, 128)) == 8 * 64 + 8 * 4
    # no whole groups of 128 columns: left in bfloat16
    assert _int4_bytes("model.layers.0.mlp.down_proj.weight", (16, 100)) == 16 * 100 * 2
    # the vision tower's linears, an untied LM head and then the embeddings are int8, and so is
    # a tied pair's one table unless the head stays dense; the tower's norms and position
    # embeddings stay as they are
    assert _int4_bytes("visual.blocks.0.mlp.fc1.weight", (256, 512)) == 256 * 512 + 256 * 4
    assert _int4_bytes("visual.blocks.0.norm1.weight", (512,)) == 512 * 2
    assert _int4_bytes("visual.pos_embed.weight", (256, 512)) == 256 * 512 * 2
    for untied_head in (False, True):
        embed_bytes = _int4_bytes("model.embed_tokens.weight", (256, 512), untied_head)
        assert embed_bytes == 256 * 512 + 256 * 4
    dense_head = memory.Quantization.parse("int4wo-128", "bfloat16")
    tied_table = memory.tensor_bytes_as(
        "model.embed_tokens.weight", "F32", (256, 512), torch.bfloat16, dense_head
    )
    assert tied_table == 256 * 512 * 2
    assert _int4_bytes("lm_head.weight", (256, 512)) == 256 * 512 + 256 * 4


def test_tied_and_quantized_storages_are_counted_once() -> None:
    weight = torch.nn.Parameter(torch.zeros(4, 8))
    assert host_memory.tensors_bytes([weight, weight, weight[1:]]) == 4 * 8 * 4


def _inputs(**changes) -> memory.FitInputs:
    path = model_dir(FAMILY)
    config = transformers.AutoConfig.from_pretrained(path)
    args = ServerArgs(model_path=path, device="cpu", **changes)
    return memory.fit_inputs(args, path, config, torch.float32, torch.float32)


def test_refused_before_loading_with_settings_that_fit(monkeypatch: pytest.MonkeyPatch) -> None:
    inputs = _inputs()
    need_f32 = inputs.plan().total
    need_bf16 = inputs.plan(dtype=torch.bfloat16).total
    assert need_bf16 < need_f32
    monkeypatch.setenv(host_memory.AVAILABLE_ENV, str((need_bf16 + need_f32) // 2))

    def no_load(*_args, **_kwargs):
        raise AssertionError("weights must not load when the model cannot fit")

    monkeypatch.setattr(model_runner, "load_model", no_load)
    with pytest.raises(memory.InsufficientMemoryError) as err:
        sglang.Engine(model_path=model_dir(FAMILY), dtype="float32", device="cpu")
    message = str(err.value)
    assert "not enough memory" in message and "in float32" in message
    assert f"is available ({host_memory.AVAILABLE_ENV})" in message
    assert "--dtype bfloat16" in message.split("Settings that fit:")[1]


def test_refusal_suggests_a_smaller_kv_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    inputs = _inputs()
    plan = inputs.plan()
    available = plan.total - plan.kv // 2  # the weights fit, half the minimum pool does
    message = memory.refusal(inputs, plan, available, "test")
    tokens = int(message.split("--max-total-tokens ")[1].split()[0])
    assert 0 < tokens < plan.kv_tokens


def test_mem_fraction_static_sizes_the_kv_pool() -> None:
    total = host_memory.host_memory_total()[0]
    weights = memory.estimate_weight_bytes(model_dir(FAMILY), torch.float32)
    assert weights is not None
    fraction = (weights + (8 << 20)) / total  # 8 MiB left for the pool after the weights
    eng = sglang.Engine(model_path=model_dir(FAMILY), dtype="float32", mem_fraction_static=fraction)
    report = eng.get_server_info()["memory"]
    assert report["kv_budget_rule"] == "mem_fraction_static"
    assert abs(report["kv_pool_bytes"] - (8 << 20)) <= (256 << 10)
    assert report["static_bytes"] <= fraction * total + report["kv_bytes_per_token"]
    with pytest.raises(memory.InsufficientMemoryError, match="--mem-fraction-static"):
        sglang.Engine(
            dtype="float32", model_path=model_dir(FAMILY), mem_fraction_static=weights / total / 2
        )


def test_server_info_reports_memory() -> None:
    eng = sglang.Engine(model_path=model_dir(FAMILY), dtype="float32", max_total_tokens=64)
    info = eng.get_server_info()["memory"]
    # The checkpoint's tensors (float32, as the engine runs them) and the model's buffers.
    checkpoint = 0
    for path in Path(model_dir(FAMILY)).glob("*.safetensors"):
        with safe_open(str(path), "pt") as f:
            checkpoint += sum(4 * math.prod(f.get_slice(k).get_shape()) for k in f.keys())
    buffers = sum(b.numel() * b.element_size() for b in eng.runner.model.buffers())
    assert info["weights_bytes"] == checkpoint + buffers
    assert info["weights_estimate_bytes"] == pytest.approx(info["weights_bytes"], rel=0.005)
    assert (info["kv_pool_tokens"], info["kv_budget_rule"]) == (64, "max_total_tokens")
    assert info["kv_pool_bytes"] == 64 * info["kv_bytes_per_token"]
    assert info["mm_embedding_cache_bytes"] == eng.server_args.mm_cache_bytes
    assert info["static_bytes"] == info["weights_bytes"] + info["kv_pool_bytes"]


def test_default_cpu_budget_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(host_memory.AVAILABLE_ENV, str(64 << 30))
    assert memory.cpu_kv_budget(None, 0, 0, 1 << 20) == (memory.CPU_KV_BUDGET_BYTES, "default")
    monkeypatch.setenv(host_memory.AVAILABLE_ENV, str(300 << 20))
    assert memory.cpu_kv_budget(None, 0, 100 << 20, 1 << 20) == (200 << 20, "default")
    assert memory.cpu_kv_budget(None, 0, 400 << 20, 1 << 20) == (1 << 20, "default")  # floor


def test_cgroup_limit_is_the_host_total(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    limit, usage = tmp_path / "memory.max", tmp_path / "memory.current"
    limit.write_text(f"{2 << 30}\n")
    usage.write_text(f"{(1 << 30) + (512 << 20)}\n")
    monkeypatch.setattr(host_memory, "_CGROUP_FILES", ((str(limit), str(usage)),))
    monkeypatch.delenv(host_memory.AVAILABLE_ENV, raising=False)
    assert host_memory.host_memory_total() == (2 << 30, "cgroup limit")
    assert host_memory.host_memory_available() == (512 << 20, "cgroup limit - usage")
    limit.write_text("max\n")
    assert host_memory.host_memory_total()[1] == "MemTotal"


def test_launch_server_refuses_before_starting_the_scheduler() -> None:
    env = {
        **os.environ,
        host_memory.AVAILABLE_ENV: str(1 << 20),
        "PYTHONPATH": os.pathsep.join(sys.path),
    }
    cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", model_dir(FAMILY),
           "--dtype", "float32", "--port", "1"]  # fmt: skip
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("error: not enough memory") and "1.0 MiB is available" in last
    assert "scheduler" not in done.stderr  # refused before the scheduler process loaded anything


class _FakeLibc:
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def mallopt(self, param: int, value: int) -> int:
        self.calls.append(("mallopt", param, value))
        return 1

    def malloc_trim(self, pad: int) -> int:
        self.calls.append(("malloc_trim", pad))
        return 1


def test_heap_is_returned_after_loading(monkeypatch: pytest.MonkeyPatch) -> None:
    """Loading runs with low malloc thresholds, then the freed heap is trimmed and the forwards'
    raised thresholds (clamped to a C int) are set: the environment's where it has them, else
    compute_env's defaults (an offline Engine in a process started without them)."""
    libc = _FakeLibc()
    monkeypatch.setattr(host_memory, "_libc", lambda: libc)
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", str(16 << 30))
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", str(16 << 30))
    with host_memory.heap_returned_while_loading():
        low = list(libc.calls)
    low_value = host_memory.LOAD_MALLOC_THRESHOLD
    assert low == [("mallopt", -1, low_value), ("mallopt", -3, low_value)]
    assert libc.calls[2:] == [
        ("malloc_trim", 0),
        ("mallopt", -1, (1 << 31) - 1),
        ("mallopt", -3, (1 << 31) - 1),
    ]
    raised_calls = list(libc.calls)
    monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_")
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_")
    libc.calls.clear()
    with host_memory.heap_returned_while_loading():
        pass
    assert libc.calls == raised_calls  # an offline Engine's process: compute_env's defaults
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "131072")  # the user's own setting wins
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "131072")
    libc.calls.clear()
    with host_memory.heap_returned_while_loading():
        pass
    assert libc.calls[-2:] == [("mallopt", -1, 131072), ("mallopt", -3, 131072)]
