"""Generate twice on one image with the embedded tiny Qwen2.5-VL model (built locally on first use),
and show that the second turn takes the image's embedding from the per-image cache.

python scripts/demo.py [--model-path DIR] [--image PATH] [--chunked-prefill-size N]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from PIL import Image

import sglang

QWEN_IMAGE = "<|vision_start|><|image_pad|><|vision_end|>"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-path", default=None)
    parser.add_argument("--image", default=None, help="image file (default: a random image)")
    parser.add_argument("--prompt", default=f"Describe this image: {QWEN_IMAGE}")
    parser.add_argument("--chunked-prefill-size", type=int, default=None)
    parser.add_argument("--max-new-tokens", type=int, default=16)
    args = parser.parse_args()
    image = args.image or Image.fromarray(
        np.random.default_rng(0).integers(0, 256, (96, 128, 3), dtype=np.uint8)
    )
    model = args.model_path or "the embedded tiny Qwen2.5-VL (random weights: its text is noise)"
    print(f"loading {model}; a first run also builds the native CPU kernels (logged below)")
    with sglang.Engine(
        model_path=args.model_path, chunked_prefill_size=args.chunked_prefill_size
    ) as engine:
        params = {"temperature": 0, "max_new_tokens": args.max_new_tokens}
        # The second prompt differs before the image, so the prefix cache cannot cover the image
        # and its embedding comes from the per-image cache instead of the encoder.
        for turn, prompt in enumerate((args.prompt, "Once more. " + args.prompt), start=1):
            start = time.perf_counter()
            out = engine.generate(prompt, params, image_data=image)
            cache = engine.get_server_info()["mm_embedding_cache"]
            print(
                f"turn {turn}: {time.perf_counter() - start:.2f} s, "
                f"{out['meta_info']['prompt_tokens']} prompt tokens, "
                f"{out['meta_info']['cached_tokens']} from the prefix cache; "
                f"image embeddings computed so far {cache['misses']}, "
                f"served from the cache {cache['hits']}"
            )
            print(f"  text: {out['text']!r}")
        print("mm_embedding_cache:", cache)


if __name__ == "__main__":
    main()
