"""The trained OCR reader (the embedded default, ``sglang/default_model``) reads, and every
serving mode keeps it.

The set is the synthetic OCRBench's held-out split (``benchmark.ocrbench_synth``: fonts and sizes
never seen in training), scored with OCRBench's rule. The float32 answers must equal HF
``generate``'s on the same checkpoint; the accuracy thresholds sit about 0.1 below what the
checkpoint measures on this set (docs/ocr_reader.md), room for another CPU's rounding; two
deliberate errors (images swapped between the requests of a batch; every prompt chunk after a
request's first shifted by one position) must take the accuracy below them.
"""

from __future__ import annotations

import functools

import pytest
import torch
import transformers
from conftest import hf_inputs, load_hf_model

import sglang
from benchmark.ocrbench import CATEGORIES, TEXT_RECOGNITION, is_correct
from benchmark.ocrbench_synth import DATASETS, samples
from benchmark.train_reader import DEFAULT_OUT
from sglang.srt.model_executor.model_runner import ModelRunner
from sglang.srt.multimodal.embedder import MultimodalEmbedder
from sglang.srt.multimodal.hf_processor import load_hf_processor
from sglang_dev.quantized_checkpoints import write_quantized

READER = str(DEFAULT_OUT)
SET_SIZE = 300  # 30 per category: a second or two per engine
CHUNKED_SET = 100  # the first 10 of each category
MAX_TOKENS = 16
GREEDY = {"temperature": 0.0, "max_new_tokens": MAX_TOKENS}
# What the checkpoint must score in float32 on this set, about 0.1 below what it measures
# (docs/ocr_reader.md: 0.753 overall, 0.739 text recognition, 0.933 digit strings).
MIN_ACCURACY = 0.65
MIN_RECOGNITION = 0.64  # the six text-recognition categories
MIN_DIGITS = 0.83
# bfloat16, fp8 KV and the quantized modes: accuracy at most MAX_ACCURACY_DROP below float32's,
# and the same answer as float32 on at least this share of the questions. The shares follow each
# mode's rounding: bfloat16 and int8 weights (2^-8 and 2^-7 of a channel's range) flip a few
# near-tied answers, int8 activations (2^-7 of a row's range) a few more, an fp8 KV cache
# (2^-4) and int4 weights (1/15 of a group's range) more again (measured 0.99, 0.99, 0.98 /
# 0.96, 0.95; AWQ / GPTQ 0.96, W8A8 0.98).
MAX_ACCURACY_DROP = 0.05
MIN_SAME_ANSWERS = {
    "bfloat16": 0.95,
    "int8wo": 0.93,
    "int8dq": 0.93,  # the language model; with the tower too
    "fp8_e4m3": 0.9,
    "int4wo-128": 0.83,
    "8da4w-128": 0.83,  # int4 weights, int8 activations (measured 0.96, int4wo 0.95 beside it)
}
CHUNK = 8  # prompt chunks of 8 tokens cut through most images


@functools.cache
def _set() -> list:
    return samples("training-heldout", SET_SIZE)


@functools.cache
def _tokenizer():
    return transformers.AutoTokenizer.from_pretrained(READER)


def _prompt(question: str) -> str:
    messages = [{"role": "user", "content": [{"type": "image"},
                                             {"type": "text", "text": question}]}]  # fmt: skip
    return _tokenizer().apply_chat_template(messages, add_generation_prompt=True, tokenize=False)


def _read(engine: sglang.Engine, count: int = SET_SIZE) -> list[str]:
    items = _set()[:count]
    outs = engine.generate(
        [_prompt(s.question) for s in items], GREEDY, image_data=[[s.image] for s in items]
    )
    return [o["text"] for o in outs]


def _accuracy(answers: list[str], categories: tuple[str, ...] | None = None) -> float:
    pairs = [(s, a) for s, a in zip(_set(), answers) if s.category in (categories or CATEGORIES)]
    return sum(is_correct(a, s.answer, DATASETS[s.category]) for s, a in pairs) / len(pairs)


@functools.cache
def _answers(count: int = SET_SIZE, **kwargs) -> tuple[str, ...]:
    return tuple(_read(sglang.Engine(model_path=READER, **kwargs), count))


def _float32(**kwargs) -> tuple[str, ...]:
    return _answers(dtype="float32", **kwargs)


@functools.cache
def _hf_answers(count: int) -> list[str]:
    processor = load_hf_processor(READER)
    model = load_hf_model(transformers.AutoModelForImageTextToText, READER, torch.float32)
    answers = []
    for s in _set()[:count]:
        inputs = hf_inputs(processor, _prompt(s.question), [s.image])
        out = model.generate(**inputs, do_sample=False, max_new_tokens=MAX_TOKENS)
        answers.append(processor.decode(out[0, inputs["input_ids"].shape[1] :],
                                        skip_special_tokens=True))  # fmt: skip
    return answers


def test_reader_reads_in_float32() -> None:
    answers = _float32()
    assert _accuracy(answers) >= MIN_ACCURACY
    assert _accuracy(answers, TEXT_RECOGNITION) >= MIN_RECOGNITION
    assert _accuracy(answers, ("Digit String Recognition",)) >= MIN_DIGITS


def test_float32_answers_equal_hf_generate() -> None:
    count = 30
    assert list(_float32()[:count]) == _hf_answers(count)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"mm_cache_mode": "combined"},
        {"mm_cache_mode": "off"},
        {"chunked_prefill_size": CHUNK},
        {"chunked_prefill_size": CHUNK, "mm_cache_mode": "off"},
        {"chunked_prefill_size": 5, "disable_radix_cache": True},
    ],
    ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()),
)
def test_same_answers_in_every_cache_mode_and_chunk_size(kwargs: dict) -> None:
    """Every answer the same bits as the defaults'; the small chunks on the first
    ``CHUNKED_SET`` questions (ten of each category: a prompt runs as a dozen chunks)."""
    count = CHUNKED_SET if "chunked_prefill_size" in kwargs else SET_SIZE
    assert _answers(count, dtype="float32", **kwargs) == _float32()[:count]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"dtype": "bfloat16"},
        {"dtype": "bfloat16", "kv_cache_dtype": "fp8_e4m3"},
        {"dtype": "bfloat16", "torchao_config": "int8wo"},
        {"dtype": "bfloat16", "torchao_config": "int4wo-128"},
        {"dtype": "bfloat16", "torchao_config": "int8dq"},
        {"dtype": "bfloat16", "torchao_config": "int8dq", "vision_int8dq": True},
        {"dtype": "bfloat16", "torchao_config": "8da4w-128", "vision_int8dq": True},
    ],
    ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()),
)
def test_reduced_precision_reads_within_distance_of_float32(kwargs: dict) -> None:
    reference, answers = _float32(), _answers(**kwargs)
    same = sum(a == b for a, b in zip(answers, reference)) / len(reference)
    mode = kwargs.get("torchao_config") or kwargs.get("kv_cache_dtype") or kwargs["dtype"]
    assert same >= MIN_SAME_ANSWERS[mode]
    assert _accuracy(answers) >= _accuracy(reference) - MAX_ACCURACY_DROP


@pytest.mark.parametrize("fmt", ["awq", "gptq", "ct-w8a8"])
def test_published_formats_read_within_distance_of_float32(fmt: str, tmp_path) -> None:
    """The reader written as AWQ / GPTQ (int4, round to nearest, group 128) and as
    compressed-tensors W8A8 checkpoints, served from those: as close to float32 as int4wo and
    int8dq are."""
    folder = write_quantized(READER, tmp_path / fmt, fmt, 128)
    engine = sglang.Engine(model_path=str(folder))
    try:
        answers = _read(engine)
    finally:
        engine.shutdown()
    reference = _float32()
    same = sum(a == b for a, b in zip(answers, reference)) / len(reference)
    assert same >= MIN_SAME_ANSWERS["int8dq" if fmt == "ct-w8a8" else "int4wo-128"]
    assert _accuracy(answers) >= _accuracy(reference) - MAX_ACCURACY_DROP


def test_images_swapped_between_requests_fail_the_threshold(monkeypatch) -> None:
    """Every request's image rows are written where the next request's image goes."""
    original = MultimodalEmbedder._get_chunked_embedding_by_item

    def swap(self, *args):
        chunks = original(self, *args)
        return [(pos, rows) for (pos, _), (_, rows) in zip(chunks, chunks[1:] + chunks[:1])]

    monkeypatch.setattr(MultimodalEmbedder, "_get_chunked_embedding_by_item", swap)
    answers = _read(sglang.Engine(model_path=READER, dtype="float32"))
    assert _accuracy(answers) < MIN_ACCURACY


def test_a_shifted_position_fails_the_threshold(monkeypatch) -> None:
    """Chunks cut through the images, and every prefill chunk after a request's first is one
    position further on than it should be."""
    original = ModelRunner.forward

    def shift_later_chunks(self, batch):
        if not batch.is_decode:
            spans = zip(batch.prefix_lens, batch.extend_lens)
            later = torch.cat([torch.full((n,), int(lo > 0)) for lo, n in spans])
            batch.positions = batch.positions + later
        return original(self, batch)

    monkeypatch.setattr(ModelRunner, "forward", shift_later_chunks)
    engine = sglang.Engine(model_path=READER, dtype="float32", chunked_prefill_size=CHUNK)
    assert _accuracy(_read(engine, CHUNKED_SET)) < MIN_ACCURACY  # measured 0.27


# The training pieces ------------------------------------------------------------------------------
def test_training_prompts_are_what_the_engine_serves() -> None:
    """The training batch's prompt tokens are the served request's, its pixels HF's processor's,
    and only the answer (and its <|im_end|>) carries labels."""
    from benchmark.train_reader import Batcher

    engine = sglang.Engine(model_path=READER, dtype="float32")
    sample = _set()[7]
    batch = Batcher(_tokenizer(), engine.processor.hf_processor.image_processor)([sample])
    (served,), _ = engine.tokenize(_prompt(sample.question), GREEDY, None, [sample.image])
    labelled = batch["labels"][0] != -100
    prompt_len = int((~labelled).sum())
    assert batch["input_ids"][0, :prompt_len].tolist() == served.input_ids
    processor = load_hf_processor(READER).image_processor
    reference = processor(images=[sample.image], return_tensors="pt")
    assert torch.equal(reference["pixel_values"], batch["pixel_values"])
    assert torch.equal(reference["image_grid_thw"], batch["image_grid_thw"])
    answer = _tokenizer()(sample.answer, add_special_tokens=False)["input_ids"]
    end = _tokenizer().convert_tokens_to_ids("<|im_end|>")
    assert batch["labels"][0, labelled].tolist() == answer + [end]


def test_slot_targets_name_each_character_in_its_cell() -> None:
    import random

    from benchmark.ocr_render import CELL, GLYPH_CHARS, render, render_string
    from benchmark.train_reader import SLOTS, Batcher

    rng = random.Random(3)
    for sample in (render_string(rng, 8), render("Key Information Extraction", rng)):
        rows, cols = sample.image.height // CELL, sample.image.width // CELL
        targets = Batcher.slot_targets(sample, rows, cols)
        assert targets.shape == (rows * cols, SLOTS)
        hits: dict[tuple[int, int], list[str]] = {}
        for x, y, char in sample.glyphs:
            token = int(y // CELL) * cols + int(x // CELL)
            hits.setdefault((token, int((x % CELL) * SLOTS // CELL)), []).append(char)
        for token in range(rows * cols):
            for slot in range(SLOTS):
                chars = hits.get((token, slot), [])
                if not chars:
                    assert targets[token, slot] == len(GLYPH_CHARS)  # none
                else:  # two narrow glyphs in one slot: the later one is named
                    assert GLYPH_CHARS[targets[token, slot]] == chars[-1]
    assert rows == 3 and len({int(y // CELL) for _, y, _ in sample.glyphs}) == 3


def test_recorded_glyphs_sit_on_ink_in_reading_order(monkeypatch) -> None:
    """Each recorded glyph centre has ink within 2 px of it in its row of cells (drawn without
    the pixel noise), after the rotation and shear of irregular text and _fit's scaling and
    padding; a line's glyphs run left to right, and a digit string's or a word's spell it."""
    import random

    import numpy as np

    from benchmark import ocr_render
    from benchmark.ocr_render import CATEGORIES, CELL, render

    monkeypatch.setattr(ocr_render, "_noise", lambda img, rng, amount: img)
    rng = random.Random(11)
    for category in CATEGORIES:
        for _ in range(12):
            sample = render(category, rng, "heldout")
            if category == "Handwritten Mathematical Expression Recognition":
                assert sample.glyphs is None
                continue
            rows: dict[int, list[tuple[float, str]]] = {}
            for x, y, char in sample.glyphs:
                rows.setdefault(int(y // CELL), []).append((x, char))
            if category != "Irregular Text Recognition":  # a rotated line spans rows
                for line in rows.values():
                    assert [x for x, _ in line] == sorted(x for x, _ in line)
            if category in ("Digit String Recognition", "Regular Text Recognition"):
                assert "".join(c for x, c in rows[0]) == sample.answer.replace(" ", "")
            pixels = np.asarray(sample.image, dtype=np.int32)
            ink = np.abs(pixels - pixels[0, 0]).sum(-1) > 120
            for x, y, char in sample.glyphs:
                row = int(y // CELL)
                strip = ink[row * CELL : (row + 1) * CELL, max(0, int(x) - 2) : int(x) + 3]
                assert strip.any(), (category, char, x, y)


@pytest.mark.parametrize("angle,shear", [(0.0, 0.0), (11.0, 0.0), (-9.5, 0.25), (7.0, -0.3)])
def test_skewed_glyph_positions_follow_the_pixels(angle: float, shear: float) -> None:
    """A dark dot's recorded position lands on the centroid of the dot in the turned and sheared
    image (the reference: the pixels themselves)."""
    import numpy as np
    from PIL import Image, ImageDraw

    from benchmark.ocr_render import _skew

    img = Image.new("RGB", (90, 28), (250, 250, 250))
    ImageDraw.Draw(img).rectangle((20, 8, 24, 12), fill=(0, 0, 0))  # centre (22.5, 10.5)
    skewed, [(x, y, _)] = _skew(img, [(22.5, 10.5, "o")], angle, shear)
    dark = 250 - np.asarray(skewed.convert("L"), dtype=np.float64)
    rows, cols = np.indices(dark.shape)
    centroid = ((cols * dark).sum() / dark.sum() + 0.5, (rows * dark).sum() / dark.sum() + 0.5)
    assert abs(x - centroid[0]) < 0.6 and abs(y - centroid[1]) < 0.6, ((x, y), centroid)


def test_heldout_split_uses_other_fonts_and_sizes() -> None:
    import random

    from benchmark.ocr_render import _pick_font, fonts

    assert fonts("train") and fonts("heldout")
    assert not set(fonts("train")) & set(fonts("heldout"))
    rng = random.Random(0)
    assert {_pick_font(rng, "train").size % 2 for _ in range(50)} == {0}
    assert {_pick_font(rng, "heldout").size % 2 for _ in range(50)} == {1}


def test_training_paths_compute_hfs_loss_and_gradients() -> None:
    """The tower's grouped attention and matmul patch embedding, and the eager language-model
    attention, that training runs on: the same loss and gradients as HF's own paths (float32),
    on a batch of images of different sizes; an image attending across its neighbour would not
    be."""
    from transformers import Qwen2VLForConditionalGeneration

    from benchmark.train_reader import Batcher, draw_samples, install_training_paths

    config = transformers.AutoConfig.from_pretrained(READER)
    batch = Batcher(_tokenizer(), load_hf_processor(READER).image_processor)(
        draw_samples(3, 6, "train")
    )
    batch.pop("slot_targets")
    results = []
    for implementation, patched in (("sdpa", False), ("eager", True)):
        with torch.random.fork_rng():
            torch.manual_seed(0)
            model = Qwen2VLForConditionalGeneration._from_config(
                config, attn_implementation=implementation
            ).float()
        if patched:
            install_training_paths(model)
        loss = model(**batch).loss
        loss.backward()
        results.append((loss.detach(), [p.grad for p in model.parameters()]))
    (want, want_grads), (got, got_grads) = results
    assert len(set(batch["image_grid_thw"][:, 2].tolist())) > 1  # images of several widths
    patches = batch["image_grid_thw"].prod(-1).tolist()
    assert len({(max(16, n) - 1).bit_length() for n in patches}) > 1  # in several length groups
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    # float32 sums in another order: a gradient entry far below its tensor's largest differs by
    # up to ~1e-5 of that largest (seen: 1.1e-8 at a max of 7.6e-3); a wrong path is off by O(1)
    for g, w in zip(got_grads, want_grads):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5 * float(w.abs().max()) + 1e-9)


def test_training_run_writes_a_servable_checkpoint(tmp_path) -> None:
    from benchmark.train_reader import main

    report = main(["--out", str(tmp_path), "--steps", "3", "--batch-size", "4",
                   "--eval-every", "1", "--curriculum-steps", "2", "--no-compile"])  # fmt: skip
    assert [h["step"] for h in report["history"]] == [0, 1, 2]
    assert report["history"][-1]["heldout_tokens"] > report["history"][0]["heldout_tokens"]
    engine = sglang.Engine(model_path=str(tmp_path), dtype="float32")
    sample = _set()[0]
    out = engine.generate(_prompt(sample.question), GREEDY, image_data=[sample.image])
    assert out["meta_info"]["completion_tokens"] >= 1
