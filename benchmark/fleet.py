"""A fleet behind sglang-router: the multiturn_image chat over two round-robin workers, each round
on the other worker, per fleet layout:

- ``local``: two workers, each with its own per-image cache;
- ``store``: the same with the shared embedding store (a Redis started here);
- ``epd``: one encoder-only worker and two language-only workers;
- ``epd+store``: the encoder and the language workers sharing the store;
- ``store+kv``: the store plus the hierarchical cache's KV tier in the same Redis (prefix KV
  pages shared: a round prefills only its new tokens on either worker);
- ``sticky``: one worker behind the router, which holds the whole conversation (the floor the
  fleet layouts are measured against).

Per round: TTFT through the router, the prompt tokens prefilled (not cached) and the images
encoded across the fleet (the sum of every worker's encoder counter). Per layout: the store's
cost per item (lookup and write round trips, bytes), the KV tier's bytes and seconds per round,
and the encoder workers' time per call as the language workers saw it.

    python -m benchmark.fleet --model-path ~/.cache/sglang/bench-models/qwen2_5_vl-7b-L8-V32-v3
    python -m benchmark.fleet --quick          # the embedded small model, 4 rounds
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
from tqdm import tqdm

from benchmark.lib.client import chat, server_info
from benchmark.lib.hardware import cpu_info, cpu_line
from benchmark.lib.images import image_part, make_jpeg
from benchmark.lib.report import markdown_table, pyplot, write_results
from benchmark.multiturn_image import FIRST_TEXT, NEXT_TEXT, SPECIAL, default_model
from benchmark.servers import launch, launch_router, redis_server

LAYOUTS = ("local", "store", "epd", "epd+store", "store+kv", "sticky")
KV_PAGE = 64


@contextlib.contextmanager
def fleet(layout: str, model_path: str, dtype: str, extra: list[str]) -> Iterator[dict]:
    """The processes of ``layout``: yields {"router", "workers", "encoders"} (URLs)."""
    with contextlib.ExitStack() as stack:
        flags = ["--chunked-prefill-size", "2048", "--enable-cache-report", *extra]
        if "store" in layout:
            limits = ("--maxmemory", "4gb", "--maxmemory-policy", "allkeys-lru")
            store, _ = stack.enter_context(redis_server(*limits))
            flags += ["--enable-mm-global-cache", "--mm-global-cache-url", store]
        if layout.endswith("+kv"):
            flags += [
                "--enable-hierarchical-cache",
                *("--hicache-storage-backend", "redis", "--page-size", str(KV_PAGE)),
            ]
        encoders = []
        if layout.startswith("epd"):
            encoder = stack.enter_context(
                launch("ours", model_path, extra=["--encoder-only", *flags], dtype=dtype)
            )
            encoders = [encoder.base_url]
            flags += ["--language-only", "--encoder-urls", *encoders]
        count = 1 if layout == "sticky" else 2
        workers = [
            stack.enter_context(launch("ours", model_path, extra=flags, dtype=dtype)).base_url
            for _ in range(count)
        ]
        router, _ = stack.enter_context(launch_router(workers, "--policy", "round_robin"))
        yield {"router": router, "workers": workers, "encoders": encoders}


def _encoded(client: httpx.Client, urls: list[str]) -> int:
    return sum(
        server_info(client, u).get("mm_embedding_cache", {}).get("encoded_items", 0) for u in urls
    )


KV_FIELDS = ("bytes_loaded", "bytes_saved", "load_seconds", "save_seconds", "tokens_loaded")


def _kv_tier(client: httpx.Client, urls: list[str]) -> dict[str, float]:
    """The KV tier's counters summed over ``urls`` (zeros without one)."""
    stats = [server_info(client, u).get("hicache") or {} for u in urls]
    return {k: sum(s.get(k, 0) for s in stats) for k in KV_FIELDS}


def play(
    client: httpx.Client,
    procs: dict,
    resolution: tuple[int, int],
    rounds: int,
    max_tokens: int,
    progress: tqdm,
) -> list[dict[str, Any]]:
    w, h = resolution
    everyone = procs["workers"] + procs["encoders"]
    messages: list[dict[str, Any]] = []
    rows: list[dict[str, Any]] = []
    for r in range(rounds):
        if r:
            messages.append({"role": "assistant", "content": SPECIAL.sub("", rows[-1]["reply"])})
        part = image_part(make_jpeg(r, w, h))
        text = FIRST_TEXT if r == 0 else NEXT_TEXT
        messages.append({"role": "user", "content": [part, {"type": "text", "text": text}]})
        before, kv_before = _encoded(client, everyone), _kv_tier(client, procs["workers"])
        res = chat(client, procs["router"], "default", messages, max_tokens)
        if not res.ok:
            raise RuntimeError(f"round {r} failed: {res.error}")
        encoded = _encoded(client, everyone) - before
        kv = {k: v - kv_before[k] for k, v in _kv_tier(client, procs["workers"]).items()}
        prefilled = res.prompt_tokens - (res.cached_tokens or 0)
        rows.append(
            {
                "round": r,
                "ttft_ms": res.ttft * 1e3,
                "encoded": encoded,
                "prompt_tokens": res.prompt_tokens,
                "prefilled": prefilled,
                "kv": kv,
                "reply": res.text,
            }
        )
        progress.set_postfix(ttft_ms=f"{res.ttft * 1e3:.0f}", encoded=encoded, prefill=prefilled)
        progress.update(1)
    return rows


def store_costs(client: httpx.Client, workers: list[str]) -> dict[str, Any] | None:
    stats = [server_info(client, u).get("mm_global_cache") for u in workers]
    stats = [s for s in stats if s]
    if not stats:
        return None
    total = {k: sum(s[k] for s in stats) for k in ("hits", "misses", "saved", "rejected", "errors")}
    for k in ("bytes_loaded", "bytes_saved", "load_seconds", "save_seconds"):
        total[k] = sum(s[k] for s in stats)
    lookups = total["hits"] + total["misses"]
    return {
        **total,
        "ms_per_lookup": total["load_seconds"] * 1e3 / max(lookups, 1),
        "ms_per_write": total["save_seconds"] * 1e3 / max(total["saved"], 1),
        "bytes_per_entry": total["bytes_saved"] / max(total["saved"], 1),
    }


def remote_costs(client: httpx.Client, workers: list[str]) -> dict[str, Any] | None:
    stats = [server_info(client, u).get("encoder_workers") for u in workers]
    stats = [s for s in stats if s]
    if not stats:
        return None
    calls = sum(s["remote_calls"] for s in stats)
    seconds = sum(s["remote_seconds"] for s in stats)
    return {
        "calls": calls,
        "items": sum(s["remote_items"] for s in stats),
        "failures": sum(s["remote_failures"] for s in stats),
        "ms_per_call": seconds * 1e3 / max(calls, 1),
    }


def markdown(result: dict[str, Any]) -> str:
    runs = result["runs"]
    lines = [
        f"# Fleet: {result['rounds']}-round multiturn_image at {result['resolution']}, "
        "2 workers behind sglang-router (round_robin)",
        "",
        cpu_line(result["cpu"]),
        f"Model: `{result['model_path']}` ({result['dtype']})",
        "",
    ]
    headers = [
        "layout",
        "images encoded",
        "mean TTFT ms",
        "TTFT rounds 1+ ms",
        "/ sticky",
        "prefill tokens rounds 1+",
        "replies equal",
    ]
    reference = runs[0]["replies"]
    sticky = next((_later_ttft(r) for r in runs if r["layout"] == "sticky"), None)
    rows = []
    for run in runs:
        ttft = [r["ttft_ms"] for r in run["rounds"]]
        later = _later_ttft(run)
        rows.append(
            [
                run["layout"],
                run["encoded_total"],
                f"{sum(ttft) / len(ttft):.0f}",
                f"{later:.0f}",
                f"{later / sticky:.2f}" if sticky else "",
                sum(r.get("prefilled", 0) for r in run["rounds"][1:]),
                run["replies"] == reference,
            ]
        )
    lines += [markdown_table(headers, rows), ""]
    lines += ["Per round, TTFT ms (prompt tokens prefilled, images encoded):", ""]
    per_round = [
        [
            run["layout"],
            *(f"{r['ttft_ms']:.0f} ({r.get('prefilled')}, {r['encoded']})" for r in run["rounds"]),
        ]
        for run in runs
    ]
    rounds = [f"r{i}" for i in range(result["rounds"])]
    lines += [markdown_table(["layout", *rounds], per_round), ""]
    for run in runs:
        if run["store"]:
            s = run["store"]
            lines.append(
                f"- {run['layout']}: store lookup {s['ms_per_lookup']:.2f} ms per item, write "
                f"{s['ms_per_write']:.2f} ms per item, {s['bytes_per_entry'] / 2**10:.0f} KiB "
                f"per entry ({s['hits']} hits, {s['misses']} misses, {s['saved']} written)"
            )
        kv = [r["kv"] for r in run["rounds"][1:] if r.get("kv", {}).get("tokens_loaded")]
        if kv:
            mean = {k: sum(x[k] for x in kv) / len(kv) for k in KV_FIELDS}
            lines.append(
                f"- {run['layout']}: KV tier per round {mean['bytes_loaded'] / 2**20:.0f} MiB "
                f"loaded in {mean['load_seconds'] * 1e3:.0f} ms, "
                f"{mean['bytes_saved'] / 2**20:.0f} MiB written in "
                f"{mean['save_seconds'] * 1e3:.0f} ms (writer thread), "
                f"{mean['tokens_loaded']:.0f} tokens loaded"
            )
        if run["remote"]:
            r = run["remote"]
            lines.append(
                f"- {run['layout']}: {r['calls']} encoder-worker calls, {r['ms_per_call']:.0f} ms "
                f"each as the language workers waited, {r['failures']} failed"
            )
    return "\n".join(lines) + "\n"


def _later_ttft(run: dict[str, Any]) -> float:
    """Mean TTFT of rounds 1+ (round 0 alone when there is one round)."""
    ttft = [r["ttft_ms"] for r in run["rounds"]]
    later = ttft[1:] or ttft
    return sum(later) / len(later)


def plot(result: dict[str, Any], path: Path) -> None:
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for run in result["runs"]:
        rounds = [r["round"] for r in run["rounds"]]
        left.plot(rounds, [r["ttft_ms"] for r in run["rounds"]], marker="o", label=run["layout"])
    left.set_xlabel("round")
    left.set_ylabel("TTFT (ms)")
    left.set_title("TTFT per round through the router")
    left.legend()
    names = [run["layout"] for run in result["runs"]]
    right.bar(names, [run["encoded_total"] for run in result["runs"]])
    right.axhline(result["rounds"], color="k", linestyle="--", linewidth=1, label="one per image")
    right.set_ylabel("images encoded across the fleet")
    right.legend()
    fig.suptitle(cpu_line(result["cpu"]), fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-path", help="model folder (default: the embedded small model)")
    p.add_argument("--quick", action="store_true", help="the embedded small model, 4 rounds")
    p.add_argument("--layouts", default=",".join(LAYOUTS))
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--resolution", default="640x480")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--server-args", default="", help="extra flags for every worker")
    p.add_argument("--out", default="results/fleet")
    args = p.parse_args(argv)
    rounds = 4 if args.quick else args.rounds
    model_path = args.model_path or default_model("small")
    layouts = args.layouts.split(",")
    w, h = (int(v) for v in args.resolution.split("x"))
    runs = []
    with httpx.Client(timeout=600) as client, tqdm(total=rounds * len(layouts)) as progress:
        for layout in layouts:
            progress.set_description(layout)
            with fleet(layout, model_path, args.dtype, args.server_args.split()) as procs:
                rows = play(client, procs, (w, h), rounds, args.max_tokens, progress)
                runs.append(
                    {
                        "layout": layout,
                        "rounds": rows,
                        "encoded_total": sum(r["encoded"] for r in rows),
                        "replies": [r["reply"] for r in rows],
                        "store": store_costs(client, procs["workers"]),
                        "remote": remote_costs(client, procs["workers"]),
                    }
                )
    result = {
        "cpu": cpu_info(),
        "model_path": model_path,
        "dtype": args.dtype,
        "resolution": args.resolution,
        "rounds": rounds,
        "runs": runs,
    }
    write_results(args.out, result, markdown(result), lambda path: plot(result, path))
    return result


if __name__ == "__main__":
    main()
