"""Write a synthetic OCR set in OCRBench's format: text rendered into images with Pillow.

- ``training-heldout`` (the default): the training renderer's held-out split (``benchmark.
  ocr_render``: three faces it never trains on, odd sizes), in OCRBench's ten categories;
- from the second renderer (``benchmark.ocr_unseen``: other drawing code, fonts, layouts and
  question wordings than the training renderer's): ``words``, made-up words, one per image;
  ``digits``, digit strings of 1-10 digits; ``mix``, OCRBench's ten categories in equal shares.

The handwritten-math entries are marked ``dataset_name: HME100k`` so that its rule applies. Each
set has its own seed, far from the training seeds; ``--seed`` draws another sample of a set.

    python -m benchmark.ocrbench_synth --count 1000 --out /tmp/ocr-heldout
    python -m benchmark.ocrbench_synth --set mix --count 1000 --out /tmp/ocr-mix
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from benchmark import ocr_unseen
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
# Far from the training seeds (0 .. steps, times 1,000,003) and from each other.
SEEDS = {"training-heldout": 7_000_001, "words": 8_100_001, "digits": 8_200_001, "mix": 8_300_001}
SETS = tuple(SEEDS)


def samples(name: str, count: int, seed: int | None = None) -> list[Sample]:
    """``count`` samples of set ``name`` (``SETS``), from its own seed unless ``seed`` is given."""
    if name not in SEEDS:
        raise ValueError(f"set must be one of {SETS}, got {name!r}")
    seed = SEEDS[name] if seed is None else seed
    if name != "training-heldout":
        return ocr_unseen.samples(name, count, seed)
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


def generate(
    out_dir: str | Path,
    name: str = "training-heldout",
    count: int = 40,
    seed: int | None = None,
) -> Path:
    out = Path(out_dir)
    (out / "images").mkdir(parents=True, exist_ok=True)
    entries = []
    for i, sample in enumerate(samples(name, count, seed)):
        path = f"images/{i:04d}.png"
        sample.image.save(out / path)
        entries.append(entry(i, sample, path))
    (out / "OCRBench.json").write_text(json.dumps(entries, indent=1) + "\n")
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--set", dest="name", choices=SETS, default="training-heldout")
    p.add_argument("--count", type=int, default=40)
    p.add_argument("--seed", type=int, default=None, help="another sample (default: the set's)")
    args = p.parse_args(argv)
    print(generate(args.out, args.name, args.count, args.seed))


if __name__ == "__main__":
    main()
