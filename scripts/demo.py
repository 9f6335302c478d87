"""Generate once on the embedded tiny Qwen2.5-VL model (built locally on first use).

python scripts/demo.py [--model-path DIR] [--image PATH] [--chunked-prefill-size N]
"""

from __future__ import annotations

import argparse
import json

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
    with sglang.Engine(
        model_path=args.model_path, chunked_prefill_size=args.chunked_prefill_size
    ) as engine:
        params = {"temperature": 0, "max_new_tokens": args.max_new_tokens}
        for turn in range(2):
            out = engine.generate(args.prompt, params, image_data=image)
            print(f"turn {turn}:", json.dumps(out))
        print("mm_embedding_cache:", engine.get_server_info()["mm_embedding_cache"])


if __name__ == "__main__":
    main()
