"""Write a synthetic OCR set in OCRBench's format: text rendered into images with Pillow.

The entries come from ``benchmark.ocr_render``'s held-out split (fonts and sizes the reader never
saw in training, and seeds other than its training seeds), in equal shares of OCRBench's 10
categories, with OCRBench's questions and scoring (the handwritten-math entries are marked
``dataset_name: HME100k`` so that its rule applies). A few dozen entries make the tests' set, a
thousand the benchmark's.

    python -m benchmark.ocrbench_synth --out /tmp/ocr-synth --count 1000
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from benchmark.ocr_render import CATEGORIES, Sample, render
from benchmark.ocrbench import HME_DATASET

DATASETS = {
    "Regular Text Recognition": "IIIT5K",
    "Irregular Text Recognition": "ICDAR2015",
    "Artistic Text Recognition": "WordArt",
    "Handwriting Recognition": "IAM",
    "Digit String Recognition": "ORAND",
    "Non-Semantic Text Recognition": "NonSemanticText",
    "Scene Text-centric VQA": "textVQA",
    "Doc-oriented VQA": "docVQA",
    "Key Information Extraction": "SROIE",
    "Handwritten Mathematical Expression Recognition": HME_DATASET,
}
HELDOUT_SEED = 7_000_001  # far from the training seeds (0 .. steps, times 1,000,003)


def samples(count: int, seed: int = HELDOUT_SEED) -> list[Sample]:
    """``count`` held-out samples, the categories in turn."""
    rng = random.Random(seed)
    return [render(CATEGORIES[i % len(CATEGORIES)], rng, "heldout") for i in range(count)]


def entry(i: int, sample: Sample, image_path: str) -> dict:
    return {
        "dataset_name": DATASETS[sample.category],
        "id": i,
        "image_path": image_path,
        "question": sample.question,
        "answers": [sample.answer],
        "type": sample.category,
    }


def generate(out_dir: str | Path, count: int = 40, seed: int = HELDOUT_SEED) -> Path:
    out = Path(out_dir)
    (out / "images").mkdir(parents=True, exist_ok=True)
    entries = []
    for i, sample in enumerate(samples(count, seed)):
        name = f"images/{i:04d}.png"
        sample.image.save(out / name)
        entries.append(entry(i, sample, name))
    (out / "OCRBench.json").write_text(json.dumps(entries, indent=1) + "\n")
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--count", type=int, default=40)
    p.add_argument("--seed", type=int, default=HELDOUT_SEED)
    args = p.parse_args(argv)
    print(generate(args.out, args.count, args.seed))


if __name__ == "__main__":
    main()
