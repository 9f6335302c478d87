"""Every linear of a served model reports its method by name (``/server_info``'s
``linear_methods``), and the name says what runs: a packed linear holds no checkpoint weight, a
decode-routed one calls the native kernel for a decode row, a quantized one holds the codes
its name gives; a bfloat16 model's language model and tower, and the same model under int8dq."""

from __future__ import annotations

import re

import pytest
import torch
from conftest import NATIVE_GEMM_EXPECTED, model_dir, needs_compiler
from torch import nn

import sglang
from sglang.srt.layers.quantization import decode_linear, method_names, packed_linear
from sglang.srt.layers.quantization.base import method_name as method_of
from sglang.srt.layers.quantization.quantized_linear import QuantizedLinear


def _linear(dtype: torch.dtype) -> nn.Linear:
    torch.manual_seed(0)
    return nn.Linear(64, 128, dtype=dtype)


_FIELDS = {"dtype": "(bf16|fp32|fp16)", "group": "[0-9]+", "subclass": "[A-Za-z0-9_]+"}


def _known(method: str) -> bool:
    """A name of ``METHODS``, its fields filled in."""
    for pattern in method_names():
        parts = re.split(r"\{(\w+)\}", pattern)  # literal, field, literal, ...
        regex = "".join(_FIELDS[p] if i % 2 else re.escape(p) for i, p in enumerate(parts))
        if re.fullmatch(regex, method):
            return True
    return False


def test_plain_linears_are_named_by_dtype() -> None:
    assert method_of(_linear(torch.float32)) == "fp32"
    assert method_of(_linear(torch.bfloat16)) == "bf16"
    assert method_of(nn.LayerNorm(8)) is None


@needs_compiler
def test_a_decode_routed_linear_calls_the_kernel_for_a_decode_row() -> None:
    layer = _linear(torch.bfloat16)
    assert decode_linear.install([layer]) == 1
    assert method_of(layer) == "bf16-decode-kernel"
    calls = []
    kernel = layer._decode_kernel

    class Spy:
        def linear_bf16(self, *args):
            calls.append(args[0].shape)
            return kernel.linear_bf16(*args)

    layer._decode_kernel = Spy()
    layer(torch.randn(1, 64, dtype=torch.bfloat16))
    assert calls == [(1, 64)]


@pytest.mark.skipif(not packed_linear.available(), reason="no packed bfloat16 product here")
def test_a_packed_linear_holds_no_checkpoint_weight() -> None:
    layer = _linear(torch.bfloat16)
    x = torch.randn(3, 64, dtype=torch.bfloat16)
    want = layer(x)
    assert packed_linear.install([layer]) == 1
    expected = "bf16-packed-gemm" if NATIVE_GEMM_EXPECTED else "bf16-packed-onednn"
    assert method_of(layer) == expected
    assert layer.weight.untyped_storage().nbytes() <= layer.weight.element_size()
    torch.testing.assert_close(layer(x), want, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize(
    ("bits", "group", "dynamic", "name", "code_dtype"),
    [(8, None, False, "int8wo", torch.int8), (4, 32, False, "int4wo-32", torch.uint8),
     (8, None, True, "int8dq", torch.int8), (4, 32, True, "8da4w-32", torch.uint8)],
)  # fmt: skip
def test_a_quantized_linear_is_named_by_its_codes(bits, group, dynamic, name, code_dtype) -> None:
    layer = QuantizedLinear.from_linear(_linear(torch.bfloat16), bits, group, dynamic)
    assert method_of(layer) == name and _known(name)
    assert layer.qweight.dtype == code_dtype and layer.dynamic == dynamic
    assert layer.qweight.numel() * 8 == 64 * 128 * bits  # the codes, nothing widened


def _served_linears(engine: sglang.Engine) -> dict[str, str]:
    info = engine.get_server_info()["linear_methods"]
    model = engine.scheduler.runner.model
    linears = [n for n, m in model.named_modules() if isinstance(m, nn.Linear | QuantizedLinear)]
    assert sorted(info["by_module"]) == sorted(linears)
    assert sum(info["counts"].values()) == len(linears)
    assert all(_known(method) for method in info["counts"]), info["counts"]
    return info["by_module"]


@pytest.mark.parametrize("config", ["", "int8dq"])
def test_every_served_linear_reports_its_method(config: str) -> None:
    engine = sglang.Engine(
        model_path=model_dir("qwen2_5_vl"), dtype="bfloat16", torchao_config=config
    )
    try:
        methods = _served_linears(engine)
        runner = engine.scheduler.runner
        in_lm = {id(m) for m in runner.adapter.language_model.modules()}
        in_lm.add(id(runner.model.get_output_embeddings()))  # the head counts with the LM
        lm = {n for n, m in runner.model.named_modules() if id(m) in in_lm}
        lm_methods = {methods[n] for n in methods if n in lm}
        tower = {methods[n] for n in methods if n not in lm}
        assert tower and all(m.startswith("bf16") for m in tower)  # the tower stays bfloat16
        if config:
            assert lm_methods == {"int8dq"}
        else:
            assert lm_methods and all(m.startswith("bf16") for m in lm_methods)
    finally:
        engine.shutdown()
