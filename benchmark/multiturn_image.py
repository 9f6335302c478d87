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
from benchmark.lib.report import write_json
from benchmark.multiturn_report import best_of, goals, plot, report_markdown, summarize
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


def _parser() -> argparse.ArgumentParser:
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
    p.add_argument("--out", default="results/multiturn_image")
    p.add_argument("--no-probe", action="store_true", help="skip the matmul peak probe")
    p.add_argument("--interleave", action="store_true",
                   help="launch every engine at once and play their rounds in turn (ratios "
                   "robust to slow spells of the machine)")  # fmt: skip
    return p


def play_in_sequence(
    args: argparse.Namespace,
    plan: list[tuple[str, str]],
    model_path: str | None,
    resolutions: list[str],
    rounds: int,
    common: dict[str, Any],
    partial: Path,
) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    """One engine after the other (or the ``--base-url`` server), each resolution's
    conversation ``--repeats`` times; the runs so far are written to ``partial`` as they end."""
    runs: list[dict[str, Any]] = []
    failures: list[dict[str, str]] = []
    bar = common["progress"]
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
                    write_json(partial, runs)
        except (RuntimeError, TimeoutError, OSError, httpx.HTTPError) as exc:
            if engine == "ours" or args.base_url:
                raise
            _peer_failed(failures, engine, exc)
    return runs, failures


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = _parser().parse_args(argv)
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
    plan = [("external", "")] if args.base_url else targets(args)
    out = Path(args.out)
    bar = tqdm(total=len(plan) * len(resolutions) * rounds * args.repeats, desc="multiturn_image")
    common = {
        "max_tokens": args.max_tokens, "progress": bar, "extra": think_mode_body(args.think_mode),
        "peak_gflops": peak["gflop_per_s"] if peak else None,
        "part_peaks": {part: probes[d]["gflop_per_s"] if probes else None
                       for part, d in dtypes.items()},
        "bandwidth_gbs": bandwidth["gb_per_s"] if bandwidth else None,
    }  # fmt: skip
    interleaved = args.interleave and not args.base_url
    if interleaved:
        runs, failures = play_interleaved(args, plan, model_path, resolutions, rounds, common)
    else:
        partial = out.with_suffix(".partial.json")
        runs, failures = play_in_sequence(
            args, plan, model_path, resolutions, rounds, common, partial
        )
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
    md = report_markdown(result)
    out.with_suffix(".md").write_text(md)
    plot(runs, resolutions, out.with_suffix(".png"))
    print(md)
    print("goals:", result["goals"])
    return result


if __name__ == "__main__":
    main()
