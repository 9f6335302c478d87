"""Benchmark output: percentiles, JSON and Markdown results, best-of timing, tables, ratios and
plots."""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np


def percentiles(values: Iterable[float], scale: float = 1e3) -> dict[str, float]:
    """mean / median / p99 (and count) of ``values`` scaled (default: seconds -> ms)."""
    vals = sorted(v * scale for v in values)
    if not vals:
        return {"mean": 0.0, "median": 0.0, "p99": 0.0, "n": 0}
    p99 = float(np.percentile(vals, 99))
    return {
        "mean": statistics.fmean(vals),
        "median": statistics.median(vals),
        "p99": p99,
        "n": len(vals),
    }


def write_json(path: str | Path, data: Any) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, default=_json_default) + "\n")
    return path


def write_results(
    out: str | Path, result: dict[str, Any], md: str, plot: Callable[[Path], Any] | None = None
) -> None:
    """``out``.json, ``out``.md (printed too) and, with ``plot``, ``out``.png."""
    out = Path(out)
    write_json(out.with_suffix(".json"), result)
    out.with_suffix(".md").write_text(md)
    if plot is not None:
        plot(out.with_suffix(".png"))
    print(md)


def best_seconds(
    calls: dict[str, Callable[[], Any]], repeats: int, tick: Callable[[], Any] | None = None
) -> dict[str, float]:
    """Best wall time of each call over ``repeats`` rounds in which the calls alternate (after
    one warm-up call each), so slow phases of a shared machine hit every call alike; ``tick``
    after each timed call (a progress bar's update)."""
    for call in calls.values():
        call()
    best = dict.fromkeys(calls, float("inf"))
    for _ in range(repeats):
        for name, call in calls.items():
            started = time.perf_counter()
            call()
            best[name] = min(best[name], time.perf_counter() - started)
            if tick is not None:
                tick()
    return best


def run_and_write(
    args: Any,
    run: Callable[[Any], dict[str, Any]],
    markdown: Callable[[dict[str, Any]], str],
    plot: Callable[[dict[str, Any], Path], Any] | None = None,
) -> dict[str, Any]:
    """``run(args)`` timed (``wall_s``), then its results written to ``args.out`` (JSON, table,
    and with ``plot`` a PNG); returns the result."""
    started = time.perf_counter()
    result = run(args)
    result["wall_s"] = time.perf_counter() - started
    draw = (lambda png: plot(result, png)) if plot is not None else None
    write_results(args.out, result, markdown(result), draw)
    return result


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "__dataclass_fields__"):
        return asdict(obj)
    if isinstance(obj, (np.integer, np.floating)):
        return obj.item()
    raise TypeError(f"not JSON serialisable: {type(obj)}")


def markdown_table(headers: list[str], rows: list[list[Any]]) -> str:
    def fmt(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:.3g}" if abs(v) < 1 else f"{v:.1f}"
        return "-" if v is None else str(v)

    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def ratio(a: float | None, b: float | None) -> float | None:
    return None if not a or not b else a / b


def pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
