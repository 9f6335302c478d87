"""Embedding a corpus of images with two instructions (a query's and a document's), on the
offline Engine, with the per-image embedding cache on and off.

Each image is embedded twice, once after each instruction (``<instruction>\\n<image>``: the
instruction comes first, so the prefix cache cannot cover the image and only the embedding
cache can spare its second encode). Per mode: images per second (embeddings of the two passes
over the wall time), the vision tower's encodes per image, and the encoder's seconds.

    python -m benchmark.embed_corpus --quick
    python -m benchmark.embed_corpus --images 32 --resolution 448x448
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

from tqdm import tqdm

from benchmark.lib.hardware import cpu_info, cpu_line
from benchmark.lib.images import make_jpeg, parse_resolution
from benchmark.lib.report import markdown_table, pyplot, write_results

IMAGE = "<|vision_start|><|image_pad|><|vision_end|>"  # Qwen2-VL's placeholder
INSTRUCTIONS = {
    "query": "Find a picture that matches this one.",
    "document": "Represent this picture for retrieval.",
}
PRESETS = {"quick": {"images": 8, "resolution": "224x224"},
           "full": {"images": 32, "resolution": "448x448"}}  # fmt: skip
MODES = {"on": "per-image", "off": "off"}


def default_model() -> str:
    """The small Qwen2-VL (text 256 x 4, vision depth 4 x 384) as a GME-style embedding model."""
    from sglang_dev.tiny_models.retrieval import build_tiny_embedding_model

    out = Path(tempfile.gettempdir()) / "sglang-embed-corpus-qwen2_vl"
    return str(build_tiny_embedding_model("qwen2_vl", out, size="small"))


def run_mode(model_path: str, mode: str, images: list[bytes], chunk: int, bar: tqdm) -> dict:
    import sglang

    engine = sglang.Engine(
        model_path=model_path, mm_cache_mode=MODES[mode], chunked_prefill_size=chunk,
        is_embedding=True, log_level="warning",
    )  # fmt: skip
    engine.encode(f"warm up\n{IMAGE}", image_data=make_jpeg(10_000, 64, 64))
    before = engine.get_server_info()["mm_embedding_cache"]
    started = time.perf_counter()
    for instruction in INSTRUCTIONS.values():
        for image in images:
            engine.encode(f"{instruction}\n{IMAGE}", image_data=image)
            bar.update(1)
    seconds = time.perf_counter() - started
    after = engine.get_server_info()["mm_embedding_cache"]
    engine.shutdown()
    encodes = after["encoded_items"] - before["encoded_items"]
    return {
        "cache": mode,
        "images": len(images),
        "embeddings": len(images) * len(INSTRUCTIONS),
        "wall_s": seconds,
        "images_per_s": len(images) * len(INSTRUCTIONS) / seconds,
        "encodes_per_image": encodes / len(images),
        "encoder_s": after["encoder_seconds"] - before["encoder_seconds"],
        "cache_hits": after["hits"] - before["hits"],
    }


def markdown(result: dict[str, Any]) -> str:
    head = ["cache", "images", "embeddings", "images/s", "encodes per image", "encoder s",
            "wall s"]  # fmt: skip
    rows = [[r["cache"], r["images"], r["embeddings"], r["images_per_s"], r["encodes_per_image"],
             r["encoder_s"], r["wall_s"]] for r in result["modes"]]  # fmt: skip
    config = result["config"]
    return (
        f"{result['cpu_line']}\n\n{config['images']} images at {config['resolution']}, "
        f"two instructions each\n\n{markdown_table(head, rows)}\n"
    )


def plot(result: dict[str, Any], png: Path) -> None:
    plt = pyplot()
    modes = result["modes"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(8, 3.2))
    names = [f"cache {r['cache']}" for r in modes]
    left.bar(names, [r["images_per_s"] for r in modes], color=["tab:green", "tab:gray"])
    left.set_ylabel("images per second")
    right.bar(names, [r["encodes_per_image"] for r in modes], color=["tab:green", "tab:gray"])
    right.set_ylabel("encodes per image")
    fig.suptitle(f"embed_corpus: {result['config']['images']} images x 2 instructions")
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model-path", default=None, help="an embedding checkpoint (Qwen2-VL family)")
    p.add_argument("--quick", action="store_true", help="the quick preset")
    p.add_argument("--images", type=int, default=None)
    p.add_argument("--resolution", default=None, help="WIDTHxHEIGHT")
    p.add_argument("--chunk", type=int, default=512, help="--chunked-prefill-size")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    name = "quick" if args.quick else "full"
    preset = PRESETS[name]
    count = args.images or preset["images"]
    resolution = args.resolution or preset["resolution"]
    width, height = parse_resolution(resolution)
    model_path = args.model_path or default_model()
    cpu = cpu_info()
    corpus = [make_jpeg(i, width, height) for i in range(count)]
    started = time.perf_counter()
    with tqdm(total=len(MODES) * count * len(INSTRUCTIONS), desc="embed_corpus") as bar:
        modes = [run_mode(model_path, mode, corpus, args.chunk, bar) for mode in MODES]
    result = {
        "benchmark": "embed_corpus",
        "cpu": cpu,
        "cpu_line": cpu_line(cpu),
        "config": {"images": count, "resolution": resolution, "chunk": args.chunk,
                   "instructions": INSTRUCTIONS, "model_path": model_path},
        "modes": modes,
        "wall_s": time.perf_counter() - started,
    }  # fmt: skip
    out = Path(args.out or f"results/embed_corpus_{name}")
    write_results(out, result, markdown(result), lambda png: plot(result, png))
    return result


if __name__ == "__main__":
    main()
