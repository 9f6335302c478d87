"""Cost of grammar constraints per decode step, at several batch sizes.

Runs the offline ``sglang.Engine`` with B requests decoding together, once free and once with
every request constrained by a JSON schema (a receipt with 64 line items: the grammar never ends
inside the measured steps, and it walks objects, strings, integers and enums). Two figures per
batch size: the wall time of a decode step (free vs constrained, medians over interleaved
repeats) and the constraint's own time inside a step (bitmask fill, apply, matcher advance).

    python -m benchmark.constraint_cost --quick
    python -m benchmark.constraint_cost --batches 1,16 --steps 64 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

from tqdm import tqdm

from benchmark.lib.report import markdown_table, write_json

PRESETS: dict[str, dict[str, Any]] = {
    "quick": {"batches": "1,4", "steps": 16, "repeats": 1, "size": "tiny"},
    "full": {"batches": "1,16", "steps": 64, "repeats": 3, "size": "small"},
}

RECEIPT_SCHEMA = {
    "type": "object",
    "properties": {
        "shop": {"type": "string", "maxLength": 16},
        "items": {
            "type": "array",
            "minItems": 64,
            "maxItems": 64,
            "items": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "maxLength": 12},
                    "qty": {"type": "integer", "minimum": 1, "maximum": 99},
                    "kind": {"enum": ["food", "fuel", "tools", "other"]},
                },
                "required": ["name", "qty", "kind"],
                "additionalProperties": False,
            },
        },
    },
    "required": ["shop", "items"],
    "additionalProperties": False,
}


class StepTimer:
    """Times each full-batch decode step and the constraint work inside it."""

    def __init__(self, engine: Any) -> None:
        self.steps: list[tuple[int, float, float]] = []  # (batch size, step s, constraint s)
        self._constraint_s = 0.0
        sched, constraints = engine.scheduler, engine.scheduler.constraints
        step = sched.step

        def timed_step() -> Any:
            self._constraint_s = 0.0
            decoding = bool(sched.running) and not sched.waiting
            decoding = decoding and not any(r.is_prefilling for r in sched.running)
            size = len(sched.running)
            start = time.perf_counter()
            out = step()
            if decoding:
                self.steps.append((size, time.perf_counter() - start, self._constraint_s))
            return out

        for name in ("prepare", "shaped", "accept"):
            setattr(constraints, name, self._timed(getattr(constraints, name)))
        sched.step = timed_step

    def _timed(self, fn: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self._constraint_s += time.perf_counter() - start

        return wrapper

    def take(self, batch: int) -> tuple[list[float], list[float]]:
        full = [(s, c) for size, s, c in self.steps if size == batch]
        self.steps = []
        return [s * 1e3 for s, _ in full], [c * 1e3 for _, c in full]


def run_once(engine: Any, timer: StepTimer, batch: int, steps: int, constrained: bool) -> dict:
    params: dict[str, Any] = {"temperature": 0, "max_new_tokens": steps, "ignore_eos": True}
    if constrained:
        params["json_schema"] = json.dumps(RECEIPT_SCHEMA)
    prompts = [f"Receipt {i}: list every line item as JSON." for i in range(batch)]
    outs = engine.generate(prompts, [params] * batch)
    step_ms, constraint_ms = timer.take(batch)
    assert all(len(o["output_ids"]) == steps for o in outs)
    return {"step_ms": step_ms, "constraint_ms": constraint_ms}


def measure(engine: Any, batches: list[int], steps: int, repeats: int, bar: tqdm) -> list[dict]:
    timer = StepTimer(engine)
    run_once(engine, timer, 1, 4, constrained=True)  # import xgrammar, compile the schema
    results = []
    for batch in batches:
        runs: dict[str, dict[str, list[float]]] = {
            "free": {"step_ms": [], "constraint_ms": []},
            "json_schema": {"step_ms": [], "constraint_ms": []},
        }
        for _ in range(repeats):  # interleaved, so drift in machine load hits both alike
            for label in runs:
                got = run_once(engine, timer, batch, steps, constrained=label != "free")
                for key, values in got.items():
                    runs[label][key] += values
                bar.update(1)
        free, constrained = runs["free"], runs["json_schema"]
        results.append(
            {
                "batch": batch,
                "decode_steps": len(constrained["step_ms"]),
                "free_step_ms": statistics.median(free["step_ms"]),
                "constrained_step_ms": statistics.median(constrained["step_ms"]),
                "constraint_ms_median": statistics.median(constrained["constraint_ms"]),
                "constraint_ms_p90": _p90(constrained["constraint_ms"]),
                "free_constraint_ms_median": statistics.median(free["constraint_ms"]),
                "runs": runs,
            }
        )
    return results


def _p90(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]


def markdown(result: dict[str, Any]) -> str:
    head = ["batch", "decode steps", "free ms/step", "constrained ms/step", "difference ms",
            "constraint work ms/step (median)", "p90", "per request ms"]  # fmt: skip
    rows = []
    for r in result["results"]:
        diff = r["constrained_step_ms"] - r["free_step_ms"]
        per_req = r["constraint_ms_median"] / r["batch"]
        rows.append([r["batch"], r["decode_steps"], r["free_step_ms"], r["constrained_step_ms"],
                     diff, r["constraint_ms_median"], r["constraint_ms_p90"], per_req])  # fmt: skip
    return markdown_table(head, rows) + "\n"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", choices=PRESETS, default="full")
    p.add_argument("--quick", action="store_true", help="same as --preset quick")
    p.add_argument("--batches", help="comma-separated batch sizes")
    p.add_argument("--steps", type=int, help="decode steps per run")
    p.add_argument("--repeats", type=int)
    p.add_argument("--model-path")
    p.add_argument("--model-size", choices=("tiny", "small"))
    p.add_argument("--out", default="results/constraint_cost")
    args = p.parse_args(argv)
    preset = PRESETS["quick" if args.quick else args.preset]
    batches = [int(b) for b in (args.batches or preset["batches"]).split(",")]
    steps, repeats = args.steps or preset["steps"], args.repeats or preset["repeats"]
    if args.model_path is None:
        from benchmark.multiturn_image import default_model

        args.model_path = default_model(args.model_size or preset["size"])
    import sglang

    engine = sglang.Engine(model_path=args.model_path, random_seed=0)
    load_before = os.getloadavg()
    with tqdm(total=2 * repeats * len(batches), desc="constraint_cost") as bar:
        results = measure(engine, batches, steps, repeats, bar)
    result = {
        "benchmark": "constraint_cost",
        "config": {
            "model_path": args.model_path,
            "vocab_size": engine.runner.vocab_size,
            "batches": batches,
            "steps": steps,
            "repeats": repeats,
            "cpu_count": os.cpu_count(),
            "load_average_before": load_before,
            "load_average_after": os.getloadavg(),
            "mask_fill_on_thread": engine.scheduler.constraints.overlap_on_thread,
        },
        "results": results,
    }
    engine.shutdown()
    out = Path(args.out)
    write_json(out.with_suffix(".json"), result)
    out.with_suffix(".md").write_text(markdown(result))
    print(markdown(result))
    return result


if __name__ == "__main__":
    main()
