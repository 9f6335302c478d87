"""Multi-turn image chat: TTFT per round with one new image per round, per cache mode.

The scenario (one client, sequential, streamed chat with usage, temperature 0, 16 output tokens,
caches flushed at the start): round 0 sends image 0 and "Describe this image in detail: " + "z"*64;
each later round appends the assistant's reply, a new image and "Now look at this new image and
answer: " + "w"*32. Images are deterministic JPEGs (q85) seeded by the image id.

    python -m benchmark.multiturn_image --quick
    python -m benchmark.multiturn_image --preset full --engines ours,vllm,hf
    python -m benchmark.multiturn_image --base-url http://127.0.0.1:30000 --label mine
    python -m benchmark.multiturn_image --engines ours,vllm --interleave ...  # rounds in turn
"""

from __future__ import annotations

import argparse
import re
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import transformers
from tqdm import tqdm

from benchmark.lib.client import (
    CACHE_MODES,
    THINK_MODES,
    chat,
    flush_cache,
    server_info,
    think_mode_body,
)
from benchmark.lib.counters import (
    ROUND_PARTS,
    achieved,
    counter_delta,
    encoder_counters,
    gc_counters,
    parts_of_round,
    perf_counters,
    round_breakdown,
)
from benchmark.lib.hardware import (
    cpu_info,
    cpu_line,
    gpu_info,
    gpu_line,
    matmul_peak_gflops,
    memory_bandwidth_gbs,
    paused,
    process_tree_cpu_seconds,
)
from benchmark.lib.images import image_part, make_jpeg, parse_resolution
from benchmark.lib.report import markdown_table, pyplot, ratio, write_json
from benchmark.servers import connect, launch
from sglang.srt.model_executor.dtypes import dtype_name, resolve_dtype

FIRST_TEXT = "Describe this image in detail: " + "z" * 64
NEXT_TEXT = "Now look at this new image and answer: " + "w" * 32
WARMUP_ID = 1_000_000
# A random model may emit special tokens as text (e.g. "<|video_pad|>"); sent back inside the
# conversation they would be read as placeholders, so they are dropped from the replies.
SPECIAL = re.compile(r"<\|[a-z_]+\|>")
PRESETS: dict[str, dict[str, Any]] = {
    "quick": {"resolutions": "448x448,640x360", "rounds": 8, "size": "small"},
    "full": {"resolutions": "1280x720,1920x1080,2560x1440", "rounds": 8, "size": "small"},
}


def run_conversation(*args: Any, **kwargs: Any) -> list[dict[str, Any]]:
    """All rounds of ``conversation_rounds`` (same arguments)."""
    return list(conversation_rounds(*args, **kwargs))


def conversation_rounds(
    client: httpx.Client,
    base_url: str,
    model: str,
    resolution: tuple[int, int],
    rounds: int,
    max_tokens: int,
    progress: tqdm | None = None,
    image_offset: int = 0,
    extra: dict[str, Any] | None = None,
    peak_gflops: float | None = None,
    server_pid: int | None = None,
    bandwidth_gbs: float | None = None,
    part_peaks: dict[str, float | None] | None = None,
) -> Iterator[dict[str, Any]]:
    """Warm up with an unrelated image, flush the caches, then play the rounds, yielding each
    when it is done (image ids ``image_offset + round``: repetitions use new images, so no engine
    can answer from a cache that /flush_cache does not reach, such as vLLM's encoder cache)."""
    w, h = resolution
    warm = [{"role": "user", "content": [image_part(make_jpeg(WARMUP_ID + w, w, h)), "hi"]}]
    warm[0]["content"][1] = {"type": "text", "text": "hi"}
    chat(client, base_url, model, warm, 2, extra=extra)
    flush_cache(client, base_url)
    messages: list[dict[str, Any]] = []
    out = []
    for r in range(rounds):
        if r:
            messages.append({"role": "assistant", "content": SPECIAL.sub("", out[-1]["reply"])})
        text = FIRST_TEXT if r == 0 else NEXT_TEXT
        part = image_part(make_jpeg(image_offset + r, w, h))
        messages.append({"role": "user", "content": [part, {"type": "text", "text": text}]})
        info = server_info(client, base_url)
        cpu_before = process_tree_cpu_seconds(server_pid)
        res = chat(client, base_url, model, messages, max_tokens, extra=extra)
        cpu_after = process_tree_cpu_seconds(server_pid)
        after = server_info(client, base_url)
        delta = counter_delta(encoder_counters(info), encoder_counters(after))
        perf = counter_delta(perf_counters(info), perf_counters(after))
        gc = counter_delta(gc_counters(info), gc_counters(after))
        if not res.ok:
            raise RuntimeError(f"round {r} at {w}x{h} failed: {res.error}")
        cached = res.cached_tokens
        out.append(
            {
                "round": r,
                "prompt_tokens": res.prompt_tokens,
                "cached_tokens": cached,
                "hit_rate": cached / res.prompt_tokens if cached is not None else None,
                "ttft_ms": res.ttft * 1e3,
                "latency_ms": res.latency * 1e3,
                "completion_tokens": res.completion_tokens,
                "encoder_ms": delta["encoder_seconds"] * 1e3 if delta else None,
                "encoded_items": int(delta["encoded_items"]) if delta else None,
                "encoded_tokens": int(delta["encoded_tokens"]) if delta else None,
                "encoder_calls": int(delta["encoder_calls"]) if delta else None,
                "reply": res.text,
                "server_cpu_s": cpu_after - cpu_before
                if cpu_before is not None and cpu_after is not None
                else None,
                "gc_ms": gc["seconds"] * 1e3 if gc else None,
                "gc_collections": int(gc["collections"]) if gc else None,
                **achieved(perf, peak_gflops),
                **round_breakdown(perf, delta, res.ttft, peak_gflops, bandwidth_gbs),
                **parts_of_round(perf, delta, res.ttft, part_peaks or {}),
            }
        )
        if progress is not None:
            progress.set_postfix(ttft_ms=f"{res.ttft * 1e3:.0f}")
            progress.update(1)
        yield out[-1]


def interleaved_rounds(
    servers: list[Any],
    client: httpx.Client,
    resolution: tuple[int, int],
    rounds: int,
    repeats: int,
    **kwargs: Any,
) -> dict[str, list[list[dict[str, Any]]]]:
    """Every server plays each repetition's conversation (the same images), round by round in
    turn: round r on the first server, round r on the next, ... A slow spell of the machine then
    reaches all engines alike instead of the one that happened to run in it. The other servers
    are stopped (SIGSTOP) while one plays a round, so that an idle server's polling takes
    nothing from it; each round records what they used of the CPU meanwhile (``others_cpu_s``,
    ~0). Returns {label: [one list of rounds per repetition]}."""
    played: dict[str, list[list[dict[str, Any]]]] = {s.label: [] for s in servers}
    pids = {s.label: s.proc.pid if s.proc else None for s in servers}
    for k in range(repeats):
        games = {
            s.label: conversation_rounds(
                client, s.base_url, s.model, resolution, rounds, image_offset=1000 * k,
                server_pid=pids[s.label], **kwargs,
            )
            for s in servers
        }  # fmt: skip
        for label in games:
            played[label].append([])
        for _ in range(rounds):
            for label, game in games.items():
                others = [pid for other, pid in pids.items() if other != label]
                with paused(others):
                    before = [process_tree_cpu_seconds(pid) for pid in others]
                    entry = next(game)
                    after = [process_tree_cpu_seconds(pid) for pid in others]
                known = [(a, b) for a, b in zip(after, before) if a is not None and b is not None]
                entry["others_cpu_s"] = sum(a - b for a, b in known) if known else None
                played[label][-1].append(entry)
    return played


def best_of(repeats: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per round, the repetition with the lowest TTFT (other load on the machine only ever adds
    time); every repetition's TTFT is kept in ``ttft_ms_all``."""
    rows = []
    for per_round in zip(*repeats):
        best = dict(min(per_round, key=lambda r: r["ttft_ms"]))
        best["ttft_ms_all"] = [r["ttft_ms"] for r in per_round]
        rows.append(best)
    return rows


def summarize(runs: list[dict[str, Any]], resolutions: list[str]) -> dict[str, Any]:
    """Side-by-side ratios per resolution (last round = round 7 in the standard scenario)."""
    summary: dict[str, Any] = {}
    for res in resolutions:
        by = {run["label"]: run["rounds"] for run in runs if run["resolution"] == res}
        ttft = {label: [r["ttft_ms"] for r in rounds] for label, rounds in by.items()}
        last = max((len(v) for v in ttft.values()), default=0) - 1
        pi, co = ttft.get("ours:per-image"), ttft.get("ours:combined")
        entry: dict[str, Any] = {
            "last_round": last,
            "ttft_last_ms": {k: v[-1] for k, v in ttft.items()},
            "encoded_items_per_round": {
                k: [r["encoded_items"] for r in v] for k, v in by.items() if k.startswith("ours")
            },
            "encoder_ms_per_round": {
                k: [r["encoder_ms"] for r in v] for k, v in by.items() if k.startswith("ours")
            },
        }
        if pi and co:
            entry["last_per_image_over_combined"] = ratio(pi[-1], co[-1])
        if pi and len(pi) > 1:
            entry["per_image_last_over_round1"] = ratio(pi[-1], pi[1])
            entry["per_image_last_over_round0"] = ratio(pi[-1], pi[0])
        for peer in ("vllm", "hf"):
            if pi and peer in ttft:
                entry[f"per_image_over_{peer}"] = [ratio(a, b) for a, b in zip(pi, ttft[peer])]
                entry[f"per_image_over_{peer}_mean"] = ratio(sum(pi), sum(ttft[peer]))
        summary[res] = entry
    return summary


def goals(summary: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for res, s in summary.items():
        items = s["encoded_items_per_round"].get("ours:per-image")
        out[res] = {
            "last_per_image_over_combined<=0.5": _le(s.get("last_per_image_over_combined"), 0.5),
            "per_image_last_over_round1<=1.3": _le(s.get("per_image_last_over_round1"), 1.3),
            "per_image_one_item_per_round": None if items is None else all(i == 1 for i in items),
        }
    return out


def _le(value: float | None, bound: float) -> bool | None:
    return None if value is None else value <= bound


def markdown(runs: list[dict[str, Any]], summary: dict[str, Any]) -> str:
    labels = list(dict.fromkeys(run["label"] for run in runs))
    parts = []
    for res, s in summary.items():
        by = {run["label"]: run["rounds"] for run in runs if run["resolution"] == res}
        n = max(len(v) for v in by.values())
        headers = ["round"]
        for label in labels:
            headers += [f"{label} TTFT ms"]
        headers += [f"{lb} items/enc ms" for lb in labels if lb.startswith("ours")]
        cpu_labels = [lb for lb in labels if any(e.get("server_cpu_s") for e in by.get(lb, []))]
        headers += [f"{lb} server CPU s" for lb in cpu_labels]
        rows = []
        for r in range(n):
            row: list[Any] = [r]
            row += [by[lb][r]["ttft_ms"] if r < len(by.get(lb, [])) else None for lb in labels]
            for lb in labels:
                if lb.startswith("ours") and r < len(by.get(lb, [])):
                    e = by[lb][r]
                    row.append(f"{e['encoded_items']} / {e['encoder_ms']:.0f}")
            for lb in cpu_labels:
                rounds = by[lb]
                row.append(rounds[r]["server_cpu_s"] if r < len(rounds) else None)
            rows.append(row)
        pi = by.get("ours:per-image") or next(iter(by.values()))
        cache = [f"{e['cached_tokens']}/{e['prompt_tokens']}" for e in pi]
        parts.append(f"### {res}\n\n" + markdown_table(headers, rows))
        parts.append("cached/prompt tokens (first listed run): " + ", ".join(cache))
        perf_rows = [
            [lb, r, e["vision_ms"], e["vision_gflop_per_s"], e["vision_of_peak"],
             e["lm_attention_ms"], e["lm_attention_gflop_per_s"], e["lm_attention_of_peak"]]
            for lb in labels if lb.startswith("ours")
            for r, e in enumerate(by.get(lb, [])) if e.get("vision_ms") is not None
        ]  # fmt: skip
        if perf_rows:
            parts.append(
                "achieved rate (matmul peak from the probe at start):\n\n"
                + markdown_table(
                    [
                        "run",
                        "round",
                        "ViT ms",
                        "ViT GFLOP/s",
                        "ViT / peak",
                        "LM attn ms",
                        "LM attn GFLOP/s",
                        "LM attn / peak",
                    ],
                    perf_rows,
                )  # fmt: skip
            )
        split_rows = [
            [lb, r, e["ttft_ms"], e["round_gflops"], e["mfu"], e["api_other_ms"],
             e["preprocess_ms"], e["vision_ms"], e["lm_ms"], e["sampling_ms"],
             e["decode_ms_per_step"], e["decode_of_bandwidth"], e.get("gc_ms")]
            for lb in labels if lb.startswith("ours")
            for r, e in enumerate(by.get(lb, [])) if e.get("round_gflops") is not None
        ]  # fmt: skip
        if split_rows:
            parts.append(
                "model FLOPs utilisation and where TTFT went (ms); decode against the copy-probe "
                "bandwidth; the compute process's garbage collection over the whole round:\n\n"
                + markdown_table(
                    [
                        "run",
                        "round",
                        "TTFT",
                        "GFLOP",
                        "MFU",
                        "API+other",
                        "preprocess",
                        "ViT",
                        "LM",
                        "sampling",
                        "decode ms/step",
                        "decode / bandwidth",
                        "GC ms (round)",
                    ],
                    split_rows,
                )  # fmt: skip
            )
        part_rows = [
            [lb, r, e["mfu"], e["mfu_at_part_peaks"],
             *[e[f"{part}_{k}"] for part in ROUND_PARTS for k in ("ms", "of_peak")]]
            for lb in labels if lb.startswith("ours")
            for r, e in enumerate(by.get(lb, [])) if e.get("mfu_at_part_peaks") is not None
        ]  # fmt: skip
        if part_rows:
            parts.append(
                "MFU per part: each part's ms and its rate over the peak of the arithmetic it "
                "runs in (config.part_dtypes); MFU at part peaks = the round at every part's "
                "peak over TTFT:\n\n"
                + markdown_table(
                    [
                        "run",
                        "round",
                        "MFU",
                        "MFU at part peaks",
                        *[f"{PART_NAMES[p]} {k}" for p in ROUND_PARTS for k in ("ms", "/ peak")],
                    ],
                    part_rows,
                )  # fmt: skip
            )
        ratios = {k: v for k, v in s.items() if isinstance(v, float)}
        parts.append("ratios: " + ", ".join(f"{k} = {v:.3f}" for k, v in ratios.items()))
    return "\n\n".join(parts) + "\n"


PART_NAMES = {
    "vision_attention": "ViT attn",
    "vision_dense": "ViT rest",
    "lm_attention": "LM attn",
    "lm_dense": "LM rest",
}


def plot(runs: list[dict[str, Any]], resolutions: list[str], path: Path) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, len(resolutions), figsize=(4.2 * len(resolutions), 3.2))
    axes = axes if len(resolutions) > 1 else [axes]
    for ax, res in zip(axes, resolutions):
        for run in (r for r in runs if r["resolution"] == res):
            ys = [e["ttft_ms"] for e in run["rounds"]]
            ax.plot(range(len(ys)), ys, marker="o", ms=3, label=run["label"])
        ax.set_title(res)
        ax.set_xlabel("round")
        ax.set_ylabel("TTFT (ms)")
        ax.set_yscale("log")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=70)
    plt.close(fig)


def default_model(size: str, family: str | None = None) -> str:
    from sglang_dev.tiny_models import DEFAULT_FAMILY, tiny_model_path

    return str(tiny_model_path(family or DEFAULT_FAMILY, size=size))


def targets(args: argparse.Namespace) -> list[tuple[str, str]]:
    out = []
    for engine in args.engines.split(","):
        if engine == "ours":
            out += [("ours", mode) for mode in args.modes.split(",")]
        else:
            out.append((engine, ""))
    return out


def compute_dtype(dtype: str) -> str:
    """The dtype our engine computes in on this CPU for ``--dtype`` (the matmul peak's dtype), by
    the engine's own rule: on a CPU ``auto`` does not depend on what the checkpoint declares."""
    return dtype_name(resolve_dtype(dtype, transformers.PretrainedConfig(), "cpu").dtype)


def our_server_args(args: argparse.Namespace) -> argparse.Namespace:
    """Our server's flags, read by the server's own parser: ``--server-args`` follows the
    benchmark's own ``--dtype`` on its command line, so the last of them wins."""
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(add_help=False)
    ServerArgs.add_cli_args(parser)
    flags = ["--dtype", args.dtype, *args.server_args.split()]
    return parser.parse_known_args(flags)[0]


def our_dtype(args: argparse.Namespace) -> str:
    """The ``--dtype`` our server runs with."""
    return our_server_args(args).dtype


def part_dtypes(args: argparse.Namespace) -> dict[str, str]:
    """The arithmetic each part of a round (``ROUND_PARTS``) runs in, whose matmul peak it is
    counted against: int8 for the linears that take int8 activations (int8dq and 8da4w in the
    language model, the tower too with ``--vision-int8dq``), the compute dtype elsewhere
    (attention always)."""
    from sglang.srt.model_executor.quantization import dynamic_activations

    ours = our_server_args(args)
    compute = compute_dtype(ours.dtype)
    dynamic = bool(ours.torchao_config) and dynamic_activations(ours.torchao_config)
    return {
        "vision_attention": compute,
        "vision_dense": "int8" if dynamic and ours.vision_int8dq else compute,
        "lm_attention": compute,
        "lm_dense": "int8" if dynamic else compute,
    }


def _launch(args: argparse.Namespace, engine: str, mode: str, model_path: str | None) -> Any:
    return launch(
        engine, model_path, mode or "per-image", args.server_args.split(), dtype=args.dtype
    )


def _peer_failed(failures: list[dict[str, str]], engine: str, exc: Exception) -> None:
    failures.append({"engine": engine, "error": f"{type(exc).__name__}: {exc}"[-2000:]})
    print(f"peer {engine} failed: {failures[-1]['error']}")


def _run(
    server: Any, mode: str, resolution: str, start: float, rows: list[dict[str, Any]]
) -> dict[str, Any]:
    """One engine's rounds at one resolution, as the results list them."""
    return {
        "engine": server.engine,
        "label": server.label,
        "mode": mode or None,
        "resolution": resolution,
        "startup_s": server.startup_s,
        "wall_s": time.perf_counter() - start,
        "rounds": rows,
    }


def play_interleaved(
    args: argparse.Namespace,
    plan: list[tuple[str, str]],
    model_path: str | None,
    resolutions: list[str],
    rounds: int,
    common: dict[str, Any],
) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    """``--interleave``: launch every engine of the plan, then play each resolution's
    conversations on all of them round by round (``interleaved_rounds``); a peer that fails to
    start is left out and reported."""
    runs: list[dict[str, Any]] = []
    failures: list[dict[str, str]] = []
    with ExitStack() as stack, httpx.Client(timeout=3600) as client:
        servers, modes = [], {}
        for engine, mode in plan:
            try:
                server = stack.enter_context(_launch(args, engine, mode, model_path))
            except (RuntimeError, TimeoutError, OSError) as exc:
                if engine == "ours":
                    raise
                _peer_failed(failures, engine, exc)
                continue
            servers.append(server)
            modes[server.label] = mode
        for res in resolutions:
            start = time.perf_counter()
            played = interleaved_rounds(
                servers, client, parse_resolution(res), rounds, args.repeats, **common
            )
            for server in servers:
                rows = best_of(played[server.label])
                runs.append(_run(server, modes[server.label], res, start, rows))
    return runs, failures


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", choices=PRESETS, default="full")
    p.add_argument("--quick", action="store_true", help="same as --preset quick")
    p.add_argument("--resolutions", help="comma-separated WxH (default: the preset's)")
    p.add_argument("--rounds", type=int)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--repeats", type=int, default=1, help="play each conversation N times; "
                   "report per round the repetition with the lowest TTFT")  # fmt: skip
    p.add_argument("--model-path", help="model folder (default: the embedded Qwen2.5-VL)")
    p.add_argument("--model-size", choices=("tiny", "small"), help="embedded model size")
    p.add_argument("--family", help="embedded model family (default qwen2_5_vl; e.g. qwen3_5)")
    p.add_argument("--think-mode", choices=THINK_MODES, default="none",
                   help="qwen3: send chat_template_kwargs {enable_thinking: false}")  # fmt: skip
    p.add_argument("--modes", default=",".join(CACHE_MODES))
    p.add_argument("--engines", default="ours", help="ours,vllm,hf (peers need their venvs)")
    p.add_argument("--server-args", default="", help="extra flags for our server")
    p.add_argument(
        "--dtype", default="float32", help="every launched engine's dtype (e.g. bfloat16)"
    )
    p.add_argument("--base-url", help="use a running server instead of launching")
    p.add_argument("--label", default="external", help="label of the --base-url server")
    p.add_argument("--out", default="benchmark/results/multiturn_image")
    p.add_argument("--no-probe", action="store_true", help="skip the matmul peak probe")
    p.add_argument("--interleave", action="store_true",
                   help="launch every engine at once and play their rounds in turn (ratios "
                   "robust to slow spells of the machine)")  # fmt: skip
    args = p.parse_args(argv)
    cpu, gpu = cpu_info(), gpu_info()
    print(cpu_line(cpu))
    if gpu:
        print(gpu_line(gpu))
    preset = PRESETS["quick" if args.quick else args.preset]
    resolutions = (args.resolutions or preset["resolutions"]).split(",")
    rounds = args.rounds or preset["rounds"]
    model_path = args.model_path or (
        None if args.base_url else default_model(args.model_size or preset["size"], args.family)
    )
    # int8dq's linears multiply int8: its MFU is counted against vpdpbusd's own rate, and each
    # part of a round against the peak of its own arithmetic
    dtypes = part_dtypes(args)
    probes = {} if args.no_probe else {d: matmul_peak_gflops(dtype=d) for d in {*dtypes.values()}}
    peak = probes.get(dtypes["lm_dense"])
    bandwidth = None if args.no_probe else memory_bandwidth_gbs()
    extra = think_mode_body(args.think_mode)
    plan = [("external", "")] if args.base_url else targets(args)
    runs: list[dict[str, Any]] = []
    failures: list[dict[str, str]] = []
    out = Path(args.out)
    total = len(plan) * len(resolutions) * rounds * args.repeats
    bar = tqdm(total=total, desc="multiturn_image")
    common = {
        "max_tokens": args.max_tokens, "progress": bar, "extra": extra,
        "peak_gflops": peak["gflop_per_s"] if peak else None,
        "part_peaks": {part: probes[d]["gflop_per_s"] if probes else None
                       for part, d in dtypes.items()},
        "bandwidth_gbs": bandwidth["gb_per_s"] if bandwidth else None,
    }  # fmt: skip
    interleaved = args.interleave and not args.base_url
    if interleaved:
        runs, failures = play_interleaved(args, plan, model_path, resolutions, rounds, common)
        plan = []  # played: the loop below plays engines one after the other
    for engine, mode in plan:
        if args.base_url:
            ctx = connect(args.base_url, args.label)
        else:
            ctx = _launch(args, engine, mode, model_path)
        try:
            with ctx as server, httpx.Client(timeout=3600) as client:
                for res in resolutions:
                    bar.set_description(f"{server.label} {res}")
                    start = time.perf_counter()
                    rows = best_of([
                        run_conversation(
                            client, server.base_url, server.model, parse_resolution(res), rounds,
                            image_offset=1000 * k,
                            server_pid=server.proc.pid if server.proc else None, **common,
                        )
                        for k in range(args.repeats)
                    ])  # fmt: skip
                    runs.append(_run(server, mode, res, start, rows))
                    write_json(out.with_suffix(".partial.json"), runs)
        except (RuntimeError, TimeoutError, OSError, httpx.HTTPError) as exc:
            if engine == "ours" or args.base_url:
                raise
            _peer_failed(failures, engine, exc)
    bar.close()
    summary = summarize(runs, resolutions)
    result = {
        "benchmark": "multiturn_image",
        "config": {
            "resolutions": resolutions,
            "rounds": rounds,
            "max_tokens": args.max_tokens,
            "repeats": args.repeats,
            "think_mode": args.think_mode,
            "model_path": model_path,
            "engines": [run["label"] for run in runs if run["resolution"] == resolutions[0]],
            "interleaved": interleaved,
            "matmul_peak": peak,
            "matmul_peaks": probes,
            "part_dtypes": dtypes,
            "memory_bandwidth": bandwidth,
            "cpu": cpu,
            "gpu": gpu,
        },
        "runs": runs,
        "failures": failures,
        "summary": summary,
        "goals": goals(summary),
    }
    write_json(out.with_suffix(".json"), result)
    out.with_suffix(".partial.json").unlink(missing_ok=True)
    md = markdown(runs, summary)
    if peak and bandwidth:
        md = (
            f"matmul peak (probe): {peak['gflop_per_s']:.1f} GFLOP/s "
            f"({peak['dtype']}, "
            + (f"{peak['size']}^3" if peak["size"] else peak.get("instruction", ""))
            + f", {peak['threads']} threads"
            + (
                f"; torch {peak['torch_gflop_per_s']:.1f}, native {peak['native_gflop_per_s']:.1f}"
                if "native_gflop_per_s" in peak
                else ""
            )
            + "); memory bandwidth "
            f"(copy probe): {bandwidth['gb_per_s']:.1f} GB/s\n\n" + md
        )
    if interleaved:
        idle = [r["others_cpu_s"] for run in runs for r in run["rounds"] if r.get("others_cpu_s")]
        md = (
            "engines up together, rounds played in turn (--interleave), the idle servers stopped "
            f"meanwhile (CPU they used during a round: at most {max(idle, default=0.0):.2f} s)"
            "\n\n" + md
        )
    md = cpu_line(cpu) + "\n\n" + (gpu_line(gpu) + "\n\n" if gpu else "") + md
    out.with_suffix(".md").write_text(md)
    plot(runs, resolutions, out.with_suffix(".png"))
    print(md)
    print("goals:", result["goals"])
    return result


if __name__ == "__main__":
    main()
