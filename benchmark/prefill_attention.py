"""Prefill attention of the language model on the CPU: the native kernel against torch's flash
SDPA path, side by side, in GFLOP/s and as a fraction of the bfloat16 matmul peak.

One request per case: ``q_len`` new tokens after ``prefix`` cached ones, K/V in the paged pool at
contiguous slots (the allocator keeps runs; the torch path then reads pure views). FLOPs count
QK^T and PV of the keys each query sees under the causal mask, 4 * heads * dim * keys seen (the
engine's counters do the same). The kernel and torch alternate, best of ``--repeats``.

    python -m benchmark.prefill_attention                 # Qwen2.5-VL-3B LM shapes, ~40 s
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from benchmark.lib.hardware import cpu_info, cpu_line, matmul_peak_gflops
from benchmark.lib.report import best_seconds, markdown_table, pyplot, run_and_write
from sglang.srt import kernels
from sglang.srt.core.perf_counters import causal_attention_flops, causal_keys_seen
from sglang.srt.layers.attention.torch_native import _causal_over_pool, _KVLayout

PATHS = ("kernel", "torch")


def _case(heads: int, kv_heads: int, dim: int, prefix: int, q_len: int, dtype: torch.dtype):
    """Inputs of both paths for one request; returns {path: callable}."""
    total = prefix + q_len
    k_buf = torch.randn(total + 64, kv_heads, dim).to(dtype)
    v_buf = torch.randn(total + 64, kv_heads, dim).to(dtype)
    table = torch.arange(64, 64 + total)[None]  # one request row, contiguous slots
    q = torch.randn(1, heads, q_len, dim).to(dtype)
    kernel = kernels.load("prefill_attention")
    out = torch.empty(q_len, heads, dim, dtype=dtype)
    index = [torch.tensor([x]) for x in (0, 0, prefix, q_len)]  # row, q start, prefix, q_len
    layout = _KVLayout.of(table[0], prefix, q_len)
    scale = dim**-0.5
    return {
        "kernel": lambda: kernel.prefill_attention(
            out, q[0].transpose(0, 1), k_buf, v_buf, table, *index, scale, -1
        ),
        "torch": lambda: _causal_over_pool(q, k_buf, v_buf, layout, scale),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    if kernels.load("prefill_attention") is None:
        raise RuntimeError("the native prefill kernel could not be built on this machine")
    cpu = cpu_info()
    print(cpu_line(cpu))
    probed = dict.fromkeys(["bfloat16", *args.dtypes])  # bfloat16: the peak of the fractions
    peaks = {d: matmul_peak_gflops(dtype=d)["gflop_per_s"] for d in probed}
    cases = [(d, p, n) for d in args.dtypes for p in args.prefixes for n in args.q_lens]
    rows: list[dict[str, Any]] = []
    bar = tqdm(total=len(cases) * len(PATHS) * args.repeats, desc="prefill_attention")
    for dtype, prefix, q_len in cases:
        calls = _case(args.heads, args.kv_heads, args.dim, prefix, q_len, getattr(torch, dtype))
        best = best_seconds(calls, args.repeats, bar.update)
        flops = causal_attention_flops(args.heads, args.dim, causal_keys_seen(prefix, q_len))
        row = {"dtype": dtype, "prefix": prefix, "q_len": q_len, "gflop": flops / 1e9}
        for path in PATHS:
            row[f"{path}_ms"] = best[path] * 1e3
            row[f"{path}_gflops"] = flops / best[path] / 1e9
            row[f"{path}_of_bf16_peak"] = row[f"{path}_gflops"] / peaks["bfloat16"]
        row["kernel_over_torch"] = row["kernel_gflops"] / row["torch_gflops"]
        rows.append(row)
    bar.close()
    return {
        "benchmark": "prefill_attention",
        "config": vars(args),
        "cpu": cpu,
        "threads": torch.get_num_threads(),
        "load_average": os.getloadavg(),
        "matmul_peak_gflops": peaks,
        "rows": rows,
    }


def markdown(result: dict[str, Any]) -> str:
    head = ["dtype", "prefix", "q_len", "kernel GFLOP/s", "of bf16 peak", "torch GFLOP/s",
            "of bf16 peak", "kernel / torch"]  # fmt: skip
    rows = [
        [r["dtype"], r["prefix"], r["q_len"], r["kernel_gflops"], r["kernel_of_bf16_peak"],
         r["torch_gflops"], r["torch_of_bf16_peak"], r["kernel_over_torch"]]
        for r in result["rows"]
    ]  # fmt: skip
    peaks = ", ".join(f"{d} {g:.0f}" for d, g in result["matmul_peak_gflops"].items())
    load = " ".join(f"{x:.2f}" for x in result["load_average"])
    return (
        f"{cpu_line(result['cpu'])}; {result['threads']} threads; matmul peak GFLOP/s: {peaks}; "
        f"load average {load}\n\n" + markdown_table(head, rows) + "\n"
    )


def plot(result: dict[str, Any], path: Path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.4))
    short = {"bfloat16": "bf16", "float32": "fp32"}
    labels = [f"{short[r['dtype']]}\np{r['prefix']} q{r['q_len']}" for r in result["rows"]]
    x = range(len(labels))
    for offset, path_name in ((-0.2, "kernel"), (0.2, "torch")):
        values = [r[f"{path_name}_gflops"] for r in result["rows"]]
        ax.bar([i + offset for i in x], values, width=0.4, label=path_name)
    for dtype, gflops in result["matmul_peak_gflops"].items():
        ax.axhline(gflops, linestyle="--", linewidth=0.8, color="gray")
        ax.text(len(labels) - 0.5, gflops, f"{dtype} matmul", fontsize=6, ha="right", va="bottom")
    ax.set_xticks(list(x), labels, fontsize=6)
    ax.set_ylabel("GFLOP/s")
    ax.legend(fontsize=7)
    fig.suptitle(cpu_line(result["cpu"]), fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",")]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--q-lens", type=_ints, default=[1024, 2048])
    p.add_argument("--prefixes", type=_ints, default=[0, 2048])
    p.add_argument("--dtypes", type=lambda s: s.split(","), default=["bfloat16", "float32"])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", default="results/prefill_attention")
    return run_and_write(p.parse_args(argv), run, markdown, plot)


if __name__ == "__main__":
    main()
