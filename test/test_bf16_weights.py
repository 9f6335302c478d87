"""bfloat16 weights computed in float32 (``--cpu-bf16-weights``,
``layers/quantization/bf16_weights.py``).

The engine loads the checkpoint in bfloat16 and widens everything but its linear and embedding
weights, which it widens as it reads them. The reference is HF's model loaded in bfloat16 and
then made float32 as a whole (``.float()``): the same values, every product in float32. So
greedy output equals HF ``generate`` on it token for token, in every family tested, across
chunk sizes and radix hits; against HF on the unrounded float32 weights the logprobs move by
the bfloat16 rounding, far past the bound (the check that the weights really are bfloat16).
"""

from __future__ import annotations

import functools
from unittest import mock

import pytest
import torch
import transformers
from conftest import (
    ALL_VLM_FAMILIES,
    HF_SKIPS_LOGITS_SCALING,
    TEXT_FAMILIES,
    hf_greedy,
    hf_inputs,
    load_hf_model,
    make_image,
    model_dir,
    needs_compiler,
    placeholder,
)
from hypothesis import given, settings
from hypothesis import strategies as st

import sglang
from sglang.srt.kernels import ops
from sglang.srt.layers.quantization import bf16_weights
from sglang.srt.model_executor import memory
from sglang.srt.multimodal.hf_processor import load_hf_processor

KERNEL = ops.linear_bf16()
MAX_NEW = 8
GREEDY = {"temperature": 0, "max_new_tokens": MAX_NEW}
# the engine's float32 products against HF's on the same values: summation order only
LOGPROB_BOUND = 2e-4
FAMILIES = (*ALL_VLM_FAMILIES, *TEXT_FAMILIES)


def _case(family: str) -> tuple[str, list]:
    ph = placeholder(family)
    if family not in ALL_VLM_FAMILIES:
        return "The quick brown fox jumps over the lazy dog while the bird sang a song", []
    return f"First {ph} then {ph} compare them.", [make_image(2, 96, 64), make_image(3, 64, 96)]


@functools.cache
def _rounded_reference(family: str) -> tuple[list[int], list[float]]:
    """HF greedy ids and chosen logprobs on the checkpoint's weights rounded to bfloat16."""
    path = model_dir(family)
    vlm = family in ALL_VLM_FAMILIES
    cls = transformers.AutoModelForImageTextToText if vlm else transformers.AutoModelForCausalLM
    model = load_hf_model(cls, path, torch.bfloat16).float()
    processor = load_hf_processor(path)
    prompt, images = _case(family)
    if images:
        inputs = hf_inputs(processor, prompt, images)
    else:
        inputs = getattr(processor, "tokenizer", processor)([prompt], return_tensors="pt")
    inputs = {k: v.float() if v.is_floating_point() else v for k, v in inputs.items()}
    with torch.no_grad():
        out = model.generate(
            **inputs, max_new_tokens=MAX_NEW, do_sample=False, output_logits=True,
            return_dict_in_generate=True,
        )  # fmt: skip
    scaling = 1.0
    if family in HF_SKIPS_LOGITS_SCALING:  # the engine applies the LM head's scaling
        text = model.config.get_text_config()
        scaling = getattr(text, "logits_scaling", None) or 1 / text.logit_scale
    ids = out.sequences[0, inputs["input_ids"].shape[1] :].tolist()
    steps = [torch.log_softmax(s[0] / scaling, -1)[tok] for s, tok in zip(out.logits, ids)]
    return ids, [float(lp) for lp in steps]


def _logprobs(out: dict) -> list[float]:
    return [lp for lp, _, _ in out["meta_info"]["output_token_logprobs"]]


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_equals_hf_float32_on_the_rounded_weights(family: str) -> None:
    prompt, images = _case(family)
    ref_ids, ref_lps = _rounded_reference(family)
    unrounded = hf_greedy(family, prompt, images, MAX_NEW)[1]
    for chunk in (-1, 5):
        engine = sglang.Engine(
            model_path=model_dir(family), dtype="float32", cpu_bf16_weights="on",
            chunked_prefill_size=chunk,
        )  # fmt: skip
        methods = engine.get_server_info()["linear_methods"]["by_module"]
        modules = dict(engine.runner.model.named_modules())
        # float32: patch embeddings (the pixels' first product) and nn.Linear's subclasses
        wide = {name for name, method in methods.items() if method != "bf16-widened"}
        assert all("patch_embed" in n or type(modules[n]) is not torch.nn.Linear for n in wide)
        assert len(methods) > len(wide)
        for _ in range(2):  # the second run hits the radix cache
            out = engine.generate(prompt, GREEDY, image_data=images or None, return_logprob=True)
            assert out["output_ids"] == ref_ids
            assert _logprobs(out) == pytest.approx(ref_lps, abs=LOGPROB_BOUND)
        assert out["meta_info"]["cached_tokens"] > 0
        engine.scheduler.check_integrity()
        engine.shutdown()
    # the weights really are bfloat16: the float32 checkpoint's own logprobs are elsewhere
    moved = max(abs(a - b) for a, b in zip(_logprobs(out), unrounded))
    assert moved > 2 * LOGPROB_BOUND


def test_only_plain_linear_and_embedding_weights_stay_bfloat16() -> None:
    class Scaled(torch.nn.Embedding):  # a subclass may scale by its weight's dtype: float32
        pass

    model = torch.nn.Sequential(
        torch.nn.Embedding(10, 8), torch.nn.Linear(8, 8), torch.nn.LayerNorm(8), Scaled(10, 8)
    ).bfloat16()
    model.register_buffer("table", torch.ones(3, dtype=torch.bfloat16))
    head = torch.nn.Linear(8, 10, bias=False).bfloat16()
    head.weight = model[0].weight  # tied to the embedding
    model.append(head)
    stored = bf16_weights.store_in_bfloat16(model)
    assert (stored.linears, stored.embeddings) == (2, 1)
    assert stored.bfloat16_bytes == (10 * 8 + 8 * 8) * 2
    assert model[0].weight.dtype == model[1].weight.dtype == torch.bfloat16
    assert model[4].weight is model[0].weight
    for tensor in (model[1].bias, model[2].weight, model[3].weight, model.table):
        assert tensor.dtype == torch.float32
    x = model[0](torch.tensor([[1, 2]]))
    assert x.dtype == torch.float32 and model[4](model[1](x)).dtype == torch.float32


@needs_compiler
@settings(max_examples=40, deadline=None)
@given(
    rows=st.integers(1, 40),
    in_features=st.sampled_from([1, 7, 16, 17, 200, 1536]),
    out_features=st.sampled_from([1, 15, 16, 17, 100, 513]),
    with_bias=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_the_widened_product_is_the_float32_product(
    rows: int, in_features: int, out_features: int, with_bias: bool, seed: int
) -> None:
    """Decode rows on ``linear_mixed``, prompt rows on torch's GEMM by blocks (three here):
    both within float32's summation bound of the float64 product with the widened weight."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, in_features, generator=gen)
    weight = torch.randn(out_features, in_features, generator=gen).bfloat16()
    linear = torch.nn.Linear(in_features, out_features, bias=with_bias)
    linear.weight = torch.nn.Parameter(weight, requires_grad=False)
    if with_bias:
        linear.bias.data = torch.randn(out_features, generator=gen)
    bf16_weights.store_in_bfloat16(linear)
    assert linear.weight.dtype == torch.bfloat16
    with torch.no_grad(), mock.patch.object(bf16_weights, "BLOCK_ROWS", 48):
        got = linear(x)
    wide = weight.double()
    want = x.double() @ wide.t() + (linear.bias.double() if with_bias else 0)
    scale = x.double().abs() @ wide.abs().t() + (linear.bias.double().abs() if with_bias else 0)
    bound = (in_features + 2) * 2**-24 * scale + 1e-30
    assert got.dtype == torch.float32 and ((got.double() - want).abs() <= bound).all()
    flipped = KERNEL.linear_mixed(x[:16].contiguous(), -weight, None)  # a wrong sign fails
    if (want[:16].abs() > 2 * bound[:16]).any():
        assert not ((flipped.double() - want[:16]).abs() <= bound[:16]).all()
    assert torch.equal(KERNEL.widen_bf16(weight), weight.float())


def test_the_fit_check_counts_bfloat16_linear_and_embedding_weights() -> None:
    path = model_dir("qwen2_5_vl")
    full = memory.estimate_weight_bytes(path, torch.float32)
    half = memory.estimate_weight_bytes(path, torch.bfloat16)
    stored = memory.estimate_weight_bytes(path, torch.float32, weight_dtype=torch.bfloat16)
    assert half < stored < full
    engine = sglang.Engine(model_path=path, dtype="float32", cpu_bf16_weights="on")
    model = engine.runner.model
    loaded = {id(t): t for t in [*model.parameters(), *model.buffers()]}
    real = sum(t.numel() * t.element_size() for t in loaded.values())
    assert engine.runner.fit_plan.weights == stored
    assert abs(real - stored) < 0.02 * stored  # buffers made at load time: rotary tables
    engine.shutdown()


def test_auto_keeps_bfloat16_weights_only_where_float32_is_for_want_of_bfloat16(
    monkeypatch,
) -> None:
    from sglang.srt.model_executor import dtypes
    from sglang.srt.model_executor.engine_config import EngineConfig

    config = transformers.AutoConfig.from_pretrained(model_dir("qwen2_5_vl"))
    config.dtype = torch.bfloat16
    choose = functools.partial(dtypes.resolve_launch_dtypes, config=config)
    for isa, setting, dtype, want in (
        (None, "auto", "auto", torch.bfloat16),  # AVX2 only: float32 compute, bf16 weights
        (None, "off", "auto", None),
        (None, "auto", "float32", None),  # the exact mode asked for: float32 weights
        ("avx512_bf16", "auto", "auto", None),  # bfloat16 compute: nothing to keep
        ("avx512_bf16", "on", "float32", torch.bfloat16),
    ):
        monkeypatch.setattr(dtypes, "cpu_bfloat16_isa", lambda isa=isa: isa)
        args = EngineConfig(model_path="x", dtype=dtype, cpu_bf16_weights=setting)
        choice = choose(args)[0]
        assert choice.weight_dtype == want, (isa, setting, dtype)
        assert choice.dtype == (torch.bfloat16 if isa and dtype == "auto" else torch.float32)
    with pytest.raises(ValueError, match="cpu_bf16_weights"):
        EngineConfig(model_path="x", cpu_bf16_weights="maybe")
