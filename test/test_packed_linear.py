"""Encoder linears with oneDNN-packed bfloat16 weights: same products, weights held once."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from sglang.srt.layers import packed_linear

needs_mkldnn = pytest.mark.skipif(not packed_linear.available(), reason="no oneDNN in this torch")


@needs_mkldnn
@settings(max_examples=25, deadline=None)
@given(
    rows=st.sampled_from([1, 3, 17, 64, 300]),
    features=st.sampled_from([(32, 16), (80, 200), (128, 384)]),
    bias=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_packed_product_equals_torch_linear(rows, features, bias, seed) -> None:
    torch.manual_seed(seed)
    in_features, out_features = features
    linear = nn.Linear(in_features, out_features, bias=bias).to(torch.bfloat16)
    reference = nn.Linear(in_features, out_features, bias=bias).to(torch.bfloat16)
    reference.load_state_dict(linear.state_dict())
    x = torch.randn(2, rows, in_features).to(torch.bfloat16)
    assert packed_linear.install([linear]) == 1
    got, torch_out = linear(x).double(), reference(x).double()
    w, b = reference.weight.double(), reference.bias
    want = x.double() @ w.t() + (b.double() if bias else 0)
    scale = x.double().abs() @ w.abs().t() + (b.double().abs() if bias else 0) + 1e-3
    # float32 accumulation, then one bfloat16 rounding, as torch's own product
    assert ((got - want).abs() / scale).max() < 2**-8
    assert ((got - torch_out).abs() / scale).max() < 2**-7
    # the checkpoint weight's storage is released; shape, dtype and device stay for HF code
    weight = linear.weight
    assert weight.shape == (out_features, in_features) and weight.dtype == torch.bfloat16
    assert weight.device.type == "cpu" and weight.untyped_storage().nbytes() == 2
    assert packed_linear.packed_bytes(linear) == out_features * in_features * 2
    assert packed_linear.install([linear]) == 0  # packed once


@needs_mkldnn
def test_only_plain_bfloat16_linears_are_packed() -> None:
    fp32 = nn.Linear(16, 8)
    other = nn.Conv1d(4, 4, 1).to(torch.bfloat16)
    assert packed_linear.install([fp32, other]) == 0
    assert fp32.weight.untyped_storage().nbytes() == 16 * 8 * 4


@needs_mkldnn
def test_bf16_engine_packs_the_encoder_and_counts_its_bytes() -> None:
    """Every linear outside the language model and its head is packed, none inside; the weight
    bytes the memory report uses still count the packed copies."""
    from conftest import model_dir

    import sglang
    from sglang.srt.model_executor import host_memory

    engine = sglang.Engine(model_path=model_dir("qwen2_vl"), dtype="bfloat16")
    runner = engine.runner
    lm = runner.adapter.language_model
    assert not any(hasattr(m, "packed_weight") for m in lm.modules())
    tower = runner.model.model.visual
    linears = [m for m in tower.modules() if isinstance(m, nn.Linear)]
    assert linears and all(hasattr(m, "packed_weight") for m in linears)
    packed = packed_linear.packed_bytes(runner.model)
    assert packed == sum(m.weight.numel() * 2 for m in linears)
    assert runner.weights_bytes == host_memory.module_bytes(runner.model) + packed
    out = engine.generate("Describe the weather.", {"temperature": 0, "max_new_tokens": 4})
    assert len(out["output_ids"]) == 4
    engine.shutdown()
