"""Ask the embedded OCR reader what an image says, twice, and show the per-image cache at work.

The demo draws a line of text in the style the reader trained on (DejaVu Sans, whole 28-px
cells), writes it to ``--out`` (the README's first request sends that file) and asks the engine
what is written; then asks again. The engine runs without its prefix cache (as when a prompt's KV
was evicted, or a conversation differs before the image), so the second prompt is prefilled in
full, and its image's embedding comes from the per-image cache instead of the vision encoder.

python scripts/demo.py [--text TEXT] [--out PATH] [--model-path DIR] [--chunked-prefill-size N]
"""

from __future__ import annotations

import argparse
import time

from PIL import Image, ImageDraw, ImageFont

import sglang

QWEN_IMAGE = "<|vision_start|><|image_pad|><|vision_end|>"
CELL = 28  # the pixels of one image token: 14-px patches merged 2 x 2
DEMO_TEXT = "green apple"  # read with a wide margin: the smallest top-2 logprob gap 4.4
QUESTION = "what is written in the image?"


def draw_text(text: str, size: int = 22) -> Image.Image:
    """``text`` in dark blue on an off-white line, drawn the way the reader learnt to read:
    DejaVu Sans (Debian's fonts-dejavu-core) at about 20 px, the canvas in whole 28-px cells
    (one image token each), the text centred in one row of them."""
    try:
        font = ImageFont.truetype("DejaVuSans.ttf", size)
    except OSError:
        print("DejaVu Sans not found (apt-get install fonts-dejavu-core): Pillow's own font, "
              "which the reader never saw, may be misread")  # fmt: skip
        font = ImageFont.load_default(size=size)
    left, top, right, bottom = font.getbbox(text)
    width, height = max(2 * CELL, _cells(right - left + 16)), _cells(bottom - top + 2)
    img = Image.new("RGB", (width, height), (246, 243, 232))
    origin = ((width - (right - left)) // 2 - left, (height - (bottom - top)) // 2 - top)
    ImageDraw.Draw(img).text(origin, text, font=font, fill=(20, 20, 80))
    return img


def _cells(pixels: int) -> int:
    return max(1, -(-pixels // CELL)) * CELL


def chat_prompt(question: str) -> str:
    """The reader's chat template (Qwen's) for one user turn, the image before the question."""
    return f"<|im_start|>user\n{QWEN_IMAGE}{question}<|im_end|>\n<|im_start|>assistant\n"


def ask_twice(engine: sglang.Engine, image: str | Image.Image) -> list[dict]:
    """The question twice, each time with the answer, the per-image cache's counters after it,
    the prompt tokens the prefix cache served and the seconds taken."""
    params = {"temperature": 0, "max_new_tokens": 16}
    turns = []
    for _ in range(2):
        start = time.perf_counter()
        out = engine.generate(chat_prompt(QUESTION), params, image_data=image)
        cache = engine.get_server_info()["mm_embedding_cache"]
        turns.append({"text": out["text"], "cache": cache,
                      "cached_tokens": out["meta_info"]["cached_tokens"],
                      "seconds": time.perf_counter() - start})  # fmt: skip
    return turns


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--text", default=DEMO_TEXT)
    parser.add_argument("--out", default="demo.png", help="where the drawn image is written")
    parser.add_argument("--model-path", default=None, help="default: the embedded OCR reader")
    parser.add_argument("--chunked-prefill-size", type=int, default=None)
    args = parser.parse_args()
    image = draw_text(args.text)
    image.save(args.out)
    print(f"drew {args.text!r} into {args.out} ({image.width} x {image.height})")
    model = args.model_path or "the embedded OCR reader"
    print(f"loading {model}; a first run also builds the native CPU kernels (logged below)")
    with sglang.Engine(
        model_path=args.model_path,
        chunked_prefill_size=args.chunked_prefill_size,
        disable_radix_cache=True,
    ) as engine:
        for turn, result in enumerate(ask_twice(engine, args.out), start=1):
            cache = result["cache"]
            print(
                f"request {turn}: {QUESTION!r} -> {result['text']!r} in "
                f"{result['seconds']:.2f} s; image embeddings computed so far {cache['misses']}, "
                f"served from the per-image cache {cache['hits']}"
            )
        print("mm_embedding_cache:", cache)


if __name__ == "__main__":
    main()
