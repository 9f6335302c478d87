"""Tiny random HF checkouts: reload, processor/model consistency, caching."""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from PIL import Image

import sglang_dev.tiny_models as tiny
from sglang.srt.multimodal.hf_processor import load_hf_processor
from sglang_dev.tiny_models import (
    FAMILIES,
    IMAGE_PLACEHOLDER,
    IMAGE_TOKEN,
    build_tiny_model,
    tiny_model_path,
)
from sglang_dev.tiny_models import build as tiny_build

TEXT_ONLY = tuple(f for f in FAMILIES if f not in IMAGE_PLACEHOLDER)
# Placeholder tokens per image for a 64x64 and a 96x128 (h x w) image; pins the tiny recipes.
EXPECTED_IMAGE_TOKENS = {
    "qwen2_vl": [25, 24],
    "qwen2_5_vl": [25, 24],
    "qwen3_vl": [16, 20],
    "llava": [16, 16],
    "gemma3": [16, 16],
    "qwen3_5": [16, 20],
    "qwen3_5_moe": [16, 20],
}
VLMS = tuple(EXPECTED_IMAGE_TOKENS)  # the other families: test_families.py


def _image(seed: int, height: int, width: int) -> Image.Image:
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    return Image.fromarray(pixels)


def _image_token_id(config: transformers.PretrainedConfig) -> int:
    token_id = getattr(config, "image_token_id", None)
    return token_id if token_id is not None else config.image_token_index


def _tokens_per_image(model: torch.nn.Module, inputs: transformers.BatchFeature) -> list[int]:
    """Rows of ``get_image_features`` per image (its return type differs per family)."""
    keys = ("pixel_values", "image_grid_thw", "image_sizes")
    out = model.get_image_features(**{k: inputs[k] for k in keys if k in inputs})
    feats = getattr(out, "pooler_output", out)
    if isinstance(feats, torch.Tensor):  # Gemma3: (num_images, tokens, hidden)
        feats = list(feats) if feats.ndim == 3 else [feats]
    return [int(f.shape[0]) for f in feats]


@pytest.mark.parametrize("family", VLMS)
def test_vlm_generate_and_processor_consistency(family: str, tmp_path: Path) -> None:
    path = build_tiny_model(family, tmp_path / family)
    model, info = transformers.AutoModelForImageTextToText.from_pretrained(
        path, output_loading_info=True
    )
    assert not info["missing_keys"] and not info["unexpected_keys"]
    processor = load_hf_processor(path)
    config = model.config
    tokenizer = processor.tokenizer
    assert config.get_text_config().vocab_size >= len(tokenizer)
    image_id = _image_token_id(config)
    assert image_id == tokenizer.convert_tokens_to_ids(IMAGE_TOKEN[family])

    messages = [
        {
            "role": "user",
            "content": [
                {"type": "image"},
                {"type": "text", "text": "What is in these two pictures?"},
                {"type": "image_url", "image_url": {"url": "data:,"}},
            ],
        }
    ]
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert prompt.count(IMAGE_PLACEHOLDER[family]) == 2
    images = [_image(0, 64, 64), _image(1, 96, 128)]
    inputs = processor(text=[prompt], images=images, return_tensors="pt")

    with torch.no_grad():
        per_image = _tokens_per_image(model, inputs)
        out = model.generate(**inputs, max_new_tokens=8, do_sample=False)
    n_placeholders = int((inputs["input_ids"] == image_id).sum())
    assert per_image == EXPECTED_IMAGE_TOKENS[family]
    assert n_placeholders == sum(per_image)
    if family.startswith("qwen"):  # get_rope_index needs mm_token_type_ids
        assert int(inputs["mm_token_type_ids"].sum()) == n_placeholders
    if family == "gemma3":
        assert int(inputs["token_type_ids"].sum()) == n_placeholders

    prompt_len = inputs["input_ids"].shape[1]
    assert out.shape[0] == 1 and prompt_len < out.shape[1] <= prompt_len + 8
    assert bool((out[0, :prompt_len] == inputs["input_ids"][0]).all())


@pytest.mark.parametrize("family", TEXT_ONLY)
def test_text_only_generate(family: str, tmp_path: Path) -> None:
    path = build_tiny_model(family, tmp_path / family)
    model = transformers.AutoModelForCausalLM.from_pretrained(path)
    tokenizer = load_hf_processor(path)
    assert isinstance(tokenizer, transformers.PreTrainedTokenizerBase)
    assert model.config.vocab_size >= len(tokenizer)
    messages = [{"role": "user", "content": [{"type": "text", "text": "Say hello."}]}]
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    inputs = tokenizer([prompt], return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=8, do_sample=False)
    assert inputs["input_ids"].shape[1] < out.shape[1] <= inputs["input_ids"].shape[1] + 8


def test_build_is_deterministic_and_small(tmp_path: Path) -> None:
    a = build_tiny_model("qwen2_5_vl", tmp_path / "a")
    b = build_tiny_model("qwen2_5_vl", tmp_path / "b")
    files = sorted(p.name for p in a.iterdir())
    assert files == sorted(p.name for p in b.iterdir())
    assert all((a / f).read_bytes() == (b / f).read_bytes() for f in files)
    assert sum((a / f).stat().st_size for f in files) < 8 * 2**20
    config = json.loads((a / "config.json").read_text())
    assert config["torch_dtype"] == "float32"
    pre = json.loads((a / "preprocessor_config.json").read_text())
    assert pre["image_processor_type"] == "Qwen2VLImageProcessor"


def test_published_layout_chat_template_json(tmp_path: Path) -> None:
    """Real Qwen2.5-VL folders ship the template as chat_template.json, no processor_config."""
    path = build_tiny_model("qwen2_5_vl", tmp_path / "m")
    template = (path / "chat_template.jinja").read_text()
    (path / "chat_template.jinja").unlink()
    (path / "chat_template.json").write_text(json.dumps({"chat_template": template}))
    processor = load_hf_processor(path)
    assert processor.chat_template == template
    assert type(processor).__name__ == "Qwen2_5_VLProcessor"


def test_tiny_model_path_caches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("SGLANG_CACHE_DIR", str(tmp_path))
    caplog.set_level(logging.INFO, logger=tiny_build.__name__)
    first = tiny_model_path(tiny.DEFAULT_FAMILY)
    before, after = (r.getMessage() for r in caplog.records)  # a first run says what it builds
    assert before.startswith("building the tiny qwen2_5_vl checkpoint") and str(first) in before
    assert after.startswith(f"built {first.name} in ")
    caplog.clear()
    assert first.parent == tmp_path / "tiny-models"
    assert first.name == f"qwen2_5_vl-v{tiny.RECIPE_VERSION}"
    mtime = (first / "model.safetensors").stat().st_mtime_ns
    calls: list[str] = []
    monkeypatch.setattr(tiny_build, "build_tiny_model", lambda *a, **k: calls.append("x"))
    assert tiny_model_path(tiny.DEFAULT_FAMILY) == first
    assert (first / "model.safetensors").stat().st_mtime_ns == mtime
    assert not calls and caplog.records == []


def test_concurrent_cache_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SGLANG_CACHE_DIR", str(tmp_path))
    results: list[Path] = []
    threads = [
        threading.Thread(target=lambda: results.append(tiny_model_path("llama"))) for _ in range(2)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 2 and results[0] == results[1]
    leftovers = [p.name for p in (tmp_path / "tiny-models").iterdir() if p.is_dir()]
    assert leftovers == [results[0].name]


def test_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tiny.main(["--family", "llama", "--out", str(tmp_path / "cli")])
    assert capsys.readouterr().out.strip() == str(tmp_path / "cli")
    assert (tmp_path / "cli" / "model.safetensors").is_file()


def test_registry_derived_tuples_are_consistent() -> None:
    registry = tiny.REGISTRY
    assert all(name == family.name for name, family in registry.items())
    groups = (tiny.BASE_VLM_FAMILIES, tiny.EXTRA_VLM_FAMILIES, tiny.HYBRID_VLM_FAMILIES)
    assert sorted(name for group in groups for name in group) == sorted(tiny.VLM_FAMILIES)
    assert tiny.FAMILIES == tiny.VLM_FAMILIES + tiny.TEXT_FAMILIES
    assert sorted(FAMILIES) == sorted(registry) and len(set(FAMILIES)) == len(FAMILIES)
    assert set(IMAGE_PLACEHOLDER) == set(IMAGE_TOKEN) == set(tiny.VLM_FAMILIES)
    assert all(IMAGE_PLACEHOLDER[name] and IMAGE_TOKEN[name] for name in tiny.VLM_FAMILIES)
    assert set(tiny.SMALL_FAMILIES) <= set(tiny.VLM_FAMILIES)
    assert set(tiny.VIDEO_FAMILIES) <= set(tiny.VLM_FAMILIES)
    assert tiny.DEFAULT_FAMILY in tiny.BASE_VLM_FAMILIES


@pytest.mark.parametrize(
    "family,size",
    [(f, "tiny") for f in FAMILIES] + [(f, "small") for f in tiny.SMALL_FAMILIES],
)
def test_every_registered_family_builds(family: str, size: str, tmp_path: Path) -> None:
    out = build_tiny_model(family, tmp_path / family, size=size)
    files = {p.name for p in out.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= files
    assert ("preprocessor_config.json" in files) == (family in tiny.VLM_FAMILIES)
    assert ("video_preprocessor_config.json" in files) == (family in tiny.VIDEO_FAMILIES)
