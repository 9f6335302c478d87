"""``--kv-cache-dtype fp8_e4m3 / fp8_e5m2``: keys and values are stored in fp8 and converted to the
model dtype when attention reads them.

The reference is HF in bfloat16 whose language-model attention rounds its keys and values
through the same fp8 format before attending (an attention function registered with
transformers, masks as for SDPA). The engine then differs from it by bfloat16's reduction order,
amplified where a key or value lies near an fp8 rounding boundary (a bfloat16-sized difference
then flips it to the neighbouring fp8 value): the bound is twice the bfloat16 one (``FP8_SLACK``;
seen: up to 1.43 of the bfloat16 bound), and a dropped image still lands 12x-45x past it. The
drift that fp8 itself adds, against HF in float32, is also bounded: fp8_e4m3 rounds to 2^-4
relative and fp8_e5m2 to 2^-3, i.e. 16 and 32 times bfloat16's 2^-8, so the drift stays within
that multiple of bfloat16's own noise (seen: up to 5x and 9x).
"""

from __future__ import annotations

import functools

import pytest
import torch
import transformers
from conftest import HF_SKIPS_LOGITS_SCALING, model_dir
from test_bf16 import (
    MAX_FACTOR,
    MEAN_FACTOR,
    ONE_TOKEN,
    _engine_logprobs,
    _generate,
    _hf_logprobs,
    _prompt,
)
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

import sglang
from sglang.srt.model_executor.dtypes import KV_CACHE_DTYPES
from sglang.srt.multimodal.embedder import MultimodalEmbedder
from sglang.srt.multimodal.hf_processor import load_hf_processor

FP8 = ("fp8_e4m3", "fp8_e5m2")
FAMILIES = (
    "qwen2_5_vl",
    "qwen3_vl",
    "llava",
    "gemma3",
    "gemma4",
    "internvl",
    "mistral3",
    "qwen3_5",
)
ROUNDING_VS_BF16 = {"fp8_e4m3": 16, "fp8_e5m2": 32}
FP8_SLACK = 2.0


def _register_fp8_attention(kv_dtype: str) -> str:
    fp8 = KV_CACHE_DTYPES[kv_dtype]

    def attention(module, query, key, value, attention_mask, **kwargs):
        key, value = key.to(fp8).to(query.dtype), value.to(fp8).to(query.dtype)
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)

    name = f"sdpa_kv_{kv_dtype}"
    transformers.AttentionInterface.register(name, attention)
    AttentionMaskInterface.register(name, sdpa_mask)
    return name


@functools.cache
def _hf_fp8_logprobs(family: str, kv_dtype: str) -> torch.Tensor:
    path = model_dir(family)
    attn = {"text_config": _register_fp8_attention(kv_dtype), "vision_config": "sdpa", "": "sdpa"}
    model = transformers.AutoModelForImageTextToText.from_pretrained(
        path, dtype=torch.bfloat16, attn_implementation=attn
    ).eval()
    prompt, images = _prompt(family)
    inputs = load_hf_processor(path)(text=[prompt], images=images, return_tensors="pt")
    inputs = {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in inputs.items()}
    with torch.no_grad():
        logits = model(**inputs).logits[0].float()
    assert family not in HF_SKIPS_LOGITS_SCALING
    ids = inputs["input_ids"][0]
    return torch.log_softmax(logits, -1)[:-1].gather(1, ids[1:, None])[:, 0]


def _gap(family: str, kv_dtype: str, got: torch.Tensor) -> float:
    """Distance from HF with fp8-rounded KV in units of the bound (<= 1: within)."""
    want = _hf_fp8_logprobs(family, kv_dtype)
    noise = (_hf_logprobs(family, torch.bfloat16) - _hf_logprobs(family, torch.float32)).abs()
    gap = (got - want).abs()
    bf16_units = max(
        gap.max() / (MAX_FACTOR * noise.max()), gap.mean() / (MEAN_FACTOR * noise.mean())
    )
    return bf16_units / FP8_SLACK


@functools.cache
def _engine(family: str, kv_dtype: str, chunk: int) -> sglang.Engine:
    return sglang.Engine(
        model_path=model_dir(family),
        dtype="bfloat16",
        kv_cache_dtype=kv_dtype,
        chunked_prefill_size=chunk,
    )


@pytest.mark.parametrize("kv_dtype", FP8)
@pytest.mark.parametrize("family", FAMILIES)
def test_fp8_kv_matches_hf_with_the_same_rounding(family: str, kv_dtype: str) -> None:
    for chunk in (-1, 7):
        engine = _engine(family, kv_dtype, chunk)
        pool = engine.runner.kv_pool
        assert pool.k_buffer[0].dtype == KV_CACHE_DTYPES[kv_dtype]
        assert engine.get_server_info()["kv_cache_dtype"] == str(pool.dtype).removeprefix("torch.")
        got = _engine_logprobs(_generate(engine, family))
        assert _gap(family, kv_dtype, got) <= 1
        f32 = _hf_logprobs(family, torch.float32)
        noise = (_hf_logprobs(family, torch.bfloat16) - f32).abs()
        assert (got - f32).abs().max() <= ROUNDING_VS_BF16[kv_dtype] * noise.max()
        engine.scheduler.check_integrity()


def test_fp8_kv_halves_the_pool_per_token_and_decodes() -> None:
    bf16 = _engine("qwen2_5_vl", "auto", -1)
    fp8 = _engine("qwen2_5_vl", "fp8_e4m3", -1)
    assert fp8.runner.kv_pool.k_buffer[0][0].nbytes * 2 == bf16.runner.kv_pool.k_buffer[0][0].nbytes
    prompt, images = _prompt("qwen2_5_vl")
    out = fp8.generate(prompt, {"temperature": 0, "max_new_tokens": 8}, image_data=images)
    assert len(out["output_ids"]) == 8
    again = fp8.generate(prompt, ONE_TOKEN, image_data=images)
    assert again["meta_info"]["cached_tokens"] > 0
    fp8.scheduler.check_integrity()


@pytest.mark.parametrize("kv_dtype", FP8)
def test_fp8_kv_bound_catches_a_dropped_image(kv_dtype: str, monkeypatch) -> None:
    engine = sglang.Engine(
        model_path=model_dir("qwen2_5_vl"), dtype="bfloat16", kv_cache_dtype=kv_dtype
    )
    original = MultimodalEmbedder._get_chunked_embedding_by_item
    monkeypatch.setattr(
        MultimodalEmbedder,
        "_get_chunked_embedding_by_item",
        lambda self, *args: original(self, *args)[:-1],
    )
    assert _gap("qwen2_5_vl", kv_dtype, _engine_logprobs(_generate(engine, "qwen2_5_vl"))) > 1
