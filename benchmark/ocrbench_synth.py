"""Write a small synthetic OCR set in OCRBench's format: text rendered into images with Pillow.

Each entry's answer is the rendered text; entries cycle through OCRBench's 10 categories (the
handwritten-math one is marked ``dataset_name: HME100k`` so that its scoring rule applies).
Some texts are a single character, so even a weak model scores above zero.

    python -m benchmark.ocrbench_synth --out /tmp/ocr-synth --count 40
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from PIL import Image, ImageDraw, ImageFont

from benchmark.ocrbench import CATEGORIES, HME_DATASET

WORDS = "the cat red house sun tree blue cup book river hello world paris seven day".split()
QUESTIONS = {
    "Scene Text-centric VQA": "What is written on the sign?",
    "Doc-oriented VQA": "What is the title of this document?",
    "Key Information Extraction": "What is the value in the image?",
    "Handwritten Mathematical Expression Recognition": "Write out the expression in the image.",
}
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


def _text(rng: random.Random, category: str) -> str:
    if rng.random() < 0.25:  # single characters: substrings of most outputs
        return rng.choice("aeiost")
    if category == "Digit String Recognition":
        return "".join(rng.choice("0123456789") for _ in range(rng.randint(2, 6)))
    if category == "Non-Semantic Text Recognition":
        return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(5))
    if category == "Handwritten Mathematical Expression Recognition":
        return f"{rng.randint(1, 9)} + {rng.choice('xyz')} ^ {{ {rng.randint(2, 4)} }}"
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 3)))


def generate(out_dir: str | Path, count: int = 40, seed: int = 0) -> Path:
    out = Path(out_dir)
    (out / "images").mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    font = ImageFont.load_default()
    entries = []
    for i in range(count):
        category = CATEGORIES[i % len(CATEGORIES)]
        text = _text(rng, category)
        w, h = rng.choice([(160, 64), (224, 96), (320, 120)])
        img = Image.new("RGB", (w, h), tuple(rng.randint(200, 255) for _ in range(3)))
        ImageDraw.Draw(img).text((8, h // 3), text, fill=(0, 0, 0), font=font)
        name = f"images/{i:04d}.png"
        img.save(out / name)
        entries.append(
            {
                "dataset_name": DATASETS[category],
                "id": i,
                "image_path": name,
                "question": QUESTIONS.get(category, "what is written in the image?"),
                "answers": [text],
                "type": category,
            }
        )
    (out / "OCRBench.json").write_text(json.dumps(entries, indent=1) + "\n")
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--count", type=int, default=40)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    print(generate(args.out, args.count, args.seed))


if __name__ == "__main__":
    main()
