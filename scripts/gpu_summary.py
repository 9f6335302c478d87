"""The summary of a ``scripts/gpu_check.sh`` run: ``OUT/gpu_check.json``.

It names the GPU and the software, lists every CUDA test with its outcome (and those of the fp8
KV and video modules, run with their engines on the GPU), carries the tests'
measurements (``cuda_tests.json``) and, from the multiturn_image run, TTFT and encoder work per
round per cache mode with the round-7 ratio per-image / combined beside the published H200 one
(Qwen3-VL-8B at 720p: 516 ms after the per-image cache, 685 ms before).
"""

from __future__ import annotations

import argparse
import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

SEED_ROUND7_RATIO = round(516 / 685, 3)


def test_outcomes(xml_path: Path) -> dict[str, Any]:
    if not xml_path.is_file():
        return {"error": f"{xml_path.name} missing (the test run did not finish)"}
    cases = []
    for case in ET.parse(xml_path).getroot().iter("testcase"):
        outcome, message = "passed", None
        for tag in ("failure", "error", "skipped"):
            node = case.find(tag)
            if node is not None:
                outcome, message = tag, (node.get("message") or "")[:500]
        cases.append({"test": case.get("name"), "outcome": outcome, "message": message,
                      "seconds": float(case.get("time") or 0)})  # fmt: skip
    counts: dict[str, int] = {}
    for case in cases:
        counts[case["outcome"]] = counts.get(case["outcome"], 0) + 1
    return {"counts": counts, "cases": cases}


def benchmark_rounds(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        partial = path.with_suffix(".partial.json")
        if not partial.is_file():
            return None
        return {"partial": True, "runs": _runs(json.loads(partial.read_text()))}
    result = json.loads(path.read_text())
    runs = _runs(result["runs"])
    out: dict[str, Any] = {"gpu": result["config"].get("gpu"), "runs": runs}
    per_image, combined = runs.get("ours:per-image"), runs.get("ours:combined")
    if per_image and combined:
        last = min(len(per_image["ttft_ms"]), len(combined["ttft_ms"])) - 1
        out["round"] = last
        out["per_image_over_combined"] = round(
            per_image["ttft_ms"][last] / combined["ttft_ms"][last], 3
        )
        out["seed_h200_qwen3_vl_8b_ratio"] = SEED_ROUND7_RATIO
    return out


ROUND_FIELDS = ("ttft_ms", "encoder_ms", "encoded_items", "encoder_calls", "vision_ms", "lm_ms",
                "prompt_tokens", "cached_tokens", "gc_ms")  # fmt: skip


def _runs(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per run, each field of ``ROUND_FIELDS`` as a list over the rounds."""
    return {
        run["label"]: {field: [r.get(field) for r in run["rounds"]] for field in ROUND_FIELDS}
        for run in runs
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    p.add_argument("--tests-rc", type=int, required=True)
    p.add_argument("--tests-s", type=float, required=True)
    p.add_argument("--suites-rc", type=int, required=True)
    p.add_argument("--suites-s", type=float, required=True)
    p.add_argument("--bench-rc", type=int, required=True)
    p.add_argument("--bench-s", type=float, required=True)
    args = p.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from benchmark.lib.hardware import gpu_info

    report = args.out / "cuda_tests.json"
    summary = {
        "gpu": gpu_info(),
        "tests": {
            "exit_code": args.tests_rc,
            "seconds": args.tests_s,
            **test_outcomes(args.out / "cuda_tests.xml"),
            "measurements": json.loads(report.read_text()) if report.is_file() else None,
        },
        "engine_on_gpu_suites": {
            "modules": ["test/test_kv_fp8.py", "test/test_video.py"],
            "exit_code": args.suites_rc,
            "seconds": args.suites_s,
            **test_outcomes(args.out / "gpu_suites.xml"),
        },
        "multiturn_image_720p_7b": {
            "exit_code": args.bench_rc,
            "seconds": args.bench_s,
            **(benchmark_rounds(args.out / "multiturn_image_gpu.json") or {}),
        },
    }
    (args.out / "gpu_check.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps({k: summary[k] for k in ("gpu",)}, indent=2))
    print("tests:", summary["tests"].get("counts"),
          "| suites:", summary["engine_on_gpu_suites"].get("counts"), "| benchmark ratio:",
          summary["multiturn_image_720p_7b"].get("per_image_over_combined"))  # fmt: skip
    return summary


if __name__ == "__main__":
    main()
