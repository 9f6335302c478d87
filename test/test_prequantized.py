"""Checkpoints published quantized (``layers/quantization/checkpoint_formats.py``,
``model_executor/prequantized.py``): AWQ, GPTQ and compressed-tensors W4A16 / W8A8 checkpoints,
written from each format's definition (``sglang_dev.quantized_checkpoints``), load straight
into the native layouts and serve what the same weights dequantized serve in HF; misread
layouts, a wrong image and shifted positions fall outside the bound; formats and options not
supported, and flags that contradict the checkpoint, are refused before loading with one
line."""

from __future__ import annotations

import functools
import json
import shutil
from pathlib import Path

import pytest
import torch
import transformers
from conftest import (
    greedy_agreement,
    hf_inputs,
    load_hf_model,
    make_image,
    model_dir,
    placeholder,
)
from PIL import Image
from quant_reference import dynamic_int8, exact_weight
from safetensors import safe_open
from torch import nn

import sglang
from sglang.srt.layers import page_release
from sglang.srt.layers.quantization import checkpoint_formats
from sglang.srt.layers.quantization.quantized_linear import QuantizedLinear
from sglang.srt.model_executor import prequantized
from sglang.srt.model_executor.dtypes import cpu_bfloat16_isa
from sglang.srt.models.adapters import UnsupportedModelError, check_model
from sglang.srt.multimodal.hf_processor import load_hf_processor
from sglang_dev.quantized_checkpoints import write_quantized

GROUP = 32
MAX_NEW = 8
CASES = [
    ("qwen2_5_vl", "awq"),
    ("qwen2_5_vl", "gptq"),
    ("qwen2_5_vl", "ct-w4a16"),
    ("qwen2_5_vl", "ct-w8a8"),
    ("llava", "awq"),
    ("gemma3", "gptq"),  # LM head tied to the embeddings
]
METHOD = {
    "awq": "awq",
    "gptq": "gptq",
    "ct-w4a16": "compressed-tensors",
    "ct-w8a8": "compressed-tensors",
}


@functools.cache
def _folders(family: str, fmt: str, root: Path) -> tuple[Path, Path]:
    """(the checkpoint in ``fmt``, HF's checkpoint of its weights dequantized)."""
    quantized, reference = root / f"{family}-{fmt}", root / f"{family}-{fmt}-ref"
    write_quantized(model_dir(family), quantized, fmt, GROUP, reference=reference)
    return quantized, reference


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("prequantized")


class DynamicInt8(nn.Module):
    """W8A8's product from its definition: the row quantized to int8 per token, integer sums
    with the checkpoint's codes, both scales applied (``quant_reference.dynamic_int8``)."""

    def __init__(self, codes: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        self.codes, self.scale, self.bias = codes, scale.double().reshape(-1), bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = dynamic_int8(x.reshape(-1, x.shape[-1]), self.codes, self.scale)
        if self.bias is not None:
            y = y + self.bias.double()
        return y.to(x.dtype).reshape(*x.shape[:-1], -1)


def _hf(reference: Path, quantized: Path, fmt: str, dtype: torch.dtype) -> nn.Module:
    model = load_hf_model(transformers.AutoModelForImageTextToText, str(reference), dtype)
    if fmt == "ct-w8a8":  # int8 activations too: each quantized linear on its definition
        modules = dict(model.named_modules())
        for file in quantized.glob("*.safetensors"):
            with safe_open(file, "pt") as f:
                for key in [k for k in f.keys() if k.endswith(".weight_scale")]:
                    prefix = key.removesuffix(".weight_scale")
                    (name,) = [n for n in modules if n.endswith(prefix.removeprefix("model."))]
                    parent, _, child = name.rpartition(".")
                    bias = modules[name].bias
                    layer = DynamicInt8(f.get_tensor(prefix + ".weight"), f.get_tensor(key), bias)
                    setattr(modules[parent], child, layer)
    return model


def _prompt_logprobs(model: nn.Module, path: Path, prompt: str, image) -> tuple[list, torch.Tensor]:
    inputs = hf_inputs(load_hf_processor(str(path)), prompt, [image])
    inputs = {k: v.to(model.dtype) if v.is_floating_point() else v for k, v in inputs.items()}
    with torch.no_grad():
        logits = model(**inputs).logits[0].float()
    ids = inputs["input_ids"][0]
    return ids.tolist(), torch.log_softmax(logits, -1)[:-1].gather(1, ids[1:, None])[:, 0]


def _engine_logprobs(engine: sglang.Engine, prompt: str, image) -> tuple[list, torch.Tensor]:
    out = engine.generate(
        prompt,
        {"temperature": 0, "max_new_tokens": 1},
        image_data=[image],
        return_logprob=True,
        logprob_start_len=0,
    )
    rows = out["meta_info"]["input_token_logprobs"]
    return [t for _, t, _ in rows], torch.tensor([lp for lp, _, _ in rows[1:]])


@pytest.mark.parametrize("family, fmt", CASES)
def test_published_checkpoint_serves_its_dequantized_weights(
    family: str, fmt: str, root: Path, monkeypatch
) -> None:
    """The engine (bfloat16, 5-token chunks cutting through the image) against HF float32 on
    the dequantized weights (exact) and HF bfloat16 on them: within twice the gap between the
    two, as for ``--torchao-config``. The unquantized source model (int4), a white image and
    positions shifted by one fall outside; greedy tokens equal HF bfloat16's (HF float32's on
    a CPU without native bfloat16, where the engine keeps float32 activations), or part only
    where HF's own margin between the two tokens lies within the bound."""
    quantized, reference = _folders(family, fmt, root)
    prompt, image = f"Look at {placeholder(family)} and say what you see.", make_image(2, 96, 64)
    exact_model = _hf(reference, quantized, fmt, torch.float32)
    ids, exact = _prompt_logprobs(exact_model, reference, prompt, image)
    bf16 = _hf(reference, quantized, fmt, torch.bfloat16)
    _, rounded = _prompt_logprobs(bf16, reference, prompt, image)
    bound = 2 * (rounded - exact).abs().max()
    source = load_hf_model(
        transformers.AutoModelForImageTextToText, model_dir(family), torch.float32
    )
    _, unquantized = _prompt_logprobs(source, reference, prompt, image)
    _, white = _prompt_logprobs(bf16, reference, prompt, Image.new("RGB", image.size, "white"))

    engine = sglang.Engine(
        model_path=str(quantized), quantization=METHOD[fmt], chunked_prefill_size=5
    )
    try:
        got_ids, got = _engine_logprobs(engine, prompt, image)
        assert got_ids == ids
        gap = (got - exact).abs().max()
        assert gap <= bound, (gap, bound)
        assert (got - white).abs().max() > bound
        if fmt != "ct-w8a8":  # int8 moves logprobs by about the bfloat16 noise only
            assert (got - unquantized).abs().max() > bound
        assert (got[1:] - exact[:-1]).abs().max() > bound
        # greedy against HF in the engine's dtype: float32 activations on a CPU without bf16
        same_dtype = bf16 if cpu_bfloat16_isa() else exact_model
        _check_greedy(engine, same_dtype, reference, prompt, image, float(bound))
        _check_layers(engine, fmt)
        _check_exact_weights(engine, reference)
        engine.scheduler.check_integrity()
    finally:
        engine.shutdown()


def _check_greedy(engine, hf: nn.Module, path: Path, prompt: str, image, bound: float) -> None:
    params = {"temperature": 0, "max_new_tokens": MAX_NEW}
    mine = engine.generate(prompt, params, image_data=[image])["output_ids"]
    inputs = hf_inputs(load_hf_processor(str(path)), prompt, [image])
    inputs = {k: v.to(hf.dtype) if v.is_floating_point() else v for k, v in inputs.items()}
    with torch.no_grad():
        out = hf.generate(
            **inputs,
            max_new_tokens=MAX_NEW,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
        )
    theirs = out.sequences[0, inputs["input_ids"].shape[1] :].tolist()
    steps = [torch.log_softmax(step[0].float(), -1) for step in out.logits]
    if greedy_agreement(mine, theirs, steps, bound) == len(mine):  # no parting
        assert len(mine) == MAX_NEW


def _check_exact_weights(engine: sglang.Engine, reference: Path) -> None:
    """Each loaded layer stands for exactly the weight its format defines: read from the
    native layout's definition in float64 (``quant_reference``), it equals the writer's
    dequantized weight (float64 rounded once to float32)."""
    marker = "." + engine.runner.prequantized.marker
    stored = prequantized.checkpoint_keys(engine.runner.model_path)
    quantized = {k.removesuffix(marker) for k in stored if k.endswith(marker)}
    dense = {}
    for file in reference.glob("*.safetensors"):
        with safe_open(file, "pt") as f:
            names = [k for k in quantized if k + ".weight" in f.keys()]
            dense |= {k: f.get_tensor(k + ".weight") for k in names}
    for name, layer in engine.runner.model.named_modules():
        if isinstance(layer, QuantizedLinear):
            (key,) = [k for k in dense if name.endswith(k.split("layers.", 1)[1])]
            assert torch.equal(exact_weight(layer).float(), dense[key]), name


def _check_layers(engine: sglang.Engine, fmt: str) -> None:
    """Every quantized linear of the checkpoint became a native layer, nothing else did; int4
    keeps the format's float16 scales and zero points exactly (float32 scale and min)."""
    model, runner = engine.runner.model, engine.runner
    layers = [m for m in model.modules() if isinstance(m, QuantizedLinear)]
    in_lm = {id(m) for m in runner.adapter.language_model.modules()}
    assert layers and all(id(m) in in_lm for m in layers)
    marker = runner.prequantized.marker
    stored = [k for k in prequantized.checkpoint_keys(runner.model_path) if k.endswith(marker)]
    assert len(layers) == len(stored)
    report = engine.get_server_info()["weight_quantization"]
    assert report["method"] == METHOD[fmt] and report["quantized_layers"] == len(layers)
    memory = engine.get_server_info()["memory"]  # the fit check's estimate from the headers
    assert memory["weights_estimate_bytes"] == pytest.approx(memory["weights_bytes"], rel=0.005)
    for layer in layers:
        assert layer.dynamic == (fmt == "ct-w8a8")
        if layer.bits == 4:
            assert layer.scale.dtype == layer.min.dtype == torch.float32


@pytest.mark.parametrize(
    "fmt, constant, misread",
    [("awq", "AWQ_ORDER", tuple(range(8))), ("gptq", None, 0)],
)
def test_a_misread_format_falls_outside_the_bound(fmt, constant, misread, root, monkeypatch):
    """AWQ's columns read in GPTQ's sequential order, or GPTQ v1's zero points read without
    their offset of one, move the logprobs far beyond the bound the right reading meets."""
    quantized, reference = _folders("qwen2_5_vl", fmt, root)
    prompt, image = f"Look at {placeholder('qwen2_5_vl')} and say.", make_image(2, 96, 64)
    _, exact = _prompt_logprobs(
        _hf(reference, quantized, fmt, torch.float32), reference, prompt, image
    )
    _, rounded = _prompt_logprobs(
        _hf(reference, quantized, fmt, torch.bfloat16), reference, prompt, image
    )
    bound = 2 * (rounded - exact).abs().max()
    if constant:
        monkeypatch.setattr(checkpoint_formats, constant, misread)
    else:
        original = checkpoint_formats.PrequantizedFormat

        def without_offset(*args, **kwargs):
            return original(*args, **{**kwargs, "gptq_zero_offset": 0})

        monkeypatch.setattr(checkpoint_formats, "PrequantizedFormat", without_offset)
    engine = sglang.Engine(model_path=str(quantized))
    try:
        assert (_engine_logprobs(engine, prompt, image)[1] - exact).abs().max() > bound
    finally:
        engine.shutdown()


def _with_quantization_config(tmp_path: Path, quant: dict) -> Path:
    folder = tmp_path / "model"
    shutil.copytree(model_dir("qwen2_5_vl"), folder)
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = quant
    (folder / "config.json").write_text(json.dumps(config))
    for weights in folder.glob("*.safetensors"):
        weights.write_bytes(b"not weights")  # loading them would fail differently
    return folder


def _ct(weights: dict, fmt: str = "pack-quantized", inputs: dict | None = None, groups: int = 1):
    scheme = {"targets": ["Linear"], "weights": weights, "input_activations": inputs}
    return {
        "quant_method": "compressed-tensors",
        "format": fmt,
        "config_groups": {f"group_{i}": scheme for i in range(groups)},
    }


W4 = {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": 128}


@pytest.mark.parametrize(
    "quant, reason",
    [
        ({"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemv"}, "'gemv'"),
        ({"quant_method": "awq", "bits": 8, "group_size": 128}, "8-bit"),
        ({"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": True}, "desc_act"),
        ({"quant_method": "gptq", "bits": 3, "group_size": 128}, "3-bit"),
        (
            {"quant_method": "gptq", "bits": 4, "group_size": 128, "checkpoint_format": "marlin"},
            "'marlin'",
        ),
        ({"quant_method": "bitnet"}, "quant_method"),
        (_ct({**W4, "symmetric": False}), "asymmetric"),
        (_ct({"num_bits": 8, "type": "float", "strategy": "tensor"}, "float-quantized"), "float"),
        (_ct(W4, groups=2), "2 quantization schemes"),
        (_ct({**W4, "strategy": "tensor"}), "strategy 'tensor'"),
        (
            _ct(
                {"num_bits": 8, "type": "int", "strategy": "channel"},
                "int-quantized",
                {"num_bits": 8, "type": "int", "dynamic": False, "strategy": "tensor"},
            ),
            "activations",
        ),
    ],
)
def test_unsupported_formats_are_refused_before_loading(tmp_path, quant, reason) -> None:
    folder = _with_quantization_config(tmp_path, quant)
    with pytest.raises(UnsupportedModelError, match="cannot load this") as info:
        check_model(str(folder))
    assert reason in str(info.value) and "\n" not in str(info.value)


def test_flags_that_contradict_the_checkpoint_are_refused(root: Path) -> None:
    quantized, _ = _folders("qwen2_5_vl", "awq", root)
    with pytest.raises(ValueError, match="quantized with awq"):
        sglang.Engine(model_path=str(quantized), quantization="gptq")
    with pytest.raises(ValueError, match="already quantized"):
        sglang.Engine(model_path=str(quantized), torchao_config="int4wo-32")
    with pytest.raises(ValueError, match="not quantized"):
        sglang.Engine(model_path=model_dir("qwen2_5_vl"), quantization="awq")


def _resident_file_mb() -> float:
    for line in open("/proc/self/status"):
        if line.startswith("RssFile:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no RssFile")


def test_released_checkpoint_pages_leave_the_resident_set_and_read_back(tmp_path: Path) -> None:
    """A converted layer's checkpoint tensors drop their file pages from the process (what keeps
    the load near the quantized size); the values read back unchanged from the file; memory
    that is not a read-only safetensors mapping is never touched."""
    from safetensors.torch import load_file, save_file

    values = torch.arange(64 * 2**20 // 4, dtype=torch.int32)
    save_file({"w": values}, tmp_path / "w.safetensors")
    mapped = load_file(tmp_path / "w.safetensors")["w"]  # a view of the file's mapping
    assert int(mapped.sum()) == int(values.sum())  # every page read
    before = _resident_file_mb()
    assert page_release.release_file_pages(mapped)
    assert before - _resident_file_mb() > 48
    assert torch.equal(mapped, values)
    anonymous = values.clone()
    assert not page_release.release_file_pages(anonymous)
    assert torch.equal(anonymous, values)


def test_quantizing_a_mapped_linear_releases_its_checkpoint_pages(tmp_path: Path) -> None:
    """--torchao-config from a bfloat16 checkpoint: a linear's file pages leave the process once
    it is quantized (the load holds the codes, not the checkpoint beside them), and the layer
    is the one quantized from the same values in memory."""
    from safetensors.torch import load_file, save_file

    from sglang.srt.layers.quantization import quantized_linear
    from sglang.srt.layers.quantization.base import serve_with

    gen = torch.Generator().manual_seed(0)
    weight = (torch.randn(2048, 8192, generator=gen) * 0.02).bfloat16()  # 32 MiB
    save_file({"w": weight}, tmp_path / "w.safetensors")
    mapped = load_file(tmp_path / "w.safetensors")["w"]
    model = torch.nn.Sequential(torch.nn.Linear(8192, 2048, bias=False))
    model[0].weight = torch.nn.Parameter(mapped, requires_grad=False)
    in_memory = torch.nn.Linear(8192, 2048, bias=False)
    in_memory.weight = torch.nn.Parameter(weight.clone(), requires_grad=False)
    assert float(mapped.float().sum()) == float(weight.float().sum())  # every page read
    before = _resident_file_mb()
    method = quantized_linear.quantized_method(8, None, dynamic=True)
    assert serve_with(model, {model[0]}, method) == 1
    assert before - _resident_file_mb() > 24
    x = torch.randn(3, 8192, generator=gen).bfloat16()
    want = quantized_linear.quantize(in_memory, 8, None, dynamic=True)(x)
    assert torch.equal(model[0](x), want)


def test_a_mapped_tensor_is_cast_a_slice_at_a_time(tmp_path: Path, monkeypatch) -> None:
    """A float16 tensor on a checkpoint's mapping cast to bfloat16: the same values as
    ``.to``, and when each slice's pages are released, no more than a slice of the file and the
    kernel's read-ahead is resident (casting it whole would hold all 64 MiB of it beside the
    copy)."""
    from safetensors.torch import load_file, save_file

    values = torch.randn(32 * 2**20, generator=torch.Generator().manual_seed(0)).half()
    save_file({"w": values}, tmp_path / "w.safetensors")
    mapped = load_file(tmp_path / "w.safetensors")["w"]
    page_release.release_file_pages(mapped)  # start with none of it resident
    base = _resident_file_mb()
    resident = []
    drop = page_release.drop_pages

    def recording(tensor: torch.Tensor) -> bool:
        resident.append(_resident_file_mb() - base)
        return drop(tensor)

    monkeypatch.setattr(page_release, "drop_pages", recording)
    cast = page_release.cast_releasing(mapped, torch.bfloat16, slice_bytes=4 * 2**20)
    assert torch.equal(cast, values.to(torch.bfloat16))
    assert len(resident) == 16 + 1 and max(resident) < 16, resident
    assert _resident_file_mb() - base < 4
    anonymous = values.clone()
    assert torch.equal(page_release.cast_releasing(anonymous, torch.bfloat16), cast)


def test_only_tensors_on_a_mapping_or_views_are_copied_off_the_checkpoint(tmp_path: Path) -> None:
    """``copy_out_of_checkpoint``: a tensor on a safetensors mapping gets memory of its own
    (same values), a view of a larger block gets its own storage, and a tensor that owns its
    memory already is left where it is (no second copy of it, even for a moment)."""
    from safetensors.torch import load_file, save_file

    from sglang.srt.model_executor.quantization import copy_out_of_checkpoint

    values = torch.arange(2**20, dtype=torch.float32)
    save_file({"w": values}, tmp_path / "w.safetensors")
    module = torch.nn.Module()
    module.mapped = torch.nn.Parameter(load_file(tmp_path / "w.safetensors")["w"])
    module.own = torch.nn.Parameter(values.clone())
    module.view = torch.nn.Parameter(values.clone().view(4, -1)[1])
    own_address = module.own.data_ptr()
    assert page_release.on_checkpoint_mapping(module.mapped)
    assert copy_out_of_checkpoint(module) == 4 * 2**20 + 2**20
    assert not page_release.on_checkpoint_mapping(module.mapped)
    assert torch.equal(module.mapped, values)
    assert module.own.data_ptr() == own_address
    assert module.view.untyped_storage().nbytes() == 2**20 and torch.equal(
        module.view, values[2**18 : 2**19]
    )


def test_an_encoder_worker_loads_a_published_checkpoints_tower(root: Path) -> None:
    """``--encoder-only`` on an AWQ checkpoint: the tower loads (as stored: unquantized) without
    the quantized decoder, equal to the language worker's tower."""
    from sglang.srt.model_executor.encoder_runner import EncoderRunner
    from sglang.srt.model_executor.engine_config import EngineConfig

    quantized, _ = _folders("qwen2_5_vl", "awq", root)
    runner = EncoderRunner(EngineConfig(model_path=str(quantized)), str(quantized))
    engine = sglang.Engine(model_path=str(quantized))
    try:
        tower = dict(runner.model.model.visual.state_dict())
        want = engine.runner.model.model.visual.state_dict()
        assert tower.keys() == want.keys()
        assert all(torch.equal(tower[k], want[k]) for k in want)
        assert not any(isinstance(m, QuantizedLinear) for m in runner.model.modules())
    finally:
        engine.shutdown()
