"""ViT work per prefill chunk: one request with many images under a small chunked-prefill size.

Runs the offline ``sglang.Engine`` (per-chunk granularity needs it) once per cache mode and
records, for every prefill chunk, the encoder calls, items, tokens and milliseconds spent in it.
The request is sent twice: cold, then again with the embedding cache warm (the radix cache is off
unless --radix, so the second pass re-runs every chunk and shows what the embedding cache saves).

    python -m benchmark.vit_per_chunk --quick
    python -m benchmark.vit_per_chunk --images 8 --resolution 640x480 --chunk 512
    python -m benchmark.vit_per_chunk --quick --family internvl   # tiles + thumbnail
    python -m benchmark.vit_per_chunk --quick --family mistral3   # rows broken by [IMG_BREAK]

``--family`` picks the embedded tiny model of that family (Qwen families: the "small" size) and
its image placeholder; InternVL and Mistral3 images are several placeholder runs each, still one
embedding-cache entry per image.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from tqdm import tqdm

from benchmark.lib.client import CACHE_MODES
from benchmark.lib.images import make_jpeg, parse_resolution
from benchmark.lib.report import markdown_table, pyplot, write_json
from sglang_dev.tiny_models import (
    DEFAULT_FAMILY,
    IMAGE_PLACEHOLDER,
    SMALL_FAMILIES,
    VLM_FAMILIES,
    tiny_model_path,
)

PRESETS: dict[str, dict[str, Any]] = {
    "quick": {"images": 6, "resolution": "448x448", "chunk": 256, "size": "small"},
    "full": {"images": 12, "resolution": "1280x720", "chunk": 1024, "size": "small"},
}
# Families with tiny towers only: a chunk size that cuts through their (short) image spans.
FAMILY_CHUNKS = {"internvl": 16, "mistral3": 16}


class ChunkRecorder:
    """Wraps the engine's forward and encoder calls; groups encoder work by prefill chunk."""

    def __init__(self, engine: Any) -> None:
        self.chunks: list[dict[str, Any]] = []
        self._pending: list[tuple[int, int, float]] = []  # (items, tokens, seconds)
        runner, embedder = engine.runner, engine.runner.embedder
        forward, encode_batch = runner.forward, embedder._encode_batch

        def record_encode(items: list) -> Any:
            start = time.perf_counter()
            out = encode_batch(items)
            tokens = sum(item.num_tokens for item in items)
            self._pending.append((len(items), tokens, time.perf_counter() - start))
            return out

        def record_forward(batch: Any) -> Any:
            start = time.perf_counter()
            out = forward(batch)
            if not batch.is_decode:
                spans = [(p, p + e) for p, e in zip(batch.prefix_lens, batch.extend_lens)]
                self.chunks.append(
                    {
                        "chunk": len(self.chunks),
                        "tokens": [list(s) for s in spans],
                        "encoder_calls": len(self._pending),
                        "encoded_items": sum(c[0] for c in self._pending),
                        "encoded_tokens": sum(c[1] for c in self._pending),
                        "encoder_ms": sum(c[2] for c in self._pending) * 1e3,
                        "forward_ms": (time.perf_counter() - start) * 1e3,
                    }
                )
            self._pending = []
            return out

        runner.forward = record_forward
        embedder._encode_batch = record_encode

    def take(self) -> list[dict[str, Any]]:
        chunks, self.chunks = self.chunks, []
        return chunks


def run_mode(
    model_path: str,
    mode: str,
    images: list[bytes],
    chunk: int,
    progress: tqdm,
    radix: bool,
    placeholder: str,
) -> dict[str, Any]:
    import sglang

    engine = sglang.Engine(
        model_path=model_path,
        mm_cache_mode=mode,
        chunked_prefill_size=chunk,
        disable_radix_cache=not radix,
    )
    recorder = ChunkRecorder(engine)
    prompt = (
        "Compare these pictures: " + " then ".join(f"picture {placeholder}" for _ in images) + "."
    )
    passes = []
    for label in ("cold", "warm"):
        start = time.perf_counter()
        out = engine.generate(
            prompt, {"temperature": 0, "max_new_tokens": 1}, image_data=list(images)
        )
        wall = time.perf_counter() - start
        chunks = recorder.take()
        passes.append(
            {
                "pass": label,
                "prompt_tokens": out["meta_info"]["prompt_tokens"],
                "cached_tokens": out["meta_info"]["cached_tokens"],
                "wall_ms": wall * 1e3,
                "max_items_per_chunk": max((c["encoded_items"] for c in chunks), default=0),
                "chunks": chunks,
            }
        )
        progress.update(1)
    info = engine.get_server_info()["mm_embedding_cache"]
    engine.shutdown()
    return {"mode": mode, "passes": passes, "server_info": info}


def summary_table(results: list[dict[str, Any]]) -> str:
    rows = []
    for res in results:
        cold, warm = res["passes"][0], res["passes"][-1]
        enc = [c["encoder_ms"] for c in cold["chunks"]]
        rows.append([
            res["mode"], len(cold["chunks"]), sum(c["encoded_items"] for c in cold["chunks"]),
            cold["max_items_per_chunk"], max(enc, default=0.0), sum(enc), cold["wall_ms"],
            sum(c["encoded_items"] for c in warm["chunks"]), warm["wall_ms"],
        ])  # fmt: skip
    head = ["mode", "chunks", "items encoded (cold)", "max items in one chunk",
            "max enc ms in one chunk", "enc ms total", "cold request ms",
            "items encoded (warm)", "warm request ms"]  # fmt: skip
    return markdown_table(head, rows)


def markdown(results: list[dict[str, Any]]) -> str:
    parts = [summary_table(results)]
    for res in results:
        for p in res["passes"]:
            rows = [
                [c["chunk"], f"{c['tokens'][0][0]}-{c['tokens'][0][1]}", c["encoder_calls"],
                 c["encoded_items"], c["encoded_tokens"], c["encoder_ms"], c["forward_ms"]]
                for c in p["chunks"]
            ]  # fmt: skip
            head = ["chunk", "tokens", "enc calls", "items", "enc tokens", "enc ms", "forward ms"]
            parts.append(
                f"### {res['mode']} ({p['pass']}, {p['wall_ms']:.0f} ms)\n\n"
                + markdown_table(head, rows)
            )
    return "\n\n".join(parts) + "\n"


def plot(results: list[dict[str, Any]], path: Path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.2))
    width = 0.8 / max(1, len(results))
    for i, res in enumerate(results):
        chunks = res["passes"][0]["chunks"]
        xs = [c["chunk"] + i * width for c in chunks]
        ax.bar(xs, [c["encoder_ms"] for c in chunks], width=width, label=res["mode"])
    ax.set_xlabel("prefill chunk (cold request)")
    ax.set_ylabel("encoder ms in chunk")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path, dpi=70)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", choices=PRESETS, default="full")
    p.add_argument("--quick", action="store_true", help="same as --preset quick")
    p.add_argument("--images", type=int)
    p.add_argument("--resolution")
    p.add_argument("--chunk", type=int, help="chunked prefill size")
    p.add_argument("--model-path")
    p.add_argument("--family", default=DEFAULT_FAMILY, choices=VLM_FAMILIES)
    p.add_argument("--model-size", choices=("tiny", "small"))
    p.add_argument("--modes", default=",".join(CACHE_MODES))
    p.add_argument("--radix", action="store_true", help="keep the radix (prefix) cache on")
    p.add_argument("--out", help="default: results/vit_per_chunk[_FAMILY]")
    args = p.parse_args(argv)
    preset = PRESETS["quick" if args.quick else args.preset]
    n = args.images or preset["images"]
    w, h = parse_resolution(args.resolution or preset["resolution"])
    chunk = args.chunk or FAMILY_CHUNKS.get(args.family) or preset["chunk"]
    if args.model_path is None:
        size = args.model_size or preset["size"]
        size = size if args.family in SMALL_FAMILIES else "tiny"
        args.model_path = str(tiny_model_path(args.family, size=size))
    placeholder = IMAGE_PLACEHOLDER[args.family]
    images = [make_jpeg(i, w, h) for i in range(n)]
    modes = args.modes.split(",")
    results = []
    with tqdm(total=2 * len(modes), desc="vit_per_chunk") as bar:
        for mode in modes:
            bar.set_description(f"vit_per_chunk {mode}")
            results.append(
                run_mode(args.model_path, mode, images, chunk, bar, args.radix, placeholder)
            )
    result = {
        "benchmark": "vit_per_chunk",
        "config": {"images": n, "resolution": f"{w}x{h}", "chunk": chunk, "family": args.family,
                   "radix_cache": args.radix, "model_path": args.model_path},
        "results": results,
    }  # fmt: skip
    suffix = "" if args.family == DEFAULT_FAMILY else f"_{args.family}"
    out = Path(args.out or f"results/vit_per_chunk{suffix}")
    write_json(out.with_suffix(".json"), result)
    md = markdown(results)
    out.with_suffix(".md").write_text(md)
    plot(results, out.with_suffix(".png"))
    print(md)
    return result


if __name__ == "__main__":
    main()
