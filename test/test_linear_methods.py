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
from sglang.srt.layers.quantization import (
    REGISTRY,
    decode_linear,
    get_linear_method,
    method_names,
    packed_linear,
)
from sglang.srt.layers.quantization.base import LinearMethod, attached
from sglang.srt.layers.quantization.base import method_name as method_of
from sglang.srt.layers.quantization.quantized_linear import QuantizedLinear, quantize


def _linear(dtype: torch.dtype) -> nn.Linear:
    torch.manual_seed(0)
    return nn.Linear(64, 128, dtype=dtype)


_FIELDS = {"dtype": "(bf16|fp32|fp16)", "group": "[0-9]+", "subclass": "[A-Za-z0-9_]+"}


def _known(method: str) -> bool:
    """A name of ``method_names()``, its fields filled in."""
    return any(_matches(pattern, method) for pattern in method_names())


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
    layer = quantize(_linear(torch.bfloat16), bits, group, dynamic)
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


def _registered(name: str) -> LinearMethod:
    return get_linear_method(name, 32) if name in ("int4wo", "8da4w") else get_linear_method(name)


# what each method computes, as a fraction of the output's size: the quantized ones' rounding
# (int4 in groups of 32 of a uniform weight: about 1/30 of the range per weight)
_TOLERANCE = {"int8wo": 0.02, "int8dq": 0.03, "int4wo": 0.1, "8da4w": 0.1}


@pytest.mark.parametrize("name", list(REGISTRY))
def test_every_registered_method_serves_the_product_it_names(name: str) -> None:
    """The contract of ``base.py``: the served module carries the method, its forward is the
    method's product (close to the dense weight's, within the method's rounding), and it
    reports a name of the method's own ``names``."""
    method = _registered(name)
    layer = _linear(torch.bfloat16)
    dense = layer.weight.detach().float().clone()
    x = torch.randn(5, 64)
    x_in = x if name == "bf16-widened" else x.bfloat16()
    if name == "bf16-packed" and not packed_linear.available():
        pytest.skip("no packed bfloat16 product on this CPU")  # the method exists; the ISA not
    served = method.process_weights_after_loading(method.create_weights(layer))
    assert attached(served) is method
    calls = []
    apply = method.apply
    method.apply = lambda module, x: calls.append(module) or apply(module, x)
    got = served(x_in).float()
    assert calls == [served]
    want = x_in.float() @ dense.T + layer.bias.float()
    error = (got - want).norm() / want.norm()
    assert error <= _TOLERANCE.get(name, 0.01), error
    reported = method_of(served)
    assert any(_matches(pattern, reported) for pattern in type(method).names), reported


def _matches(pattern: str, name: str) -> bool:
    parts = re.split(r"\{(\w+)\}", pattern)
    regex = "".join(_FIELDS[p] if i % 2 else re.escape(p) for i, p in enumerate(parts))
    return re.fullmatch(regex, name) is not None


def test_a_deliberate_error_in_a_method_fails_the_contract_test() -> None:
    """The tolerance above catches a method whose product is off: int8 codes under scales
    half as large again."""
    method = _registered("int8wo")
    served = method.process_weights_after_loading(_linear(torch.bfloat16))
    served.scale.mul_(1.5)
    x = torch.randn(5, 64).bfloat16()
    dense = _linear(torch.bfloat16)
    want = dense(x).float()
    assert (served(x).float() - want).norm() / want.norm() > _TOLERANCE["int8wo"]


def test_an_unknown_method_name_is_refused_with_the_registered_ones() -> None:
    with pytest.raises(KeyError, match="registered: bf16-packed"):
        get_linear_method("fp8")
