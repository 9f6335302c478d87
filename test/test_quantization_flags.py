"""What ``--torchao-config`` and a published checkpoint's quantization decide before any
logprob is compared: the accepted values and the refusals (in SGLang's words, before loading),
the layers int4 skips, the activations int4wo takes on each kind of CPU, and the FLOPs a
quantized tower reports."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from conftest import (
    make_image,
    model_dir,
    placeholder,
)
from quant_reference import exact_weight, stored_quantized
from torch import nn

import sglang
from sglang.launch_server import parse_args
from sglang.srt import kernels
from sglang.srt.layers.quantization.quantized_linear import QuantizedLinear
from sglang.srt.model_executor.quantization import (
    apply_torchao_config,
)
from sglang.srt.models.adapters import UnsupportedModelError, check_model

PROMPT = f"Look at {placeholder('qwen2_5_vl')} and tell me what you see in the picture, briefly."
ONE_TOKEN = {"temperature": 0, "max_new_tokens": 1}


def test_a_quantized_tower_counts_the_same_flops() -> None:
    """The tower's FLOP counters follow its linears into their int8 layouts (int4wo, and
    int8dq with --vision-int8dq): an image counts as many FLOPs as in bfloat16 (MFU's
    numerator)."""
    flops = []
    for kwargs in ({}, {"torchao_config": "int4wo-32"},
                   {"torchao_config": "int8dq", "vision_int8dq": True}):  # fmt: skip
        engine = sglang.Engine(model_path=model_dir("qwen2_5_vl"), dtype="bfloat16", **kwargs)
        engine.generate(
            PROMPT, {"temperature": 0, "max_new_tokens": 1}, image_data=[make_image(2, 96, 64)]
        )
        flops.append(engine.runner.perf.vision_flops)
        engine.shutdown()
    assert flops[0] > 0 and flops == [flops[0]] * 3


def test_int4_skips_layers_the_kernel_cannot_take() -> None:
    """int4 needs in_features divisible by the group size; other layers stay dense and are
    reported as skipped."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(128, 32), nn.Linear(32, 96), nn.Linear(96, 24)).to(
        torch.bfloat16
    )
    x = torch.randn(3, 128, dtype=torch.bfloat16)
    with torch.no_grad():
        dense = model(x).float()
    report = apply_torchao_config(model, "int4wo-64")
    assert report is not None and report.quantized_layers == 1
    assert report.skipped_layers == ["1", "2"]  # 32 and 96 are not multiples of 64
    assert stored_quantized(model[0])
    assert not stored_quantized(model[1]) and not stored_quantized(model[2])
    assert report.weight_bytes_after < report.weight_bytes_before
    with torch.no_grad():
        quantized = model(x).float()
    assert not torch.equal(quantized, dense)
    assert (quantized - dense).norm() < 0.2 * dense.norm()
    assert apply_torchao_config(model, "") is None


@pytest.mark.parametrize("flags", [{"avx2", "fma"}, {"avx512f", "avx512bw", "avx512_bf16"}])
def test_int4wo_takes_int8_activations_on_cpus_without_avx512_bf16(flags, monkeypatch) -> None:
    """Without bfloat16 products the int4 weights multiply int8 activations (the 8da4w kernel
    over int4wo's own codes, as llama.cpp's Q4_0 x Q8_0), said in the report; with them the
    layers stay weight-only. Either way the output follows the same int4 weights."""
    monkeypatch.setattr(kernels, "cpu_flags", lambda: frozenset(flags))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(128, 64)).to(torch.bfloat16)
    x = torch.randn(3, 128, dtype=torch.bfloat16)
    with torch.no_grad():
        dense = model(x).float()
    report = apply_torchao_config(model, "int4wo-64")
    on_int8 = "avx512_bf16" not in flags
    assert report is not None and report.as_dict()["activations"] == (
        "int8" if on_int8 else "bfloat16"
    )
    layer = model[0]
    assert isinstance(layer, QuantizedLinear) and layer.bits == 4 and layer.dynamic == on_int8
    with torch.no_grad():
        got = model(x).float()
    want = x.float() @ exact_weight(layer).float().T + layer.bias.float()
    assert (got - dense).norm() < 0.2 * dense.norm()
    assert (got - want).norm() < (0.05 if on_int8 else 0.02) * want.norm()


@pytest.mark.parametrize(
    "value",
    ["int8wo", "int8dq", "int4wo-32", "int4wo-64", "int4wo-128", "int4wo-256", "8da4w-128"],
)
def test_supported_torchao_values_parse(value: str) -> None:
    args = parse_args(["--torchao-config", value, "--dtype", "bfloat16"])
    assert args.torchao_config == value and args.quantization is None


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--torchao-config", "int8dq", "--cpu-lm-head-dtype", "int4"], "needs --torchao-config"),
        (["--torchao-config", "fp8wo"], "SGLang value not implemented here"),
        (["--torchao-config", "int4wo-100"], "not a known value"),
        (["--torchao-config", "int4wo"], "not a known value"),
        (["--torchao-config", "8da4w-48"], "not a known value"),
        (["--torchao-config", "int4wo-64", "--vision-int8dq"], "goes with --torchao-config"),
        (["--torchao-config", "int4wo-64", "--dtype", "float32"], "--dtype bfloat16"),
        (["--torchao-config", "int8wo", "--dtype", "float16"], "--dtype bfloat16"),
        (["--quantization", "fp8"], "'fp8' is an SGLang method not implemented here"),
        (["--quantization", "bogus"], "'bogus' is not a known method"),
        (["--torchao-config", "int8wo", "--cpu-lm-head-dtype", "int4"], "needs --torchao-config"),
        (["--torchao-config", "int4wo-64", "--cpu-lm-head-dtype", "fp8"], "must be one of"),
    ],
)
def test_bad_quantization_flags_are_refused(flags: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message) as info:
        parse_args(flags)
    text = str(info.value)
    assert "\n" not in text
    if flags[0] == "--torchao-config" and "dtype" not in message and len(flags) == 2:
        assert "supported: int8wo, int8dq, int4wo-<group>" in text


def test_unsupported_quantized_checkpoint_is_refused_before_loading(tmp_path: Path) -> None:
    folder = tmp_path / "awq-gemv-model"
    shutil.copytree(model_dir("qwen2_5_vl"), folder)
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = {
        "quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemv"
    }  # fmt: skip
    (folder / "config.json").write_text(json.dumps(config))
    for weights in folder.glob("*.safetensors"):
        weights.write_bytes(b"not weights")  # loading them would fail differently
    with pytest.raises(UnsupportedModelError, match="cannot load this awq checkpoint") as info:
        check_model(str(folder))
    assert "\n" not in str(info.value) and "'gemv'" in str(info.value)
    with pytest.raises(UnsupportedModelError, match="cannot load this awq"):
        sglang.Engine(model_path=str(folder))
