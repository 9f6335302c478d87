"""Gemma 4 (per-layer KV shapes, shared KV, per-layer inputs, images bidirectional in sliding
layers only) and PaliGemma (a prefix-LM): what makes them differ from the generic path is
needed for parity with HF, and a prefix-LM's KV is reused only by the same prompt. Parity itself
runs with every family in test_families.py, test_multi_image.py and test_parity_property.py."""

from __future__ import annotations

import functools
import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import transformers
from conftest import examples, hf_greedy, load_hf_model, make_image, model_dir, placeholder
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import sglang
from sglang.srt.managers.prefill_planner import PrefillPlanner
from sglang.srt.mem_cache.kv_layout import KVLayout
from sglang.srt.models.adapters import get_adapter
from sglang.srt.multimodal.hf_processor import load_hf_processor

MAX_NEW = 6
GREEDY = {"temperature": 0, "max_new_tokens": MAX_NEW}


def _case(family: str) -> tuple[str, list]:
    ph = placeholder(family)
    return f"First {ph} then {ph} compare them.", [make_image(2, 96, 40), make_image(3, 40, 88)]


@functools.cache
def _ref(family: str) -> tuple[list[int], list[float]]:
    return hf_greedy(family, *_case(family), MAX_NEW)


def _run(engine: sglang.Engine, family: str) -> tuple[list[int], list[float]]:
    """Greedy ids and logprobs of the two-image case, its KV computed afresh."""
    assert engine.flush_cache()
    prompt, images = _case(family)
    out = engine.generate(prompt, GREEDY, image_data=images, return_logprob=True)
    return out["output_ids"], [lp for lp, _, _ in out["meta_info"]["output_token_logprobs"]]


def _same_as_hf(got: tuple[list[int], list[float]], ref: tuple[list[int], list[float]]) -> bool:
    return got[0] == ref[0] and got[1] == pytest.approx(ref[1], abs=2e-4)


# KV layout ------------------------------------------------------------------------------------
def test_gemma4_pool_has_per_layer_shapes_and_no_layers_for_shared_kv() -> None:
    config = transformers.AutoConfig.from_pretrained(model_dir("gemma4")).get_text_config()
    layout = KVLayout.of(config)
    # Layers: s s f s | s f, the last two reading layers 3 (sliding) and 2 (full).
    assert layout.shapes == ((2, 16), (2, 16), (1, 32), (2, 16))
    assert layout.pool_layer == {0: 0, 1: 1, 2: 2, 3: 3, 4: 3, 5: 2}
    assert layout.shared == {4, 5}
    assert layout.bytes_per_token(torch.float32) == 2 * 4 * (3 * 2 * 16 + 32)
    engine = sglang.Engine(dtype="float32", model_path=model_dir("gemma4"), chunked_prefill_size=-1)
    pool = engine.runner.kv_pool
    assert [tuple(buf.shape[1:]) for buf in pool.k_buffer] == list(layout.shapes)
    assert engine.get_server_info()["memory"]["kv_bytes_per_token"] == 1024


def test_uniform_and_hybrid_layouts() -> None:
    plain = SimpleNamespace(
        num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, hidden_size=64
    )
    assert KVLayout.of(plain).shapes == ((2, 16),) * 3 and not KVLayout.of(plain).shared
    hybrid = SimpleNamespace(
        **vars(plain), head_dim=8, layer_types=["linear_attention", "full_attention"] * 2
    )
    hybrid.num_hidden_layers = 4
    layout = KVLayout.of(hybrid)
    assert layout.shapes == ((2, 8),) * 2 and layout.pool_layer == {1: 0, 3: 1}


# Gemma 4: each of its differences is needed -----------------------------------------------------
@functools.cache
def _gemma4(chunk: int = 7) -> sglang.Engine:
    return sglang.Engine(
        dtype="float32", model_path=model_dir("gemma4"), chunked_prefill_size=chunk
    )


def test_gemma4_matches_hf_and_images_are_never_split() -> None:
    engine = _gemma4()
    assert _same_as_hf(_run(engine, "gemma4"), _ref("gemma4"))
    assert engine.runner.adapter.bidirectional == "images"


def test_gemma4_images_attend_both_ways_in_sliding_layers_only(monkeypatch) -> None:
    backend = _gemma4().runner.attn_backend
    monkeypatch.setattr(backend, "spans_in_sliding_layers_only", False)
    assert not _same_as_hf(_run(_gemma4(), "gemma4"), _ref("gemma4"))


def test_gemma4_shared_layers_read_their_source_layer(monkeypatch) -> None:
    language_model = _gemma4().runner.adapter.language_model
    shared = language_model.layers[4].self_attn  # reads pool layer 3 (sliding)
    monkeypatch.setattr(shared, "kv_layer_idx", 1)
    assert not _same_as_hf(_run(_gemma4(), "gemma4"), _ref("gemma4"))


def test_gemma4_per_layer_inputs_read_image_tokens_as_padding(monkeypatch) -> None:
    adapter = _gemma4().runner.adapter
    language_model = adapter.language_model

    def image_ids_kept(input_ids: torch.Tensor) -> dict:
        return {"per_layer_inputs": language_model.get_per_layer_inputs(input_ids[None])}

    monkeypatch.setattr(adapter, "token_lm_kwargs", image_ids_kept)
    assert not _same_as_hf(_run(_gemma4(), "gemma4"), _ref("gemma4"))


def test_gemma4_generated_placeholder_token_embeds_as_padding() -> None:
    """HF's Gemma 4 forward embeds every image / video / audio placeholder as padding; here the
    tiny model's first generated token is ``<|video|>``, and the next tokens follow HF's only if
    the engine pads it too."""
    ph = placeholder("gemma4")
    images = [make_image(1, 32, 32), make_image(2, 32, 32), make_image(3, 64, 32)]
    prompt = f" {ph}  {ph} the {ph} red"
    ref = hf_greedy("gemma4", prompt, images, MAX_NEW)
    video_token = _gemma4(-1).runner.config.video_token_id
    assert ref[0][0] == video_token
    _gemma4(-1).flush_cache()
    out = _gemma4(-1).generate(prompt, GREEDY, image_data=images, return_logprob=True)
    got = out["output_ids"], [lp for lp, _, _ in out["meta_info"]["output_token_logprobs"]]
    assert _same_as_hf(got, ref)


def test_causal_gemma4_splits_images_across_chunks(tmp_path: Path) -> None:
    """Gemma 4 checkpoints without ``use_bidirectional_attention`` attend causally everywhere:
    chunks may then cut through images, and the output still equals HF's."""
    folder = tmp_path / "gemma4-causal"
    shutil.copytree(model_dir("gemma4"), folder)
    config = json.loads((folder / "config.json").read_text())
    config["text_config"]["use_bidirectional_attention"] = None
    (folder / "config.json").write_text(json.dumps(config))
    model = load_hf_model(transformers.AutoModelForImageTextToText, str(folder), torch.float32)
    processor = load_hf_processor(folder)
    prompt, images = _case("gemma4")
    inputs = processor(text=[prompt], images=[images], return_tensors="pt")
    with torch.no_grad():
        ref = model.generate(**inputs, max_new_tokens=MAX_NEW, do_sample=False)
    ref_ids = ref[0, inputs["input_ids"].shape[1] :].tolist()
    engine = sglang.Engine(dtype="float32", model_path=str(folder), chunked_prefill_size=7)
    assert engine.runner.adapter.bidirectional is None
    assert _run(engine, "gemma4")[0] == ref_ids
    assert engine.scheduler.forward_steps > len(inputs["input_ids"][0]) // 7  # chunks of 7
    assert _run(engine, "gemma4")[0] != _ref("gemma4")[0]  # the mask mattered


# PaliGemma: a prefix-LM --------------------------------------------------------------------------
@functools.cache
def _paligemma(chunk: int = 5) -> sglang.Engine:
    return sglang.Engine(
        dtype="float32", model_path=model_dir("paligemma"), chunked_prefill_size=chunk
    )


def test_paligemma_prompt_is_prefilled_whole_and_matches_hf() -> None:
    engine = _paligemma()
    steps = engine.scheduler.forward_steps
    assert _same_as_hf(_run(engine, "paligemma"), _ref("paligemma"))
    assert engine.scheduler.forward_steps - steps == MAX_NEW  # one prefill, then decodes


def test_paligemma_layout_adds_bos_after_the_last_image_and_a_newline() -> None:
    processor = _paligemma().processor
    tokenizer = processor.tokenizer
    ids, _ = processor.process("caption en", None, [])
    assert ids == tokenizer("<bos>caption en\n", add_special_tokens=False)["input_ids"]
    images = processor.load_images([make_image(1)])
    ids, items = processor.process("<image>caption en", None, images)
    assert ids[items[0].end] == tokenizer.bos_token_id
    assert tokenizer.decode(ids[items[0].end :]) == "<bos>caption en\n"


@pytest.mark.parametrize("mutation", ["causal prompt", "window bounds the prompt"])
def test_paligemma_prefix_mask_is_needed(mutation: str, monkeypatch) -> None:
    engine = sglang.Engine(
        dtype="float32", model_path=model_dir("paligemma"), chunked_prefill_size=-1
    )
    if mutation == "causal prompt":
        monkeypatch.setattr(engine.scheduler, "bidirectional", None)
    else:
        monkeypatch.setattr(engine.runner.attn_backend, "window_bounds_spans", True)
    assert not _same_as_hf(_run(engine, "paligemma"), _ref("paligemma"))


def test_paligemma_1_with_a_gemma_lm_matches_hf(tmp_path: Path) -> None:
    """PaliGemma 1: a Gemma (1) language model, no sliding window and no soft-capping; the
    whole prompt still attends both ways, chunks never split it."""
    folder = tmp_path / "paligemma1"
    shutil.copytree(model_dir("paligemma"), folder)
    config = json.loads((folder / "config.json").read_text())
    text = config["text_config"]
    gemma2_only = (
        "layer_types",
        "sliding_window",
        "attn_logit_softcapping",
        "final_logit_softcapping",
        "query_pre_attn_scalar",
        "cache_implementation",
    )
    for key in gemma2_only:
        text.pop(key, None)
    text["model_type"] = "gemma"
    (folder / "config.json").write_text(json.dumps(config))
    model = load_hf_model(transformers.AutoModelForImageTextToText, str(folder), torch.float32)
    assert type(model.model.language_model).__name__ == "GemmaModel"
    processor = load_hf_processor(folder)
    prompt, images = _case("paligemma")
    inputs = processor(text=[prompt], images=[images], return_tensors="pt")
    with torch.no_grad():
        ref = model.generate(**inputs, max_new_tokens=MAX_NEW, do_sample=False)
    ref_ids = ref[0, inputs["input_ids"].shape[1] :].tolist()
    for chunk in (-1, 5):
        engine = sglang.Engine(dtype="float32", model_path=str(folder), chunked_prefill_size=chunk)
        assert _run(engine, "paligemma")[0] == ref_ids
        engine.scheduler.check_integrity()


def test_paligemma_kv_is_reused_only_by_the_same_prompt() -> None:
    engine = sglang.Engine(
        dtype="float32", model_path=model_dir("paligemma"), chunked_prefill_size=-1
    )
    ph, image = placeholder("paligemma"), make_image(5, 64, 64)
    short = f"{ph}answer en what is it"
    longer = f"{ph}answer en what is it and where"
    for prompt, hit in ((short, False), (short, True), (longer, False), (longer, True)):
        out = engine.generate(prompt, GREEDY, image_data=[image], return_logprob=True)
        meta = out["meta_info"]
        assert meta["cached_tokens"] == (meta["prompt_tokens"] - 1 if hit else 0), prompt
        assert out["output_ids"] == hf_greedy("paligemma", prompt, [image], MAX_NEW)[0]
    engine.scheduler.check_integrity()


# Chunk planning never splits a bidirectional span -------------------------------------------------
@settings(max_examples=examples(200), deadline=None)
@given(
    spans=st.lists(st.tuples(st.integers(0, 60), st.integers(1, 20)), max_size=4),
    start=st.integers(0, 80),
    budget=st.integers(1, 40),
)
def test_planned_chunks_never_end_inside_a_span(spans, start, budget) -> None:
    spans = sorted({(a, a + n) for a, n in spans})
    # Disjoint spans, as images and a prefix-LM's prompt are.
    spans = [s for i, s in enumerate(spans) if all(s[0] >= e for _, e in spans[:i])]
    total = max([e for _, e in spans] + [start + 1]) + 5
    assume(not any(a < start < e for a, e in spans))  # a chunk never starts inside a span
    req = SimpleNamespace(
        computed_len=start,
        input_ids=[0] * total,
        bidirectional_spans=lambda: spans,
        extend_len=0,
    )
    planner = SimpleNamespace(bidirectional="images")
    n = PrefillPlanner._plan_extend(planner, req, budget, may_exceed=False)
    end = start + n
    assert n > 0 and all(not (a < end < e) for a, e in spans)
    assert n <= budget or any(a == start and e > start + budget for a, e in spans)


@pytest.mark.parametrize(
    "family, bidirectional, offset",
    [
        ("qwen2_5_vl", None, 0),
        ("llava", None, 0),
        ("gemma3", "images", 0),
        ("paligemma", "prompt", 1),
    ],
)
def test_what_attends_both_ways_per_family(family: str, bidirectional, offset: int) -> None:
    """Causal families take the generic adapter's defaults; Gemma 3's images and PaliGemma's
    prompt attend both ways, and PaliGemma's positions start at 1 (HF's conventions)."""
    adapter = get_adapter(None, transformers.AutoConfig.from_pretrained(model_dir(family)))
    assert (adapter.bidirectional, adapter.position_offset) == (bidirectional, offset)
