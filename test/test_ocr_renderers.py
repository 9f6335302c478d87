"""The second OCR renderer, which draws the sets that measure reading, shares no fonts, drawing
code or question wordings (OCRBench's own aside) with the training renderer, and draws what it
promises: canvases on no 28-px grid, some text light on dark, the kinds of answer of each set,
the same set from the same seed."""

from __future__ import annotations

import ast
import random
from pathlib import Path

import numpy as np

from benchmark import ocr_render, ocr_unseen
from benchmark.ocr_render import CATEGORIES, CELL, render

BENCHMARK = Path(__file__).resolve().parents[1] / "benchmark"
OCRBENCH_FORMULA_QUESTION = (  # HME100k's wording in OCRBench
    "Please write out the expression of the formula in the image using LaTeX format."
)


def _imports(module: str) -> set[str]:
    tree = ast.parse((BENCHMARK / f"{module}.py").read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            names |= {f"{node.module}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
    return names


def test_the_second_renderer_shares_no_fonts_or_drawing_code() -> None:
    """Its faces are none of the training renderer's (both splits), and it takes only the
    ``Sample`` record and the category names from the training side."""
    unseen = {Path(p).name for p in ocr_unseen.fonts()}
    trained = {Path(p).name for split in ocr_render.SPLITS for p in ocr_render.fonts(split)}
    assert len(unseen) >= 30 and not unseen & trained
    benchmark_imports = {n for n in _imports("ocr_unseen") if n.startswith("benchmark")}
    assert benchmark_imports == {"benchmark.ocr_render.Sample", "benchmark.ocrbench.CATEGORIES"}


def test_the_second_renderer_asks_in_other_words() -> None:
    """Of the training renderer's questions (every category, both splits) the second renderer
    asks only OCRBench's own wordings: its text recognition's and its formulas'."""
    rng = random.Random(0)
    trained = {render(c, rng, split).question for c in CATEGORIES for split in ocr_render.SPLITS
               for _ in range(8)}  # fmt: skip
    rng = random.Random(1)
    unseen = {ocr_unseen.sample(kind, rng).question for kind in ("words", "digits", *CATEGORIES)
              for _ in range(20)}  # fmt: skip
    assert unseen & trained == {ocr_render.RECOGNITION_QUESTION, OCRBENCH_FORMULA_QUESTION}
    assert len(unseen) >= 12


def test_the_second_renderers_sets() -> None:
    """Sizes on no grid, text answers of the kinds promised, the same set from the same seed."""
    words, digits = ocr_unseen.samples("words", 60, 1), ocr_unseen.samples("digits", 60, 1)
    assert all(s.answer.isalpha() and 2 <= len(s.answer) <= 10 for s in words)
    assert all(s.answer.isdigit() and 1 <= len(s.answer) <= 10 for s in digits)
    assert {len(s.answer) for s in digits} >= {1, 5, 10}
    sizes = [s.image.size for s in words + digits]
    assert sum(w % CELL != 0 or h % CELL != 0 for w, h in sizes) > 100
    light_on_dark = sum(np.asarray(s.image.convert("L")).mean() < 110 for s in words)
    assert 5 <= light_on_dark <= 30
    mix = ocr_unseen.samples("mix", 20, 2)
    assert [s.category for s in mix] == list(CATEGORIES) * 2
    again = ocr_unseen.samples("mix", 20, 2)
    assert [s.answer for s in again] == [s.answer for s in mix]
    assert all(np.array_equal(np.asarray(a.image), np.asarray(b.image)) for a, b in zip(again, mix))
