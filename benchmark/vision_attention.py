"""The vision towers' segment attention on the CPU: the native varlen kernel against the torch
path it replaces (SDPA per run of equal segments) and against its own portable build (the plain
C++ loops a CPU without its vector path gets), side by side, each rate also as a share of the
machine's GEMM rate in the row's dtype; then its effect on one image's encode in the engine.
With ``--device cuda``: the one-call flash varlen path against the same torch path, on the GPU
(timed to the device's completion).

Attention: the Qwen-VL towers' shapes (16 heads x 80) for the layouts their blocks see:
windowed blocks, many 64-token windows (Qwen2.5-VL); full-attention blocks, one segment per
image (1,564 tokens for 640x480 at 28-pixel multiples, 3,600, and 4,784 for 1280x720). FLOPs are
4 * heads * dim * sum of len^2 (the engine's counters do the same); the paths alternate, best of
``--repeats``.

Encode (``--encode``): the checkpoint with Qwen2.5-VL-3B's dims (``benchmark/memory.py``'s 3b
shape, 2 vision blocks: one windowed, one full) in the offline engine; each run encodes a new
1280x720 image (no cache hit) with the tower's attention on the kernel or on torch (the path
``SGLANG_DISABLE_CPU_KERNELS=1`` gives the tower), vision seconds and GFLOP/s from the runner's
counters, best of ``--repeats``.

    python -m benchmark.vision_attention                  # attention only, ~30 s
    python -m benchmark.vision_attention --encode         # and the engine encode, ~1 min more
    python -m benchmark.vision_attention --device cuda --dtypes bfloat16   # on a GPU
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

import torch

from benchmark.lib.hardware import (
    cpu_info,
    cpu_line,
    cuda_matmul_peak_gflops,
    gpu_info,
    gpu_line,
    matmul_peak_gflops,
)
from benchmark.lib.report import best_seconds, markdown_table, write_results
from sglang.srt import kernels
from sglang.srt.models import fast_vision

PATHS = ("kernel", "torch")  # on CUDA "kernel" is the flash varlen call
CPU_PATHS = ("kernel", "portable", "torch")


def _attention_case(
    heads: int, dim: int, lengths: list[int], dtype: torch.dtype, device: str = "cpu"
):
    """Inputs of both paths for one packed sequence; returns {path: callable}."""
    tokens = sum(lengths)
    # as the tower hands them over: (N, heads, dim) storage
    q, k, v = (torch.randn(tokens, heads, dim).to(device, dtype) for _ in range(3))
    cu = torch.tensor([0, *lengths]).cumsum(0).to(device, torch.int32)
    scale = dim**-0.5
    if device == "cuda":
        longest = max(lengths)
        return {
            "kernel": _synced(lambda: fast_vision._segments_on_flash(q, k, v, cu, longest, scale)),
            "torch": _synced(
                lambda: fast_vision._segments_by_runs(q, k, v, cu.tolist(), scale, 0.0)
            ),
        }
    kernel = kernels.load("prefill_attention")
    portable = kernels.load_portable("prefill_attention")
    return {
        "kernel": lambda: fast_vision._segments_on_kernel(kernel, q, k, v, cu, scale),
        "portable": lambda: fast_vision._segments_on_kernel(portable, q, k, v, cu, scale),
        "torch": lambda: fast_vision._segments_by_runs(q, k, v, cu.tolist(), scale, 0.0),
    }


def _synced(call: Any) -> Any:
    def run() -> None:
        call()
        torch.cuda.synchronize()

    return run


def _layout(text: str) -> list[int]:
    """'64x56' -> 56 segments of 64 tokens; '3600' -> one segment."""
    length, _, count = text.partition("x")
    return [int(length)] * int(count or 1)


def attention_rows(args: argparse.Namespace, peaks: dict[str, float]) -> list[dict[str, Any]]:
    rows = []
    for dtype in args.dtypes:
        for layout in args.layouts:
            lengths = _layout(layout)
            calls = _attention_case(
                args.heads, args.dim, lengths, getattr(torch, dtype), args.device
            )
            best = best_seconds(calls, args.repeats)
            flops = 4.0 * args.heads * args.dim * sum(n * n for n in lengths)
            row = {"dtype": dtype, "segments": layout, "gflop": flops / 1e9}
            for path in calls:
                row[f"{path}_ms"] = best[path] * 1e3
                row[f"{path}_gflops"] = flops / best[path] / 1e9
                row[f"{path}_of_peak"] = row[f"{path}_gflops"] / peaks[dtype]
            row["kernel_over_torch"] = row["kernel_gflops"] / row["torch_gflops"]
            rows.append(row)
            print(row)
    return rows


def _use_vision_kernel(runner: Any, on: bool) -> None:
    saved = runner.__dict__.setdefault("_bench_vision_kernel", {})
    for module in runner.model.modules():
        if hasattr(module, "attention_kernel"):
            saved.setdefault(module, module.attention_kernel)
            module.attention_kernel = saved[module] if on else None


def encode_rows(args: argparse.Namespace) -> list[dict[str, Any]]:
    import numpy as np
    from PIL import Image

    import sglang
    from benchmark.lib.shaped_checkpoints import cached_checkpoint, shape_config

    path = str(cached_checkpoint(shape_config("3b", 4, 2), "3b"))
    engine = sglang.Engine(model_path=path, dtype="bfloat16")
    runner, width, height = engine.runner, *args.image
    prompt = "<|vision_start|><|image_pad|><|vision_end|>Describe."
    params = {"temperature": 0, "max_new_tokens": 1}
    best: dict[str, dict[str, float]] = {}
    for seed in range(1 + args.repeats):  # the first round warms up
        for path_name in PATHS:
            _use_vision_kernel(runner, path_name == "kernel")
            rng = np.random.default_rng(2 * seed + (path_name == "kernel"))
            image = Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))
            before = runner.perf.as_dict()
            engine.generate(prompt, params, image_data=[image])
            after = runner.perf.as_dict()
            ms = (after["vision_seconds"] - before["vision_seconds"]) * 1e3
            flops = after["vision_flops"] - before["vision_flops"]
            if seed and ms < best.get(path_name, {}).get("vision_ms", float("inf")):
                best[path_name] = {"vision_ms": ms, "vision_gflops": flops / ms / 1e6}
    engine.shutdown()
    row: dict[str, Any] = {"image": f"{width}x{height}", "dtype": "bfloat16"}
    for path_name in PATHS:
        row.update({f"{path_name}_{k}": v for k, v in best[path_name].items()})
    row["speedup"] = row["torch_vision_ms"] / row["kernel_vision_ms"]
    print(row)
    return [row]


def markdown(result: dict[str, Any]) -> str:
    paths = [p for p in CPU_PATHS if f"{p}_ms" in result["rows"][0]]
    head = ["dtype", "segments", "GFLOP"]
    for path in paths:
        head += [f"{path} ms", f"{path} GFLOP/s", "of GEMM peak"]
    head.append("kernel / torch")
    rows = []
    for r in result["rows"]:
        cells = [r["dtype"], r["segments"], r["gflop"]]
        for path in paths:
            cells += [r[f"{path}_ms"], r[f"{path}_gflops"], r[f"{path}_of_peak"]]
        rows.append([*cells, r["kernel_over_torch"]])
    load = " ".join(f"{x:.2f}" for x in result["load_average"])
    machine = cpu_line(result["cpu"])
    if result.get("gpu"):
        machine = gpu_line(result["gpu"]) + "; kernel = one flash varlen call"
    peaks = ", ".join(f"{d} {v:.0f}" for d, v in result["peak_gflops"].items())
    text = (
        f"{machine}; {result['threads']} threads; kernel ISA {result['kernel_isa']}; matmul "
        f"peak GFLOP/s: {peaks}; heads {result['config']['heads']}, dim "
        f"{result['config']['dim']}; load average before the run {load}\n\n"
        + markdown_table(head, rows)
    )
    if result.get("encode"):
        head = ["image", "dtype", "kernel vision ms", "kernel GFLOP/s", "torch vision ms",
                "torch GFLOP/s", "speedup"]  # fmt: skip
        rows = [
            [e["image"], e["dtype"], e["kernel_vision_ms"], e["kernel_vision_gflops"],
             e["torch_vision_ms"], e["torch_vision_gflops"], e["speedup"]]
            for e in result["encode"]
        ]  # fmt: skip
        text += "\n" + markdown_table(head, rows)
    return text + "\n"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--dim", type=int, default=80)
    p.add_argument(
        "--layouts", type=lambda s: s.split(","), default=["64x56", "1564", "3600", "4784"]
    )
    p.add_argument("--dtypes", type=lambda s: s.split(","), default=["bfloat16", "float32"])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--encode", action="store_true", help="also one image's encode in the engine")
    p.add_argument("--image", type=lambda s: [int(x) for x in s.split("x")], default=[1280, 720])
    p.add_argument("--out", default="results/vision_attention")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    args = p.parse_args(argv)
    on_gpu = args.device == "cuda"
    if not on_gpu and kernels.load("prefill_attention") is None:
        raise RuntimeError("the native attention kernel could not be built on this machine")
    started, load_before = time.perf_counter(), os.getloadavg()  # the run itself adds ~2
    cpu, gpu = cpu_info(), gpu_info() if on_gpu else None
    print(cpu_line(cpu) + (f"; {gpu_line(gpu)}" if gpu else ""))
    if on_gpu:
        peaks = {d: cuda_matmul_peak_gflops()["gflop_per_s"] for d in args.dtypes}
    else:
        peaks = {d: matmul_peak_gflops(dtype=d)["gflop_per_s"] for d in args.dtypes}
    result: dict[str, Any] = {
        "benchmark": "vision_attention",
        "config": vars(args),
        "cpu": cpu,
        "gpu": gpu,
        "threads": torch.get_num_threads(),
        "peak_gflops": peaks,
        "kernel_isa": "cuda" if on_gpu else kernels.load("prefill_attention").isa(),
        "rows": attention_rows(args, peaks),
        "encode": encode_rows(args) if args.encode else [],
        "load_average": load_before,
    }
    result["wall_s"] = time.perf_counter() - started
    write_results(args.out, result, markdown(result))
    return result


if __name__ == "__main__":
    main()
