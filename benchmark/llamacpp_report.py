"""The llama.cpp comparison's results: per server label the medians and best rounds, ours over
llama's per width, where our image-chat rounds go (tower attention, the rest of the tower, the
language model's attention and the rest of its forward, each against the peak of its own
arithmetic), the markdown table and the plot."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from benchmark.lib.counters import ROUND_PARTS
from benchmark.lib.hardware import cpu_line
from benchmark.lib.report import markdown_table, pyplot, ratio
from benchmark.multiturn_report import best_of

GIB_MB = 1024.0
PART_NAMES = {
    "vision_attention": "tower attention",
    "vision_dense": "tower rest",
    "lm_attention": "LM attention",
    "lm_dense": "LM rest",
}


def _median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def _mean(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.fmean(known) if known else None


def chat_summary(repeats: list[list[dict[str, Any]]]) -> dict[str, Any]:
    """One resolution's rounds over the repeats: TTFT per round (best repeat), its mean, and
    each part's mean ms and fraction of its peak over those rounds (ours only: llama-server
    has no counters, its parts stay None)."""
    rounds = best_of(repeats)
    ttft = [e["ttft_ms"] for e in rounds]
    parts = {}
    for part in ROUND_PARTS:
        parts[f"{part}_ms"] = _mean([e.get(f"{part}_ms") for e in rounds])
        parts[f"{part}_of_peak"] = _mean([e.get(f"{part}_of_peak") for e in rounds])
    parts["mfu_at_part_peaks"] = _mean([e.get("mfu_at_part_peaks") for e in rounds])
    return {
        "ttft_ms": ttft,
        "ttft_mean_ms": statistics.fmean(ttft) if ttft else None,
        "prompt_tokens": [e["prompt_tokens"] for e in rounds],
        "cached_tokens": [e["cached_tokens"] for e in rounds],
        "parts": parts,
    }


def aggregate(runs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per label: median decode tok/s over every request, per resolution the chat's summary
    (``chat_summary``), median RSS once ready and after the requests."""
    out: dict[str, dict[str, Any]] = {}
    for label in dict.fromkeys(r["label"] for r in runs):
        mine = [r for r in runs if r["label"] == label]
        resolutions = list(dict.fromkeys(res for r in mine for res in r["chats"]))
        out[label] = {
            "engine": mine[0]["engine"],
            "width": mine[0]["width"],
            "decode_tok_per_s": _median([d["decode_tok_per_s"] for r in mine for d in r["decode"]]),
            "chat": {
                res: chat_summary([r["chats"][res] for r in mine if res in r["chats"]])
                for res in resolutions
            },  # fmt: skip
            "rss_ready_mb": _median([r["rss_ready"]["rss_mb"] for r in mine]),
            "rss_after_mb": _median([r["rss_after"]["rss_mb"] for r in mine]),
            "anon_after_mb": _median([r["rss_after"]["anon_mb"] for r in mine]),
            "startup_s": _median([r["startup_s"] for r in mine]),
        }
    return out


def ratios(
    per_label: dict[str, dict[str, Any]], labels: dict[str, tuple[str, str]]
) -> dict[str, dict[str, Any]]:
    """ours / llama per width (``labels``: width -> (our label, llama's label); decode: above 1
    is faster; TTFT and RSS: below 1 is better)."""
    out = {}
    for width, (our_label, llama_label) in labels.items():
        ours, llama = per_label.get(our_label), per_label.get(llama_label)
        if not ours or not llama:
            continue
        keys = {"decode": "decode_tok_per_s", "rss_ready": "rss_ready_mb",
                "rss_after": "rss_after_mb"}  # fmt: skip
        out[width] = {name: ratio(ours[key], llama[key]) for name, key in keys.items()}
        shared = [res for res in ours["chat"] if res in llama["chat"]]
        out[width]["ttft_mean"] = {
            res: ratio(ours["chat"][res]["ttft_mean_ms"], llama["chat"][res]["ttft_mean_ms"])
            for res in shared
        }
        out[width]["ttft_per_round"] = {
            res: [ratio(a, b) for a, b in zip(ours["chat"][res]["ttft_ms"],
                                              llama["chat"][res]["ttft_ms"])]
            for res in shared
        }  # fmt: skip
    return out


def _main_table(result: dict[str, Any]) -> str:
    per, rat, cfg = result["per_label"], result["ratios"], result["config"]
    resolutions = cfg["resolutions"]
    rows = []
    for width, pair in cfg["labels"].items():
        for label in pair:
            if label in per:
                p = per[label]
                ttft = [(p["chat"].get(res) or {}).get("ttft_mean_ms") for res in resolutions]
                rows.append([label, p["decode_tok_per_s"], *ttft, p["rss_ready_mb"] / GIB_MB,
                             p["rss_after_mb"] / GIB_MB, p["startup_s"]])  # fmt: skip
        if width in rat:
            r = rat[width]
            rows.append([f"ours/llama {width}", r["decode"],
                         *(r["ttft_mean"].get(res) for res in resolutions), r["rss_ready"],
                         r["rss_after"], None])  # fmt: skip
    head = ["server", "decode tok/s (batch 1)",
            *(f"TTFT mean ms {res}" for res in resolutions), "RSS ready GiB", "RSS after GiB",
            "start-up s"]  # fmt: skip
    return markdown_table(head, rows)


def _parts_table(result: dict[str, Any]) -> str:
    """Our labels' rounds by part: mean ms, and (in brackets) the rate over the part's peak."""
    rows = []
    for label, p in result["per_label"].items():
        for res, chat in p["chat"].items() if p["engine"] == "ours" else ():
            parts = chat["parts"]
            cells = []
            for part in ROUND_PARTS:
                ms, of_peak = parts[f"{part}_ms"], parts[f"{part}_of_peak"]
                share = f" ({of_peak:.2f})" if of_peak is not None else ""
                cells.append(f"{ms:.0f}{share}" if ms is not None else "-")
            rows.append([label, res, chat["ttft_mean_ms"], *cells, parts["mfu_at_part_peaks"]])
    head = ["server", "resolution", "TTFT mean ms",
            *(f"{PART_NAMES[part]} ms (of peak)" for part in ROUND_PARTS),
            "MFU at part peaks"]  # fmt: skip
    return markdown_table(head, rows)


def markdown(result: dict[str, Any]) -> str:
    per, cfg = result["per_label"], result["config"]
    peaks = ", ".join(f"{d} {v:.0f}" for d, v in (cfg.get("peaks_gflop_per_s") or {}).items())
    text = (
        f"{cpu_line(result['cpu'])}\n\n{cfg['llama_server_version']}\n\n"
        f"checkpoint {cfg['model_path']} ({cfg['shape']}, {cfg['layers']} layers, vision depth "
        f"{cfg['vision_depth']}); our --dtype {cfg['dtype']} (computes in "
        f"{cfg.get('compute_dtype')}); {cfg['repeats']} repeat(s); decode: {cfg['max_tokens']} "
        f"tokens; image chat: {cfg['rounds']} rounds at {', '.join(cfg['resolutions'])}\n\n"
        + _main_table(result)
        + "\n\nWhere our rounds go (mean over the rounds, best repeat per round; in brackets the "
        f"part's rate over its arithmetic's matmul peak, GFLOP/s: {peaks or 'not probed'}):\n\n"
        + _parts_table(result)
    )
    labels = list(per)
    for res in cfg["resolutions"]:
        series = [(per[lb]["chat"].get(res) or {}).get("ttft_ms") or [] for lb in labels]
        n = max((len(s) for s in series), default=0)
        rows = [[r, *(s[r] if r < len(s) else None for s in series)] for r in range(n)]
        text += f"\n\nTTFT per round at {res}, ms (best repeat):\n\n"
        text += markdown_table(["round", *labels], rows)
    text += "\n"
    for f in result["failures"]:
        text += f"\nfailed: {f['label']} (repeat {f['repeat']}): {f['error'][-300:]}\n"
    return text


def plot(result: dict[str, Any], path: Path) -> None:
    plt = pyplot()
    per, cfg = result["per_label"], result["config"]
    widths, resolutions = list(cfg["labels"]), cfg["resolutions"]
    panels = 2 + len(resolutions)
    fig, axes = plt.subplots(1, panels, figsize=(4 * panels, 3.4))
    decode_ax, rss_ax, chat_axes = axes[0], axes[1], axes[2:]
    xs = range(len(widths))
    for offset, side in ((-0.2, 0), (0.2, 1)):
        keys = [cfg["labels"][w][side] for w in widths]
        decode_ax.bar([x + offset for x in xs], [(per.get(k) or {}).get("decode_tok_per_s")
                      or 0 for k in keys], 0.4, label=("ours", "llama.cpp")[side])  # fmt: skip
        rss_ax.bar([x + offset for x in xs], [((per.get(k) or {}).get("rss_after_mb") or 0)
                   / GIB_MB for k in keys], 0.4, label=("ours", "llama.cpp")[side])  # fmt: skip
    for ax, res in zip(chat_axes, resolutions):
        for label, p in per.items():
            ttft = (p["chat"].get(res) or {}).get("ttft_ms") or []
            ax.plot(range(len(ttft)), ttft, marker="o", ms=3, label=label,
                    linestyle="-" if p["engine"] == "ours" else "--")  # fmt: skip
        ax.set_title(f"image chat at {res}", fontsize=9)
        ax.set_ylabel("TTFT (ms)")
        ax.set_xlabel("round")
    decode_ax.set_ylabel("decode tokens / s (batch 1)")
    rss_ax.set_ylabel("RSS after the requests (GiB)")
    for ax in (decode_ax, rss_ax):
        ax.set_xticks(list(xs), widths)
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    fig.suptitle(cpu_line(result["cpu"]), fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=70)
    plt.close(fig)
