"""Show what the embedding cache does, per mode, on the embedded tiny model.

Scenario A: one request with 6 images under a chunk size of ~1 image.
Scenario B: a 4-turn chat that adds one image per turn.
Prints the encoder counters of each mode side by side.

    python scripts/vit_cache_demo.py [--model-path DIR]
"""

from __future__ import annotations

import argparse

import numpy as np
from PIL import Image

import sglang

PH = "<|vision_start|><|image_pad|><|vision_end|>"
GREEDY = {"temperature": 0, "max_new_tokens": 8}
KEYS = (
    "encoded_items",
    "encoder_calls",
    "max_encoder_call_tokens",
    "hits",
    "misses",
    "evictions",
    "preprocess_skipped",
)


def image(seed: int) -> Image.Image:
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (64, 64, 3), np.uint8))


def multi_image(engine: sglang.Engine) -> list[int]:
    prompt = "Compare:" + " then ".join(PH for _ in range(6))
    return engine.generate(prompt, GREEDY, image_data=[image(i) for i in range(6)])["output_ids"]


def multiturn(engine: sglang.Engine) -> list[int]:
    prompt, images = "Describe: " + PH, [image(100)]
    for turn in range(4):
        out = engine.generate(prompt, GREEDY, image_data=images)
        prompt += out["text"] + " Next image: " + PH
        images.append(image(101 + turn))
    return out["output_ids"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-path", default=None)
    args = parser.parse_args()
    rows = []
    for scenario in (multi_image, multiturn):
        for mode in ("per-image", "combined", "off"):
            engine = sglang.Engine(
                model_path=args.model_path,
                dtype="float32",  # the exact mode: outputs compare across cache modes
                mm_cache_mode=mode,
                chunked_prefill_size=24,
                mm_embedding_cache_mb=1,
            )
            ids = scenario(engine)
            info = engine.get_server_info()["mm_embedding_cache"]
            rows.append((scenario.__name__, mode, ids, [info[k] for k in KEYS]))
    print(f"| scenario | mode | {' | '.join(KEYS)} |")
    for name, mode, _, values in rows:
        print(f"| {name} | {mode} | {' | '.join(str(v) for v in values)} |")
    for name in ("multi_image", "multiturn"):
        outputs = {tuple(ids) for n, _, ids, _ in rows if n == name}
        print(f"{name}: outputs identical across modes: {len(outputs) == 1}")


if __name__ == "__main__":
    main()
