"""``--torchao-config``: the language model's linear layers quantized at load time; prompt
logprobs match HF's own model quantized the same way; bad ``--torchao-config`` and
``--quantization`` values and quantized checkpoints in formats not supported fail at start-up
with one-line errors (supported ones: ``test_prequantized.py``)."""

from __future__ import annotations

import copy
import functools
import shutil
from pathlib import Path

import pytest
import torch
import transformers
from conftest import (
    ALL_VLM_FAMILIES,
    HF_SKIPS_LOGITS_SCALING,
    _hf,
    hf_inputs,
    load_hf_model,
    make_image,
    model_dir,
    placeholder,
)
from PIL import Image
from quant_reference import DynamicReference, exact_embedding, exact_weight, stored_quantized
from torch import nn
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

import sglang
from sglang.srt import kernels
from sglang.srt.layers.quantization.quantized_embedding import quantize_embedding
from sglang.srt.layers.quantization.quantized_linear import QuantizedLinear, quantize
from sglang.srt.model_executor.dtypes import cpu_bfloat16_isa
from sglang.srt.model_executor.host_memory import module_bytes as weight_bytes
from sglang.srt.model_executor.quantization import (
    QuantizationReport,
    apply_torchao_config,
    quantize_head_and_embeddings,
    quantize_vision_tower,
)
from sglang.srt.models import fast_vision

ONE_TOKEN = {"temperature": 0, "max_new_tokens": 1}
# Quantized bytes over bfloat16 bytes: int4 is 0.5 byte per weight plus a bf16 scale and min
# per group; int8 is 1 byte plus a scale per row.
MAX_BYTES_RATIO = {"int4": 0.35, "int8": 0.55, "int8dq": 0.6, "8da4": 0.35}  # int8dq: + int32s


def _dynamic(config: str) -> bool:
    """Whether the config quantizes activations at run time: int8dq, 8da4w-<group>, and
    int4wo-<group> on a CPU without AVX512-BF16 (served as Q4_0 x Q8_0 there)."""
    int4wo_on_int8 = config.startswith("int4wo") and "avx512_bf16" not in kernels.cpu_flags()
    return config == "int8dq" or config.startswith("8da4w") or int4wo_on_int8


def _int4(config: str) -> bool:
    return config.startswith(("int4wo", "8da4w"))


def _prompt(family: str) -> str:
    return f"Look at {placeholder(family)} and tell me what you see in the picture, briefly."


def _hf_logprobs(
    family: str, model: nn.Module, processor, prompt: str, image
) -> tuple[list[int], torch.Tensor]:
    """HF's prompt ids and log P(token p | tokens < p) for p >= 1 (after the LM head's own
    scaling where HF's wrapper skips it, as the engine applies it)."""
    inputs = hf_inputs(processor, prompt, [image])  # one sample
    inputs = {k: v.to(model.dtype) if v.is_floating_point() else v for k, v in inputs.items()}
    with torch.no_grad():
        logits = model(**inputs).logits[0].float()
    if family in HF_SKIPS_LOGITS_SCALING:
        text_config = model.config.get_text_config()
        logits = logits / (
            getattr(text_config, "logits_scaling", None) or 1 / text_config.logit_scale
        )
    logprobs = torch.log_softmax(logits, -1)
    ids = inputs["input_ids"][0]
    return ids.tolist(), logprobs[:-1].gather(1, ids[1:, None])[:, 0]


@functools.cache
def _loaded(family: str, dtype: torch.dtype) -> nn.Module:
    if dtype == torch.float32:
        return _hf(family)[0]
    return load_hf_model(transformers.AutoModelForImageTextToText, model_dir(family), dtype)


def _fresh_hf(family: str, dtype: torch.dtype) -> nn.Module:
    """HF's model loaded in ``dtype``, a copy of its own to change (a copy of a model loaded
    once: loading it again takes ~10x as long). A Qwen-VL tower's patchwise Conv3d becomes the
    equal linear over flattened patches, as the engine serves it, so that it is quantized with
    the tower's other linears here too."""
    model = copy.deepcopy(_loaded(family, dtype))
    if model.config.model_type in fast_vision.FAST_VISION_MODEL_TYPES:
        assert fast_vision.patch_embeddings_as_linears(model.model.visual) == 1
    return model


def _hf_bf16(family: str) -> nn.Module:
    return _fresh_hf(family, torch.bfloat16)


def _hf_with_the_weights_of(family: str, quantized: nn.Module, dtype: torch.dtype) -> nn.Module:
    """An HF model in ``dtype`` whose linears at the quantized layers' places hold their
    weights (rounded to ``dtype``) and biases."""
    model = _fresh_hf(family, dtype)
    for name, layer in quantized.named_modules():
        if isinstance(layer, QuantizedLinear) and layer.dynamic:
            # a head tied to the embeddings serves their lookups from its codes
            model.get_submodule(name).weight.data = exact_weight(layer).to(dtype)
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent), child, DynamicReference(layer, dtype))
        elif isinstance(layer, QuantizedLinear):
            linear = model.get_submodule(name)
            linear.weight.data = exact_weight(layer).to(dtype)
            if layer.bias is not None:
                linear.bias.data = layer.bias.to(dtype)
        elif isinstance(layer, nn.Embedding) and hasattr(layer, "qweight"):
            model.get_submodule(name).weight.data = exact_embedding(layer).to(dtype)
    return model


def _hf_language_model(model: nn.Module) -> nn.Module:
    return getattr(model.model, "language_model", None) or model.model.text_model


# The tiny random DeepSeek-OCR2 encoder maps a white and a noise image to nearly one embedding
# (0.035 nats apart); its image path is covered by test_bf16's dropped-image error.
IMAGE_BLIND = ("deepseek_ocr2",)
# In the tiny MiniCPM-V 4.6 / 4.7, int4 weights times int8 activations (int4wo on a CPU without
# AVX512-BF16, where the engine runs float32) make HF's bfloat16-vs-float32 gap 0.13 nats on
# the mean, as large as what a white image or the unquantized model moves (0.31-0.81): the
# bound there is float32's own noise (HF float32 vs float64 with the same weights, 0.009; the
# engine 0.0013-0.0022 from HF float32).
FLOAT32_NOISE_ON_Q4_Q8 = ("minicpmv4_6", "minicpmv4_7")
QUANTIZED_CASES = [
    *[(family, "int4wo-32", "int8") for family in ALL_VLM_FAMILIES],
    *[(family, "int8wo", "int8") for family in ALL_VLM_FAMILIES],
    *[(family, "int8dq", "int8") for family in ALL_VLM_FAMILIES],
    # --vision-int8dq: the tower and projector in int8dq too
    *[(family, "int8dq+vision", "int8") for family in ("qwen2_5_vl", "llava", "gemma3", "glm4v")],
    ("llava", "int4wo-64", "int8"),
    ("gemma3", "int4wo-128", "int8"),  # tied LM head
    # --cpu-lm-head-dtype
    ("qwen2_5_vl", "int4wo-32", "int4"),
    ("glm4v", "int4wo-64", "int4"),
    ("llava", "int8wo", "bfloat16"),
    # 8da4w: int4 weights times int8 activations, its head in int8 or int4 likewise
    *[(family, "8da4w-32", "int8") for family in ("qwen2_5_vl", "llava", "gemma3", "glm4v")],
    ("qwen2_5_vl", "8da4w-64", "int4"),
    ("llava", "8da4w-32+vision", "int8"),
]


def _largest(difference: torch.Tensor) -> float:
    return difference.abs().max().item()


def _mean(difference: torch.Tensor) -> float:
    return difference.abs().mean().item()


# Families where one position decides the largest gap: Qwen3.5-MoE routes tokens to experts,
# and a rounding that flips one token's choice moves the logprobs from there on by far more than
# the rounding itself; in the tiny MiniCPM-V 4.6 / 4.7 language model one prompt token's
# residual is small, so its RMSNorm turns the kernel's 0.06 difference from HF bfloat16 (as on
# every other token) into 0.68. Their bound is on the mean gap (Qwen3.5-MoE int4: the engine
# 0.19 nats, HF bfloat16 vs float32 0.085; a wrong image 0.69, the unquantized model 0.64,
# positions shifted by one 1.1).
ONE_POSITION_DECIDES = {
    family: (_mean, 3) for family in ("qwen3_5_moe", "minicpmv4_6", "minicpmv4_7")
}


@pytest.mark.parametrize("family, config, head_dtype", QUANTIZED_CASES)
def test_engine_matches_hf_quantized_the_same_way(
    family: str, config: str, head_dtype: str
) -> None:
    """Engine (chunks of 5 tokens cut through the image, except Gemma3's, which is never split)
    vs HF's float32 model whose language-model linears carry the weights the engine's
    quantized layers stand for, read from the layouts' definition (``quant_reference``; exact
    in float32, as the kernel applies scales and mins to float32 sums). The engine runs in
    bfloat16 (float32 activations on a CPU without native bfloat16, whose weights it quantizes
    from float32), so it differs by bfloat16's own rounding at most; that is measured as HF
    bfloat16 (the weights rounded to bfloat16) vs HF float32 on the same input and the same
    quantized weights, and the engine stays within twice that of one of the two (the mean gap
    within three times, where one position decides the largest: ``ONE_POSITION_DECIDES``). A
    wrong image, an off-by-one position and (int4) the unquantized model each exceed the bound
    (against HF bfloat16 with the same weights)."""
    config, vision_int8dq = config.removesuffix("+vision"), config.endswith("+vision")
    fp32, processor = _hf(family)
    prompt, image = _prompt(family), make_image(2, 96, 64)
    ids, ref_fp32 = _hf_logprobs(family, fp32, processor, prompt, image)
    # the engine runs, and so quantizes, the float32 weights on a CPU without native bfloat16
    hf = _fresh_hf(family, torch.bfloat16 if cpu_bfloat16_isa() else torch.float32)
    report = apply_torchao_config(_hf_language_model(hf), config)  # as the engine quantizes
    quantize_head_and_embeddings(hf, _hf_language_model(hf), report, head_dtype)
    quantize_vision_tower(hf, _hf_language_model(hf), report, vision_int8dq)
    same_weights = _hf_with_the_weights_of(family, hf, torch.bfloat16)
    _, ref = _hf_logprobs(family, same_weights, processor, prompt, image)
    other_image = Image.new("RGB", image.size, "white")  # far from the noise image
    _, ref_other_image = _hf_logprobs(family, same_weights, processor, prompt, other_image)
    exact = _hf_with_the_weights_of(family, hf, torch.float32)
    _, ref_exact = _hf_logprobs(family, exact, processor, prompt, image)
    statistic, factor = ONE_POSITION_DECIDES.get(family, (_largest, 2))
    bound = factor * statistic(ref - ref_exact)
    if family in FLOAT32_NOISE_ON_Q4_Q8 and _int4(config) and _dynamic(config):
        assert not cpu_bfloat16_isa()  # int4wo takes int8 activations only there
        exact64 = _hf_with_the_weights_of(family, hf, torch.float64)
        _, ref_exact64 = _hf_logprobs(family, exact64, processor, prompt, image)
        bound = factor * statistic(ref_exact - ref_exact64)

    engine = sglang.Engine(
        model_path=model_dir(family),
        torchao_config=config,
        chunked_prefill_size=5,
        cpu_lm_head_dtype=head_dtype,
        vision_int8dq=vision_int8dq,
    )
    try:
        out = engine.generate(
            prompt, ONE_TOKEN, image_data=[image], return_logprob=True, logprob_start_len=0
        )
        got_rows = out["meta_info"]["input_token_logprobs"]
        assert [tok for _, tok, _ in got_rows] == ids and got_rows[0][0] is None
        got = torch.tensor([lp for lp, _, _ in got_rows[1:]])

        def gap(want: torch.Tensor) -> float:
            return statistic(got - want)

        assert min(gap(ref), gap(ref_exact)) <= bound, (gap(ref), gap(ref_exact), bound)
        if family not in IMAGE_BLIND:
            assert gap(ref_other_image) > bound
        if _int4(config):  # int8 moves logprobs by about the bfloat16 noise only
            _, ref_bf16 = _hf_logprobs(family, _loaded(family, torch.bfloat16), processor,
                                       prompt, image)  # fmt: skip
            assert gap(ref_bf16) > bound  # the engine ran the quantized model
        assert statistic(got[1:] - ref[:-1]) > bound
        tied = fp32.get_output_embeddings().weight is fp32.get_input_embeddings().weight
        _assert_weights_quantized(engine, config, tied, head_dtype, vision_int8dq)
        engine.scheduler.check_integrity()
    finally:
        engine.shutdown()


def _assert_weights_quantized(
    engine: sglang.Engine, config: str, tied: bool, head_dtype: str, vision_int8dq: bool = False
) -> None:
    runner, model = engine.runner, engine.runner.model
    # --dtype auto on a CPU: bfloat16 when quantized, float32 activations where the CPU has no
    # native bfloat16 (the quantized kernels take them there)
    assert runner.dtype == (torch.bfloat16 if cpu_bfloat16_isa() else torch.float32)
    language_model = runner.adapter.language_model
    linears = [m for m in language_model.modules() if isinstance(m, nn.Linear | QuantizedLinear)]
    quantized = [m for m in linears if stored_quantized(m)]
    report = engine.get_server_info()["weight_quantization"]
    assert quantized and report["quantized_layers"] == len(quantized)
    # int8dq, 8da4w: every one multiplies int8 activations (the kernel's tests check products)
    assert all(getattr(m, "dynamic", False) == _dynamic(config) for m in quantized)
    assert report["skipped_layers"] == len(linears) - len(quantized)  # each logged with a reason
    for layer in quantized:
        # stored in whole panels of 64 outputs and pairs of inputs
        dense = (-(-layer.in_features // 2) * 2) * (-(-layer.out_features // 64) * 64) * 2
        bias = layer.bias.numel() * 2 if layer.bias is not None else 0
        ratio = MAX_BYTES_RATIO.get(config, MAX_BYTES_RATIO[config[:4]])
        assert weight_bytes(layer) - bias <= ratio * dense
    # The vision tower and projector are int8 with int4 only (int8dq with --vision-int8dq).
    tower = [m for m in model.modules() if isinstance(m, QuantizedLinear) and m.bits == 8]
    tower = [m for m in tower if m is not model.get_output_embeddings() and m not in linears]
    assert report["vision_layers_int8"] == len(tower)
    assert (len(tower) > 0) == (_int4(config) or vision_int8dq)
    assert all(m.dynamic == vision_int8dq for m in tower)
    patch_embed = getattr(getattr(model.model, "visual", None), "patch_embed", None)
    if tower and model.config.model_type in fast_vision.FAST_VISION_MODEL_TYPES:
        assert patch_embed.proj in tower  # the patchwise Conv3d, served as a linear
    in_lm = {id(p) for p in language_model.parameters()}
    outside = [p for p in model.parameters() if id(p) not in in_lm]
    assert outside and not any(is_traceable_wrapper_subclass(p) for p in outside)
    head, embed = model.get_output_embeddings(), model.get_input_embeddings()
    want_head = {"int8": "int8", "int4": f"int4-{config.split('-')[-1]}"}.get(head_dtype)
    # a tied pair becomes one int8 table where the embedding is a plain nn.Embedding (not
    # Gemma's scaled one): the head's codes, which lookups gather
    shared = tied and want_head is not None and type(embed) is nn.Embedding
    if shared:
        assert (report["lm_head"], report["embeddings"]) == ("int8", "int8 (the head's)")
        assert isinstance(head, QuantizedLinear) and head.bits == 8
        assert embed.weight.untyped_storage().nbytes() == embed.weight.element_size()
        ids = torch.tensor([[0, 5], [embed.num_embeddings - 1, 64]])
        want = head.dequantized(torch.float64)[ids].to(embed.weight.dtype)
        assert torch.equal(embed(ids), want)
    else:
        want_head = "bfloat16" if tied or want_head is None else want_head
        assert report["lm_head"] == want_head
        assert stored_quantized(head) == (want_head != "bfloat16")
        assert hasattr(embed, "qweight") != tied
        assert report["embeddings"] == ("bfloat16" if tied else "int8")
        assert (getattr(head, "weight", None) is embed.weight) == tied
    if isinstance(head, QuantizedLinear):  # the dynamic modes' head takes int8 activations too
        assert head.dynamic == _dynamic(config)
    assert engine.get_server_info()["torchao_config"] == config
    assert (
        report["language_model_weight_bytes_after"] < report["language_model_weight_bytes_before"]
    )


def _bfloat16_copy(family: str, folder: Path) -> Path:
    """The tiny checkpoint stored in bfloat16, so that a bfloat16 load maps it from disk."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(model_dir(family), folder)
    for shard in folder.glob("*.safetensors"):
        tensors = {k: v.to(torch.bfloat16) for k, v in load_file(shard).items()}
        save_file(tensors, shard, metadata={"format": "pt"})
    return folder


def _mapped(folder: Path) -> int:
    with open("/proc/self/maps") as maps:
        return sum(str(folder) in line for line in maps)


def test_quantized_model_lets_the_checkpoint_mapping_go(tmp_path: Path) -> None:
    """A bfloat16 model with plain weights serves from its memory-mapped checkpoint; a
    quantized one, and a bfloat16 one whose weights are packed for the native GEMM, copy what
    they keep dense out, so the files' pages are no longer held by the process."""
    from conftest import NATIVE_GEMM_EXPECTED

    dense_dir = _bfloat16_copy("qwen2_5_vl", tmp_path / "dense")
    dense = sglang.Engine(model_path=str(dense_dir), dtype="bfloat16", cpu_packed_lm_weights="off")
    assert _mapped(dense_dir) > 0
    packed_dir = _bfloat16_copy("qwen2_5_vl", tmp_path / "packed")
    packed = sglang.Engine(model_path=str(packed_dir), dtype="bfloat16")
    assert (_mapped(packed_dir) == 0) == NATIVE_GEMM_EXPECTED
    packed.shutdown()
    quantized_dir = _bfloat16_copy("qwen2_5_vl", tmp_path / "int4")
    quantized = sglang.Engine(model_path=str(quantized_dir), torchao_config="int4wo-32")
    assert _mapped(quantized_dir) == 0
    out = quantized.generate("Say something.", {"temperature": 0, "max_new_tokens": 4})
    assert len(out["output_ids"]) == 4
    dense.shutdown()
    quantized.shutdown()


@pytest.mark.parametrize("family", ["qwen2_5_vl", "llava", "glm4v", "qwen2_vl"])
def test_int8_head_embeddings_and_tower_move_logprobs_about_as_bfloat16_does(family: str) -> None:
    """What a CPU quantizes beside the language model's linears, each alone in HF's bfloat16
    model, changes its prompt logprobs by at most about what running in bfloat16 instead of
    float32 does (measured on these and idefics3 / qwen3_vl: the untied LM head in int8
    0.28-0.63x of it, the token embeddings in int8 0.6-1.6x, the vision tower's linears in int8
    0.55-1.25x), where an int4 head would move them 2.4-11x (so it stays int8)."""
    fp32, processor = _hf(family)
    prompt, image = _prompt(family), make_image(2, 96, 64)
    _, ref_fp32 = _hf_logprobs(family, fp32, processor, prompt, image)
    _, ref_bf16 = _hf_logprobs(family, _hf_bf16(family), processor, prompt, image)
    noise = (ref_bf16 - ref_fp32).abs().max().item()

    def moved(quantize, limit: float) -> float:
        hf = _hf_bf16(family)
        quantize(hf)
        _, got = _hf_logprobs(family, hf, processor, prompt, image)
        gap = (got - ref_bf16).abs().max().item()
        assert 0 < gap < limit * noise, (gap, noise)
        return gap

    def head(bits: int, group: int | None):
        def swap(hf: nn.Module) -> None:
            hf.set_output_embeddings(quantize(hf.get_output_embeddings(), bits, group))

        return swap

    def tower(hf: nn.Module) -> None:
        report = QuantizationReport("int4wo-32")
        quantize_vision_tower(hf, _hf_language_model(hf), report)
        assert report.vision_layers > 0

    def embeddings(hf: nn.Module) -> None:
        assert quantize_embedding(hf.get_input_embeddings())

    moved(head(8, None), 1.0)
    moved(embeddings, 2.0)
    moved(tower, 2.0)
    with pytest.raises(AssertionError):
        moved(head(4, 32), 2.0)


@pytest.mark.parametrize("family", ["paddleocr_vl"])
def test_a_tied_pair_in_one_int8_table_moves_logprobs_about_as_bfloat16_does(family: str) -> None:
    """A head tied to the embeddings becomes one int8 table read by both (the head's product
    and the lookups): in HF's bfloat16 model that moves the prompt logprobs by about what
    running in bfloat16 instead of float32 does, as the untied head and embeddings in int8 do
    together; an int4 table would not (the deliberate error)."""
    fp32, processor = _hf(family)
    assert fp32.get_output_embeddings().weight is fp32.get_input_embeddings().weight
    prompt, image = _prompt(family), make_image(2, 96, 64)
    _, ref_fp32 = _hf_logprobs(family, fp32, processor, prompt, image)
    _, ref_bf16 = _hf_logprobs(family, _hf_bf16(family), processor, prompt, image)
    noise = (ref_bf16 - ref_fp32).abs().max().item()

    hf = _hf_bf16(family)
    report = QuantizationReport("int8wo")
    quantize_head_and_embeddings(hf, _hf_language_model(hf), report)
    assert (report.lm_head, report.embeddings) == ("int8", "int8 (the head's)")
    _, got = _hf_logprobs(family, hf, processor, prompt, image)
    gap = (got - ref_bf16).abs().max().item()
    assert 0 < gap < 2.0 * noise, (gap, noise)

    hf = _hf_bf16(family)  # the same pair in int4: far outside
    head = quantize(hf.get_output_embeddings(), 4, 32)
    hf.set_output_embeddings(head)
    hf.get_input_embeddings().weight.data = exact_weight(head).to(torch.bfloat16)
    _, int4 = _hf_logprobs(family, hf, processor, prompt, image)
    assert (int4 - ref_bf16).abs().max().item() > 2.0 * noise
