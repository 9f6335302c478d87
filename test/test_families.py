"""The VLM families users bring (InternVL, LLaVA-NeXT, Granite Vision, Mistral3, ...) match HF
``generate`` token for token through the generic adapter: one image, several images of
different sizes and aspect ratios (so tile counts differ), chunk sizes that cut through images
and their break tokens, no chunking, radix hits and a mixed batch."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import hf_greedy, make_image, model_dir, placeholder

import sglang
from sglang.srt.models.adapters import (
    FAMILY_ADAPTERS,
    UnsupportedModelError,
    check_model,
)
from sglang_dev.tiny_models import EXTRA_VLM_FAMILIES

MAX_NEW = 6
GREEDY = {"temperature": 0, "max_new_tokens": MAX_NEW}
CUTTING_CHUNKS = (29, 23, 19, 17, 13, 11, 7, 5)  # the largest that cuts as needed


@functools.cache
def _engine(family: str, chunk: int) -> sglang.Engine:
    return sglang.Engine(dtype="float32", model_path=model_dir(family), chunked_prefill_size=chunk)


def _cases(family: str) -> list[tuple[str, list]]:
    ph = placeholder(family)
    wide, tall, square = make_image(2, 96, 40), make_image(3, 40, 88), make_image(4, 56, 56)
    return [
        (f"Describe {ph} in a few words.", [make_image(1, 48, 48)]),
        (f"First {ph} then {ph} and last {ph} compare them.", [wide, tall, square]),
    ]


@functools.cache
def _refs(family: str) -> list[tuple[list[int], list[float]]]:
    return [hf_greedy(family, prompt, images, MAX_NEW) for prompt, images in _cases(family)]


def _items(engine: sglang.Engine, prompt: str, images: list) -> tuple[list[int], list]:
    return engine.processor.process(prompt, None, engine.processor.load_images(images))


def _assert_matches(out: dict, ref: tuple[list[int], list[float]]) -> None:
    ref_ids, ref_logprobs = ref
    assert out["output_ids"] == ref_ids
    got = [lp for lp, _, _ in out["meta_info"]["output_token_logprobs"]]
    assert got == pytest.approx(ref_logprobs, abs=2e-4)


def _cutting_chunk(engine: sglang.Engine, prompt: str, images: list) -> int:
    """A chunk size whose boundaries fall inside an image and, where an image's placeholders
    are several runs, on a break or wrapper token between them."""
    _, items = _items(engine, prompt, images)
    several_runs = any(len(item.spans) > 1 for item in items)
    for chunk in CUTTING_CHUNKS:
        inside, on_break = False, False
        for item in items:
            image_rows = {p for s, e in item.spans for p in range(s, e)}
            for bound in range(chunk, item.end, chunk):
                if item.start < bound < item.end:
                    inside = True
                    on_break |= bound not in image_rows or bound - 1 not in image_rows
        if inside and (on_break or not several_runs):
            return chunk
    raise AssertionError(f"no chunk size in {CUTTING_CHUNKS} cuts the images as needed")


@pytest.mark.parametrize("family", EXTRA_VLM_FAMILIES)
def test_family_matches_hf_across_chunks_and_radix_hits(family: str) -> None:
    cases, refs = _cases(family), _refs(family)
    cut = _cutting_chunk(_engine(family, -1), *cases[1])
    for chunk in (-1, cut):
        engine = _engine(family, chunk)
        for (prompt, images), ref in zip(cases, refs):
            first = engine.generate(prompt, GREEDY, image_data=images, return_logprob=True)
            _assert_matches(first, ref)
            again = engine.generate(prompt, GREEDY, image_data=images, return_logprob=True)
            _assert_matches(again, ref)
            meta = again["meta_info"]
            assert meta["cached_tokens"] == meta["prompt_tokens"] - 1 > 0
        engine.scheduler.check_integrity()


@pytest.mark.parametrize("family", EXTRA_VLM_FAMILIES)
def test_family_mixed_batch(family: str) -> None:
    """Both image prompts and a text-only one in one batch, chunked (HF references shared with
    the test above)."""
    (one, one_images), (several, several_images) = _cases(family)
    text = "Only text in this request, a little longer than the others are."
    refs = [_refs(family)[0], hf_greedy(family, text, [], MAX_NEW), _refs(family)[1]]
    engine = _engine(family, 16)
    outs = engine.generate(
        [one, text, several],
        GREEDY,
        image_data=[one_images, [], several_images],
        return_logprob=True,
    )
    for out, ref in zip(outs, refs):
        _assert_matches(out, ref)
    engine.scheduler.check_integrity()


@pytest.mark.parametrize("family", EXTRA_VLM_FAMILIES)
def test_family_placeholders_and_cache_hits(family: str) -> None:
    """Each image owns exactly the image-token positions of its replacement; an image whose
    embedding is cached is encoded once and not preprocessed again."""
    engine = _engine(family, -1)
    prompt, images = _cases(family)[1]
    ids, items = _items(engine, prompt, images)
    image_token = engine.runner.adapter.image_token_id
    owned = sorted(p for item in items for s, e in item.spans for p in range(s, e))
    assert owned == [i for i, t in enumerate(ids) if t == image_token]
    assert all(np.all(np.diff([s for s, _ in item.spans]) > 0) for item in items)

    image = make_image(8, 72, 40)
    embedder = engine.runner.embedder
    before = (embedder.stats.encoded_items, embedder.preprocess.num_preprocessed)
    engine.generate(f"A {placeholder(family)} first.", GREEDY, image_data=image)
    eager = engine.processor.preprocessor.num_preprocessed
    engine.generate(f"Other words then {placeholder(family)} again.", GREEDY, image_data=image)
    assert engine.processor.preprocessor.num_preprocessed == eager  # layout known by size
    after = (embedder.stats.encoded_items, embedder.preprocess.num_preprocessed)
    assert after[0] - before[0] == 1 and after[1] - before[1] <= 1


def test_unservable_model_fails_at_startup_with_one_line(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "mllama"}))
    with pytest.raises(UnsupportedModelError, match="cannot serve model type 'mllama'"):
        check_model(str(tmp_path))
    with pytest.raises(UnsupportedModelError, match="cannot serve"):
        sglang.Engine(dtype="float32", model_path=str(tmp_path))
    proc = subprocess.run(
        [sys.executable, "-m", "sglang.launch_server", "--model-path", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    assert proc.returncode != 0
    errors = [line for line in proc.stderr.splitlines() if "error" in line.lower()]
    assert "Traceback" not in proc.stderr and len(errors) == 1, proc.stderr
    assert errors[0].startswith("error: cannot serve model type 'mllama'")
    assert all(family in errors[0] for family in FAMILY_ADAPTERS)


@pytest.mark.parametrize("family", ["internvl", "mistral3"])
def test_vit_per_chunk_benchmark_encodes_each_image_once(family: str, tmp_path: Path) -> None:
    """Tiles (InternVL) and row breaks (Mistral3): per-image mode encodes each image once per
    request while combined re-encodes every image at the first chunk that touches one."""
    from benchmark.vit_per_chunk import main

    out = tmp_path / "vpc"
    main(["--family", family, "--model-path", model_dir(family), "--images", "3",
          "--resolution", "112x80", "--chunk", "8", "--modes", "per-image,combined",
          "--out", str(out)])  # fmt: skip
    data = json.loads(out.with_suffix(".json").read_text())
    by_mode = {r["mode"]: r["passes"][0] for r in data["results"]}
    per_image, combined = by_mode["per-image"], by_mode["combined"]
    assert sum(c["encoded_items"] for c in per_image["chunks"]) == 3
    assert per_image["max_items_per_chunk"] == 1
    assert combined["max_items_per_chunk"] == 3
