"""Serving throughput with random images (like ``bench_serving --dataset-name image``).

Many streamed chat requests, each with its own random image(s) and a random text prompt, sent
at ``--request-rate`` (Poisson; inf = all at once) under ``--max-concurrency``. Reports request
and token throughput, TTFT, ITL, TPOT and end-to-end latency (mean, median, p99), per engine
and cache mode.

    python -m benchmark.serving_throughput --quick
    python -m benchmark.serving_throughput --num-prompts 64 --engines ours,vllm,hf
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from pathlib import Path
from typing import Any

import httpx
from tqdm import tqdm

from benchmark.lib.client import CACHE_MODES, ChatResult, achat, flush_cache
from benchmark.lib.hardware import process_tree_cpu_seconds
from benchmark.lib.images import image_part, make_jpeg, parse_resolution
from benchmark.lib.report import markdown_table, percentiles, pyplot, write_json
from benchmark.multiturn_image import default_model, targets
from benchmark.servers import Server, connect, launch

WORDS = "the cat sat on a red chair near blue window while birds sang in tall green trees".split()
PRESETS: dict[str, dict[str, Any]] = {
    "quick": {"num_prompts": 16, "resolution": "448x448", "concurrency": 4, "size": "small"},
    "full": {"num_prompts": 64, "resolution": "1280x720", "concurrency": 8, "size": "small"},
}


def make_requests(
    n: int, resolution: tuple[int, int], images_per_request: int, input_words: int, seed: int
) -> list[list[dict[str, Any]]]:
    rng = random.Random(seed)
    w, h = resolution
    out = []
    for i in range(n):
        parts = [
            image_part(make_jpeg(seed * 100_000 + i * 16 + j, w, h))
            for j in range(images_per_request)
        ]
        text = " ".join(rng.choice(WORDS) for _ in range(input_words))
        out.append([{"role": "user", "content": [*parts, {"type": "text", "text": text}]}])
    return out


async def _run(
    server: Server, requests: list[list[dict]], args: argparse.Namespace, bar: tqdm
) -> tuple[list[ChatResult], float]:
    sem = asyncio.Semaphore(args.max_concurrency)
    rng = random.Random(args.seed)
    # transformers serve rejects unknown fields such as ignore_eos: its outputs may end early.
    extra = {"ignore_eos": True} if not args.no_ignore_eos and server.engine != "hf" else None
    limits = httpx.Limits(max_connections=args.max_concurrency + 2)
    async with httpx.AsyncClient(timeout=3600, limits=limits) as client:

        async def one(messages: list[dict]) -> ChatResult:
            async with sem:
                res = await achat(
                    client, server.base_url, server.model, messages, args.output_len, extra=extra
                )
            bar.update(1)
            return res

        tasks = []
        start = time.perf_counter()
        for messages in requests:
            tasks.append(asyncio.create_task(one(messages)))
            if args.request_rate != float("inf"):
                await asyncio.sleep(rng.expovariate(args.request_rate))
        results = await asyncio.gather(*tasks)
        return list(results), time.perf_counter() - start


def metrics(results: list[ChatResult], duration: float) -> dict[str, Any]:
    ok = [r for r in results if r.ok]
    tpot = [(r.latency - r.ttft) / (r.completion_tokens - 1) for r in ok if r.completion_tokens > 1]
    return {
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "duration_s": duration,
        "request_throughput": len(ok) / duration,
        "input_token_throughput": sum(r.prompt_tokens for r in ok) / duration,
        "output_token_throughput": sum(r.completion_tokens for r in ok) / duration,
        "ttft_ms": percentiles(r.ttft for r in ok),
        "itl_ms": percentiles(x for r in ok for x in r.itl),
        "tpot_ms": percentiles(tpot),
        "e2e_ms": percentiles(r.latency for r in ok),
        "errors": sorted({r.error for r in results if not r.ok})[:5],
    }


def markdown(runs: list[dict[str, Any]]) -> str:
    rows = [
        [r["label"], r["completed"], r["request_throughput"], r["output_token_throughput"],
         r["ttft_ms"]["mean"], r["ttft_ms"]["median"], r["ttft_ms"]["p99"],
         r["itl_ms"]["mean"], r["tpot_ms"]["mean"], r["e2e_ms"]["mean"],
         r.get("server_cpu_s_per_request")]
        for r in runs
    ]  # fmt: skip
    head = ["engine", "ok", "req/s", "out tok/s", "TTFT mean", "TTFT median", "TTFT p99",
            "ITL mean", "TPOT mean", "E2E mean", "server CPU s / req"]  # fmt: skip
    text = markdown_table(head, rows) + "\n\n(times in ms)\n"
    base = next((r for r in runs if r["label"] == "ours:per-image"), None)
    for r in runs:
        if base and r["engine"] in ("vllm", "hf") and r["completed"]:
            rps = base["request_throughput"] / r["request_throughput"]
            ttft = base["ttft_ms"]["mean"] / r["ttft_ms"]["mean"]
            text += f"\nours:per-image / {r['label']}: req/s x{rps:.2f}, TTFT mean x{ttft:.2f}\n"
    return text


def plot(runs: list[dict[str, Any]], path: Path) -> None:
    plt = pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(8.4, 3.2))
    labels = [r["label"] for r in runs]
    a.bar(labels, [r["request_throughput"] for r in runs])
    a.set_ylabel("requests / s")
    for k, key in enumerate(("mean", "median", "p99")):
        b.bar([i + 0.27 * (k - 1) for i in range(len(runs))],
              [r["ttft_ms"][key] for r in runs], width=0.27, label=f"TTFT {key}")  # fmt: skip
    b.set_xticks(range(len(runs)), labels)
    b.set_ylabel("ms")
    b.legend(fontsize=7)
    for ax in (a, b):
        ax.tick_params(axis="x", labelsize=7, rotation=20)
        ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path, dpi=70)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", choices=PRESETS, default="full")
    p.add_argument("--quick", action="store_true", help="same as --preset quick")
    p.add_argument("--num-prompts", type=int)
    p.add_argument("--resolution")
    p.add_argument("--images-per-request", type=int, default=1)
    p.add_argument("--input-words", type=int, default=32, help="random words in the text part")
    p.add_argument("--output-len", type=int, default=16)
    p.add_argument("--no-ignore-eos", action="store_true")
    p.add_argument("--request-rate", type=float, default=float("inf"))
    p.add_argument("--max-concurrency", type=int)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--model-path")
    p.add_argument("--model-size", choices=("tiny", "small"))
    p.add_argument("--modes", default=",".join(CACHE_MODES))
    p.add_argument("--engines", default="ours", help="ours,vllm,hf (peers need their venvs)")
    p.add_argument("--server-args", default="", help="extra flags for our server")
    p.add_argument(
        "--dtype", default="float32", help="every launched engine's dtype (e.g. bfloat16)"
    )
    p.add_argument("--base-url", help="use a running server instead of launching")
    p.add_argument("--label", default="external")
    p.add_argument("--out", default="results/serving_throughput")
    args = p.parse_args(argv)
    preset = PRESETS["quick" if args.quick else args.preset]
    n = args.num_prompts or preset["num_prompts"]
    args.max_concurrency = args.max_concurrency or preset["concurrency"]
    resolution = parse_resolution(args.resolution or preset["resolution"])
    model_path = args.model_path or (
        None if args.base_url else default_model(args.model_size or preset["size"])
    )
    requests = make_requests(n, resolution, args.images_per_request, args.input_words, args.seed)
    warm = make_requests(2, resolution, args.images_per_request, args.input_words, args.seed + 1)
    plan = [("external", "")] if args.base_url else targets(args)
    runs, failures = [], []
    for engine, mode in plan:
        if args.base_url:
            ctx = connect(args.base_url, args.label)
        else:
            ctx = launch(
                engine, model_path, mode or "per-image", args.server_args.split(), dtype=args.dtype
            )
        try:
            with ctx as server:
                with tqdm(total=n + len(warm), desc=f"throughput {server.label}") as bar:
                    asyncio.run(_run(server, warm, args, bar))  # warm-up, other images
                    with httpx.Client(timeout=60) as client:
                        flush_cache(client, server.base_url)
                    pid = server.proc.pid if server.proc else None
                    cpu_before = process_tree_cpu_seconds(pid)
                    results, duration = asyncio.run(_run(server, requests, args, bar))
                    cpu_after = process_tree_cpu_seconds(pid)
                cpu = None
                if cpu_before is not None and cpu_after is not None:
                    cpu = (cpu_after - cpu_before) / len(requests)
                runs.append({"engine": server.engine, "label": server.label,
                             "mode": mode or None, **metrics(results, duration),
                             "server_cpu_s_per_request": cpu})  # fmt: skip
        except (RuntimeError, TimeoutError, OSError, httpx.HTTPError) as exc:
            if engine == "ours" or args.base_url:
                raise
            failures.append({"engine": engine, "error": f"{type(exc).__name__}: {exc}"[-2000:]})
            print(f"peer {engine} failed: {failures[-1]['error']}")
    result = {
        "benchmark": "serving_throughput",
        "config": {"num_prompts": n, "resolution": "x".join(map(str, resolution)),
                   "images_per_request": args.images_per_request, "input_words": args.input_words,
                   "output_len": args.output_len, "request_rate": str(args.request_rate),
                   "max_concurrency": args.max_concurrency, "model_path": model_path},
        "runs": runs,
        "failures": failures,
    }  # fmt: skip
    out = Path(args.out)
    write_json(out.with_suffix(".json"), result)
    md = markdown(runs)
    out.with_suffix(".md").write_text(md)
    plot(runs, out.with_suffix(".png"))
    print(md)
    return result


if __name__ == "__main__":
    main()
