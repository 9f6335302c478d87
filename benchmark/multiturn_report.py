"""The multi-turn image chat's results: the best repetition per round, the side-by-side
ratios and goals per resolution, the Markdown report and the TTFT plot."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmark.lib.counters import ROUND_PARTS
from benchmark.lib.hardware import cpu_line, gpu_line
from benchmark.lib.report import markdown_table, pyplot, ratio


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


PART_NAMES = {
    "vision_attention": "ViT attn",
    "vision_dense": "ViT rest",
    "lm_attention": "LM attn",
    "lm_dense": "LM rest",
}


# (intro, the key a round must have for a row, column -> key) of the tables of our runs'
# counters, in the order they are printed
_COUNTER_TABLES: tuple[tuple[str, str, dict[str, str]], ...] = (
    (
        "achieved rate (matmul peak from the probe at start):",
        "vision_ms",
        {
            "ViT ms": "vision_ms",
            "ViT GFLOP/s": "vision_gflop_per_s",
            "ViT / peak": "vision_of_peak",
            "LM attn ms": "lm_attention_ms",
            "LM attn GFLOP/s": "lm_attention_gflop_per_s",
            "LM attn / peak": "lm_attention_of_peak",
        },
    ),
    (
        "model FLOPs utilisation and where TTFT went (ms); decode against the copy-probe "
        "bandwidth; the compute process's garbage collection over the whole round:",
        "round_gflops",
        {
            "TTFT": "ttft_ms",
            "GFLOP": "round_gflops",
            "MFU": "mfu",
            "API+other": "api_other_ms",
            "preprocess": "preprocess_ms",
            "ViT": "vision_ms",
            "LM": "lm_ms",
            "sampling": "sampling_ms",
            "decode ms/step": "decode_ms_per_step",
            "decode / bandwidth": "decode_of_bandwidth",
            "GC ms (round)": "gc_ms",
        },
    ),
    (
        "MFU per part: each part's ms and its rate over the peak of the arithmetic it "
        "runs in (config.part_dtypes); MFU at part peaks = the round at every part's "
        "peak over TTFT:",
        "mfu_at_part_peaks",
        {
            "MFU": "mfu",
            "MFU at part peaks": "mfu_at_part_peaks",
            **{
                f"{PART_NAMES[part]} {label}": f"{part}_{key}"
                for part in ROUND_PARTS
                for key, label in (("ms", "ms"), ("of_peak", "/ peak"))
            },
        },
    ),
)


def markdown(runs: list[dict[str, Any]], summary: dict[str, Any]) -> str:
    """Per resolution: TTFT and encoder work per round, then (where the runs measured them)
    the achieved rates, where TTFT went and MFU per part, and the summary's ratios."""
    labels = list(dict.fromkeys(run["label"] for run in runs))
    parts = []
    for res, s in summary.items():
        by = {run["label"]: run["rounds"] for run in runs if run["resolution"] == res}
        parts += _resolution_tables(res, by, labels, s)
    return "\n\n".join(parts) + "\n"


def _resolution_tables(
    res: str, by: dict[str, list[dict[str, Any]]], labels: list[str], summary: dict[str, Any]
) -> list[str]:
    parts = [f"### {res}\n\n" + _ttft_table(by, labels)]
    first = by.get("ours:per-image") or next(iter(by.values()))
    cache = [f"{e['cached_tokens']}/{e['prompt_tokens']}" for e in first]
    parts.append("cached/prompt tokens (first listed run): " + ", ".join(cache))
    ours = [lb for lb in labels if lb.startswith("ours")]
    for intro, present, columns in _COUNTER_TABLES:
        rows = [
            [lb, r, *[e.get(key) for key in columns.values()]]
            for lb in ours
            for r, e in enumerate(by.get(lb, []))
            if e.get(present) is not None
        ]
        if rows:
            parts.append(intro + "\n\n" + markdown_table(["run", "round", *columns], rows))
    ratios = {k: v for k, v in summary.items() if isinstance(v, float)}
    parts.append("ratios: " + ", ".join(f"{k} = {v:.3f}" for k, v in ratios.items()))
    return parts


def _ttft_table(by: dict[str, list[dict[str, Any]]], labels: list[str]) -> str:
    """TTFT per round and run, our runs' encoded items and encoder ms, and the server CPU
    seconds of the runs that measured them."""
    n = max(len(v) for v in by.values())
    ours = [lb for lb in labels if lb.startswith("ours")]
    cpu_labels = [lb for lb in labels if any(e.get("server_cpu_s") for e in by.get(lb, []))]
    headers = ["round", *[f"{lb} TTFT ms" for lb in labels]]
    headers += [f"{lb} items/enc ms" for lb in ours]
    headers += [f"{lb} server CPU s" for lb in cpu_labels]
    rows = []
    for r in range(n):
        row: list[Any] = [r]
        row += [by[lb][r]["ttft_ms"] if r < len(by.get(lb, [])) else None for lb in labels]
        for lb in ours:
            if r < len(by.get(lb, [])):
                e = by[lb][r]
                row.append(f"{e['encoded_items']} / {e['encoder_ms']:.0f}")
        for lb in cpu_labels:
            rounds = by[lb]
            row.append(rounds[r]["server_cpu_s"] if r < len(rounds) else None)
        rows.append(row)
    return markdown_table(headers, rows)


def report_markdown(result: dict[str, Any]) -> str:
    """The Markdown report of a ``main`` result: the machine, how the engines took turns, the
    probes' peak and bandwidth, then ``markdown``'s tables."""
    config = result["config"]
    md = markdown(result["runs"], result["summary"])
    peak, bandwidth = config["matmul_peak"], config["memory_bandwidth"]
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
    if config["interleaved"]:
        runs = result["runs"]
        idle = [r["others_cpu_s"] for run in runs for r in run["rounds"] if r.get("others_cpu_s")]
        md = (
            "engines up together, rounds played in turn (--interleave), the idle servers stopped "
            f"meanwhile (CPU they used during a round: at most {max(idle, default=0.0):.2f} s)"
            "\n\n" + md
        )
    cpu, gpu = config["cpu"], config["gpu"]
    return cpu_line(cpu) + "\n\n" + (gpu_line(gpu) + "\n\n" if gpu else "") + md


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
