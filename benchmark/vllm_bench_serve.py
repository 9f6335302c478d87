"""vLLM's own ``bench serve`` (random-mm) against our server and vLLM's, side by side in one run.

For each engine the server is launched on the same checkpoint with the dtype given (``auto``:
each engine's default, the checkpoint's bfloat16), then vLLM's benchmark client (from the peer
venv, ``vllm.benchmarks.serve``) sends ``--num-prompts`` streamed chat requests, each with
``--images`` random images of ``--image-size`` pixels and ``--input-len`` random tokens, under
``--max-concurrency``; a short warm-up run (other prompts) comes first. The client's own figures
are kept: requests/s, output tokens/s, TTFT, TPOT and ITL (mean, median, p99). ``ours / vllm``
ratios are printed for requests/s and p99 TTFT.

    python -m benchmark.vllm_bench_serve --model-path PATH --engines ours,vllm
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from tqdm import tqdm

from benchmark.lib.hardware import cpu_info, cpu_line
from benchmark.lib.report import markdown_table, pyplot, run_and_write
from benchmark.servers import Server, launch, peer_python

METRICS = ("ttft", "tpot", "itl", "e2el")
KEPT = ("completed", "failed", "duration", "request_throughput", "output_throughput",
        "total_token_throughput")  # fmt: skip


def client_command(server: Server, args: argparse.Namespace, prompts: int, seed: int,
                   result_dir: Path, name: str) -> list[str]:  # fmt: skip
    """The ``vllm bench serve`` command line (run as a module: the peer venv's ``vllm``
    script needs package metadata some installs lack)."""
    side = args.image_size
    return [
        str(peer_python("vllm")),
        *("-c", "import sys; from vllm.benchmarks.serve import main as m, add_cli_args as a; "
          "import argparse; p = argparse.ArgumentParser(); a(p); m(p.parse_args(sys.argv[1:]))"),
        *("--backend", "openai-chat", "--base-url", server.base_url),
        *("--endpoint", "/v1/chat/completions", "--model", server.model),
        *("--tokenizer", args.model_path, "--dataset-name", "random-mm"),
        *("--num-prompts", str(prompts), "--max-concurrency", str(args.max_concurrency)),
        *("--random-input-len", str(args.input_len), "--random-output-len", str(args.output_len)),
        *("--random-mm-base-items-per-request", str(args.images)),
        *("--random-mm-num-mm-items-range-ratio", "0"),
        *("--random-mm-limit-mm-per-prompt", json.dumps({"image": args.images, "video": 0})),
        *("--random-mm-bucket-config", str({(side, side, 1): 1.0})),
        *("--ignore-eos", "--seed", str(seed), "--percentile-metrics", ",".join(METRICS)),
        *("--metric-percentiles", "50,99", "--save-result", "--result-dir", str(result_dir)),
        *("--result-filename", name, "--disable-tqdm"),
    ]  # fmt: skip


def _client(server: Server, args: argparse.Namespace, prompts: int, seed: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-serve-") as tmp:
        cmd = client_command(server, args, prompts, seed, Path(tmp), "result.json")
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
        path = Path(tmp) / "result.json"
        if done.returncode != 0 or not path.exists():
            raise RuntimeError(f"bench serve failed ({done.returncode}): {done.stderr[-2000:]}")
        return json.loads(path.read_text())


def run(args: argparse.Namespace) -> dict[str, Any]:
    cpu = cpu_info()
    print(cpu_line(cpu))
    runs = []
    engines = args.engines.split(",")
    for engine in tqdm(engines, desc="bench serve"):
        with launch(engine, args.model_path, dtype=args.dtype) as server:
            _client(server, args, args.warmup_prompts, args.seed + 1)
            raw = _client(server, args, args.num_prompts, args.seed)
        row = {"engine": engine, **{k: raw.get(k) for k in KEPT}}
        for metric in METRICS:
            for stat in ("mean", "median", "p99"):
                row[f"{stat}_{metric}_ms"] = raw.get(f"{stat}_{metric}_ms")
        runs.append(row)
    by = {r["engine"]: r for r in runs}
    ratios = {}
    if "ours" in by and "vllm" in by:
        ours, vllm = by["ours"], by["vllm"]
        ratios = {
            "request_throughput_ours_over_vllm": ours["request_throughput"]
            / vllm["request_throughput"],
            "p99_ttft_ours_over_vllm": ours["p99_ttft_ms"] / vllm["p99_ttft_ms"],
            "mean_ttft_ours_over_vllm": ours["mean_ttft_ms"] / vllm["mean_ttft_ms"],
        }
    return {"benchmark": "vllm_bench_serve", "config": vars(args), "cpu": cpu, "runs": runs,
            "ratios": ratios}  # fmt: skip


def markdown(result: dict[str, Any]) -> str:
    c = result["config"]
    head = ["engine", "done", "req/s", "out tok/s", "TTFT mean", "TTFT p99", "TPOT mean",
            "ITL p99", "E2E mean"]  # fmt: skip
    rows = [
        [r["engine"], r["completed"], r["request_throughput"], r["output_throughput"],
         r["mean_ttft_ms"], r["p99_ttft_ms"], r["mean_tpot_ms"], r["p99_itl_ms"], r["mean_e2el_ms"]]
        for r in result["runs"]
    ]  # fmt: skip
    ratios = ", ".join(f"{k} = {v:.3g}" for k, v in result["ratios"].items())
    return (
        f"{cpu_line(result['cpu'])}\n\nvLLM bench serve, random-mm: {c['num_prompts']} prompts, "
        f"{c['images']} x {c['image_size']} px images, {c['input_len']} input / "
        f"{c['output_len']} output tokens, concurrency {c['max_concurrency']}, dtype "
        f"{c['dtype']}; times in ms\n\n" + markdown_table(head, rows) + f"\n\nratios: {ratios}\n"
    )


def plot(result: dict[str, Any], path: Path) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(7, 3))
    names = [r["engine"] for r in result["runs"]]
    axes[0].bar(names, [r["request_throughput"] for r in result["runs"]])
    axes[0].set_ylabel("requests / s")
    for i, stat in enumerate(("mean", "p99")):
        values = [r[f"{stat}_ttft_ms"] for r in result["runs"]]
        axes[1].bar([x + 0.4 * i for x in range(len(names))], values, width=0.4, label=stat)
    axes[1].set_xticks([x + 0.2 for x in range(len(names))], names)
    axes[1].set_ylabel("TTFT ms")
    axes[1].legend(fontsize=7)
    fig.suptitle(cpu_line(result["cpu"]), fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-path", required=True)
    p.add_argument("--engines", default="ours,vllm")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--num-prompts", type=int, default=32)
    p.add_argument("--warmup-prompts", type=int, default=4)
    p.add_argument("--max-concurrency", type=int, default=8)
    p.add_argument("--images", type=int, default=2, help="images per request")
    p.add_argument("--image-size", type=int, default=448, help="square side in pixels")
    p.add_argument("--input-len", type=int, default=64, help="random text tokens per request")
    p.add_argument("--output-len", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=1800, help="seconds per client run")
    p.add_argument("--out", default="results/vllm_bench_serve")
    return run_and_write(p.parse_args(argv), run, markdown, plot)


if __name__ == "__main__":
    main()
