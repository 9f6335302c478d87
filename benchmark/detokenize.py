"""Cost of one streamed event's text: the whole output decoded at each event vs the incremental
detokenizer's window.

One stream of N tokens (mixed English, accented and CJK text), one event per token, as
``stream_interval`` 1 streams it. "whole" is what streaming did before the incremental
detokenizer: decode all the ids so far, hold back what may become a stop string, strip a trailing
incomplete character, send what is new. "incremental" is ``IncrementalDetokenizer.feed``. Each
event is timed; the figures are medians over the events around token 10 and token N, and over
the repeats. Tokenizer: the embedded tiny model's byte-level BPE (short tokens: more tokens per
character than a real vocabulary, so more ids per decode).

    python -m benchmark.detokenize --quick
    python -m benchmark.detokenize --tokens 4000 --repeats 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path
from typing import Any

from tqdm import tqdm

from benchmark.lib.hardware import cpu_info, cpu_line
from benchmark.lib.report import markdown_table, pyplot, write_results

PRESETS: dict[str, dict[str, Any]] = {
    "quick": {"tokens": 500, "repeats": 1},
    "full": {"tokens": 4000, "repeats": 5},
}
TEXT = (
    " The quick brown fox jumps over the lazy dog, naïve café déjà vu; 東京の天気は晴れです。"
    " Numbers 12345 and symbols --> ok. 日本語テキストを少し。 Ünïcödé text goes on and on."
)
STOP = ["</answer>"]  # held back while streaming, as a request with a stop string is
AROUND = 10  # events on each side of a reported position


def whole_decode_event(tokenizer: Any, ids: list[int], params: Any, sent: str) -> str:
    """The text an event sent before the incremental detokenizer (its delta)."""
    text = tokenizer.decode(
        ids,
        skip_special_tokens=params.skip_special_tokens,
        spaces_between_special_tokens=params.spaces_between_special_tokens,
    )
    hold = max((len(s) for s in params.stop or []), default=1) - 1
    text = text[: len(text) - hold].rstrip("\ufffd")
    return text[len(sent) :] if text.startswith(sent) else ""


def time_whole(tokenizer: Any, ids: list[int], params: Any) -> tuple[list[float], str]:
    micros, sent = [], ""
    for n in range(1, len(ids) + 1):
        start = time.perf_counter()
        sent += whole_decode_event(tokenizer, ids[:n], params, sent)
        micros.append((time.perf_counter() - start) * 1e6)
    return micros, sent


def time_incremental(tokenizer: Any, ids: list[int], params: Any) -> tuple[list[float], str]:
    from sglang.srt.managers.detokenizer import IncrementalDetokenizer
    from sglang.srt.sampling.stop_strings import skipped_token_ids

    detokenizer = IncrementalDetokenizer(tokenizer, params, skipped_token_ids(tokenizer))
    micros = []
    for token in ids:
        start = time.perf_counter()
        detokenizer.feed([token])
        micros.append((time.perf_counter() - start) * 1e6)
    return micros, detokenizer.text


def measure(tokenizer: Any, ids: list[int], repeats: int, bar: tqdm) -> dict[str, list[float]]:
    """Per-event microseconds, the median over the repeats of each event (interleaved)."""
    from sglang.srt.sampling.sampling_params import SamplingParams

    params = SamplingParams.from_dict({"stop": STOP})
    runs: dict[str, list[list[float]]] = {"whole": [], "incremental": []}
    for _ in range(repeats):
        whole, whole_text = time_whole(tokenizer, ids, params)
        incremental, incremental_text = time_incremental(tokenizer, ids, params)
        final = tokenizer.decode(ids)
        assert final.startswith(whole_text) and final.startswith(incremental_text)
        runs["whole"].append(whole)
        runs["incremental"].append(incremental)
        bar.update(1)
    return {label: [statistics.median(e) for e in zip(*r)] for label, r in runs.items()}


def around(micros: list[float], token: int) -> float:
    """Median per-event microseconds over the events near ``token`` (1-based)."""
    lo = max(0, token - 1 - AROUND)
    return statistics.median(micros[lo : min(len(micros), token + AROUND)])


def bucket_medians(micros: list[float], buckets: int = 100) -> list[tuple[int, float]]:
    """(last token of the bucket, median µs per event in it) for ``buckets`` equal buckets."""
    size = max(1, len(micros) // buckets)
    ends = range(size, len(micros) + 1, size)
    return [(end, round(statistics.median(micros[end - size : end]), 2)) for end in ends]


def plot(results: list[dict[str, Any]], path: Path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.2))
    for r in results:
        xs, ys = zip(*r["per_event_us_by_bucket"])
        ax.plot(xs, ys, label=r["method"])
    ax.set_yscale("log")
    ax.set_xlabel("streamed token")
    ax.set_ylabel("µs per event")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=70)
    plt.close(fig)


def markdown(result: dict[str, Any]) -> str:
    head = ["method", *(f"µs/event at token {t}" for t in result["config"]["positions"]),
            "whole stream ms"]  # fmt: skip
    rows = [
        [r["method"], *r["us_per_event"], r["stream_ms"]] for r in result["results"]
    ]  # fmt: skip
    return f"{result['cpu']}\n\n" + markdown_table(head, rows) + "\n"


def stream_ids(tokenizer: Any, tokens: int) -> list[int]:
    once = tokenizer(TEXT, add_special_tokens=False)["input_ids"]
    return (once * (tokens // len(once) + 1))[:tokens]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", choices=PRESETS, default="full")
    p.add_argument("--quick", action="store_true", help="same as --preset quick")
    p.add_argument("--tokens", type=int, help="tokens in the stream")
    p.add_argument("--repeats", type=int)
    p.add_argument("--model-path", help="where the tokenizer is (default: the tiny model)")
    p.add_argument("--out", default="results/detokenize")
    args = p.parse_args(argv)
    preset = PRESETS["quick" if args.quick else args.preset]
    tokens, repeats = args.tokens or preset["tokens"], args.repeats or preset["repeats"]
    if args.model_path is None:
        from benchmark.multiturn_image import default_model

        args.model_path = default_model("tiny")
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.model_path)
    ids = stream_ids(tokenizer, tokens)
    positions = [10, tokens]
    load_before = os.getloadavg()
    with tqdm(total=repeats, desc="detokenize") as bar:
        per_event = measure(tokenizer, ids, repeats, bar)
    result = {
        "benchmark": "detokenize",
        "cpu": cpu_line(cpu_info()),
        "config": {
            "model_path": args.model_path,
            "tokens": tokens,
            "characters": len(tokenizer.decode(ids)),
            "repeats": repeats,
            "positions": positions,
            "stop": STOP,
            "cpu_count": os.cpu_count(),
            "load_average_before": load_before,
            "load_average_after": os.getloadavg(),
        },
        "results": [
            {
                "method": label,
                "us_per_event": [around(micros, t) for t in positions],
                "stream_ms": sum(micros) / 1e3,
                "per_event_us_by_bucket": bucket_medians(micros),
            }
            for label, micros in per_event.items()
        ],
    }
    write_results(args.out, result, markdown(result), lambda png: plot(result["results"], png))
    return result


if __name__ == "__main__":
    main()
