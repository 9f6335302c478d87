"""Decode step time against its roofline, per batch size, for the language model's two weight
layouts and the torch paths, on a checkpoint with a real model's per-layer dims (random weights).

A decode step must read the language model's weights once plus every request's KV, and multiply
each row by them: its floor (the roofline) is the larger of (weight bytes + KV bytes) /
bandwidth and the linears' FLOPs / the GEMM peak in the model's dtype (2 x multiply-adds of the
LM and the head per row; attention's few FLOPs left out; under int8dq and 8da4w, whose
activations are int8, the int8 product's peak, ``peak_ops``). A copy probe runs before each
repeat (the bandwidth of a shared machine drifts; a row's floor takes the probe of its fastest
run), the GEMM peak (``matmul_peak_gflops``) once. For each batch size the offline engine
prefills the prompts, then the step time is taken from the runner's counters over the decode
steps; ``of_roofline`` = floor / step time (1.0 at the limit). The paths, in one process,
alternating, best of ``--repeats``:

- ``packed``: the engine as served (bfloat16 on a CPU with the native GEMM: each linear held
  once, packed, prompts and decode rows on the GEMM);
- ``plain``: ``cpu_packed_lm_weights=off`` (plain weights, the decode kernel: what CPUs without
  the native GEMM run);
- ``torch``: that engine with the native decode attention and linears off.

``--paths`` picks some of them (``packed`` is always run): under ``--torchao-config`` the torch
path simulates the quantized product in plain torch ops, which takes minutes per prompt batch.

    python -m benchmark.decode_step --shape 2b --layers 4 --batch-sizes 1,2,4,8,16,32
    python -m benchmark.decode_step --shape 2b --torchao-config 8da4w-128 --paths packed
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from tqdm import tqdm

from benchmark.lib.hardware import cpu_info, cpu_line, memory_bandwidth_gbs
from benchmark.lib.report import markdown_table, pyplot, run_and_write
from benchmark.lib.shaped_checkpoints import SHAPES, cached_checkpoint, shape_config
from sglang.srt.layers.quantization.quantized_linear import QuantizedLinear

PATHS = ("packed", "plain", "torch")


def _step(engine: Any, batch: int, prompt_len: int, new_tokens: int, kernels_on: bool) -> dict:
    """One measured decode run: ``batch`` prompts of ``prompt_len`` tokens, ``new_tokens``
    each; returns ms per decode step and bytes per step."""
    runner = engine.runner
    _use_kernels(runner, kernels_on)
    engine.flush_cache()
    ids = [[(7 * i + 13 * t) % 1000 + 10 for t in range(prompt_len)] for i in range(batch)]
    params = {"temperature": 0, "max_new_tokens": new_tokens, "ignore_eos": True}
    before = dict(runner.perf.as_dict())
    engine.generate(input_ids=ids, sampling_params=params)
    after = runner.perf.as_dict()
    steps = after["decode_steps"] - before["decode_steps"]
    seconds = after["decode_forward_seconds"] - before["decode_forward_seconds"]
    moved = after["decode_bytes"] - before["decode_bytes"]
    return {"ms_per_step": seconds / steps * 1e3, "bytes_per_step": moved / steps, "steps": steps}


def _use_kernels(runner: Any, on: bool) -> None:
    """Switch the native decode attention and decode linears on or off (torch paths)."""
    saved = runner.__dict__.setdefault("_bench_kernels", {})
    backend = runner.attn_backend
    saved.setdefault(backend, backend.decode_kernel)
    backend.decode_kernel = saved[backend] if on else None
    for module in runner.model.modules():
        if hasattr(module, "_decode_kernel"):
            saved.setdefault(module, module._decode_kernel)
            module._decode_kernel = saved[module] if on else None
        if isinstance(module, QuantizedLinear):  # --torchao-config: int8 / int4 layers
            saved.setdefault(module, module.kernel)
            module.use_kernel(saved[module] if on else None)


def _engines(args: argparse.Namespace, path: str, paths: list[str]) -> dict[str, Any]:
    """The engine each path runs on: ``packed`` the default one, ``plain`` and ``torch`` one
    with the plain weights (built only where one of them is asked for)."""
    import sglang

    tokens = max(args.batch_sizes) * (args.prompt_len + args.new_tokens + 8)
    common = {
        "model_path": path,
        "dtype": args.dtype,
        "torchao_config": args.torchao_config,
        "max_running_requests": max(args.batch_sizes),
        "max_total_tokens": tokens,
    }
    engines = {"packed": sglang.Engine(**common)}
    if "plain" in paths or "torch" in paths:
        plain = sglang.Engine(**common, cpu_packed_lm_weights="off")
        engines.update({kind: plain for kind in ("plain", "torch") if kind in paths})
    for engine in engines.values():
        if engine.runner.attn_backend.decode_kernel is None:
            raise RuntimeError("the native decode kernel could not be built on this machine")
    return engines


def run(args: argparse.Namespace) -> dict[str, Any]:
    from benchmark.lib.hardware import matmul_peak_gflops
    from sglang.srt.model_executor.quantization import dynamic_activations

    cpu = cpu_info()
    print(cpu_line(cpu))
    bandwidth = memory_bandwidth_gbs()
    probes = [bandwidth["gb_per_s"]]
    dims = shape_config(args.shape, args.layers, 2)
    path = args.model_path or str(cached_checkpoint(dims, args.shape))
    paths = ["packed", *(p for p in PATHS[1:] if p in args.paths.split(","))]
    engines = _engines(args, path, paths)
    runner = engines["packed"].runner
    # the products' peak: the int8 product's for int8 activations, else the model dtype's GEMM
    dynamic = dynamic_activations(args.torchao_config)
    peak = matmul_peak_gflops(dtype="int8" if dynamic else str(runner.dtype).removeprefix("torch."))
    flops_per_row = 2 * (runner.lm_linear_macs + runner.lm_head_macs)
    rows: list[dict[str, Any]] = []
    bar = tqdm(total=len(args.batch_sizes) * len(paths) * args.repeats, desc="decode_step")
    for batch in args.batch_sizes:
        best: dict[str, dict] = {}
        for _ in range(args.repeats):
            # This machine's bandwidth drifts by half within minutes: each repeat is paired
            # with a probe taken just before it, and a row's floor uses its fastest run's probe.
            gb_per_s = memory_bandwidth_gbs(seconds=0.3)["gb_per_s"]
            probes.append(gb_per_s)
            for kind in paths:
                engine = engines[kind]
                got = _step(engine, batch, args.prompt_len, args.new_tokens, kind != "torch")
                got["gb_per_s"] = gb_per_s
                if kind not in best or got["ms_per_step"] < best[kind]["ms_per_step"]:
                    best[kind] = got
                bar.update(1)
        gb_per_s = best["packed"]["gb_per_s"]
        bytes_ms = best["packed"]["bytes_per_step"] / (gb_per_s * 1e9) * 1e3
        flops_ms = batch * flops_per_row / (peak["gflop_per_s"] * 1e9) * 1e3
        floor_ms = max(bytes_ms, flops_ms)
        row = {"batch": batch, "gb_per_s": gb_per_s, "bytes_ms": bytes_ms, "flops_ms": flops_ms,
               "floor_ms": floor_ms}  # fmt: skip
        for kind in paths:
            row[f"{kind}_ms"] = best[kind]["ms_per_step"]
            row[f"{kind}_of_roofline"] = floor_ms / best[kind]["ms_per_step"]
            if kind != "packed":
                row[f"{kind}_over_packed"] = row[f"{kind}_ms"] / row["packed_ms"]
        rows.append(row)
    bar.close()
    for one in rows:  # tokens/s of the batch over one stream's
        one["packed_x_batch1"] = rows[0]["packed_ms"] / one["packed_ms"] * one["batch"]
    for engine in {id(e): e for e in engines.values()}.values():
        engine.shutdown()
    return {
        "benchmark": "decode_step",
        "config": {**vars(args), "model_path": path, "dims": dims},
        "cpu": cpu,
        "memory_bandwidth": {**bandwidth, "probes_gb_per_s": probes},
        "matmul_peak": peak,
        "flops_per_row": flops_per_row,
        "rows": rows,
    }


def markdown(result: dict[str, Any]) -> str:
    others = [kind for kind in PATHS[1:] if f"{kind}_ms" in result["rows"][0]]
    head = ["batch", "copy GB/s", "bytes ms", "FLOPs ms", "packed ms", "packed / roofline",
            "tok/s x batch 1"]  # fmt: skip
    head += [f"{kind} {col}" for kind in others for col in ("ms", "/ roofline", "/ packed")]
    rows = [
        [r["batch"], r["gb_per_s"], r["bytes_ms"], r["flops_ms"], r["packed_ms"],
         r["packed_of_roofline"], r["packed_x_batch1"]]
        + [r[f"{kind}_{key}"] for kind in others for key in ("ms", "of_roofline", "over_packed")]
        for r in result["rows"]
    ]  # fmt: skip
    probes = result["memory_bandwidth"]["probes_gb_per_s"]
    peak = result["matmul_peak"]["gflop_per_s"]
    return (
        f"{cpu_line(result['cpu'])}; copy bandwidth probed before each repeat: "
        f"{min(probes):.1f}-{max(probes):.1f} GB/s (a row's floor: its fastest run's probe); "
        f"{result['matmul_peak']['dtype']} GEMM peak {peak:.0f} GFLOP/s; roofline = max(bytes ms, "
        "FLOPs ms)\n\n" + markdown_table(head, rows) + "\n"
    )


def plot(result: dict[str, Any], path: Path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5, 3.4))
    batches = [r["batch"] for r in result["rows"]]
    for key, label in (("floor_ms", "roofline"), ("packed_ms", "packed (one layout)"),
                       ("plain_ms", "plain weights, decode kernel"),
                       ("torch_ms", "torch paths")):  # fmt: skip
        if key not in result["rows"][0]:
            continue
        ax.plot(batches, [r[key] for r in result["rows"]], marker="o", label=label)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch size")
    ax.set_ylabel("ms per decode step")
    ax.legend(fontsize=7)
    fig.suptitle(cpu_line(result["cpu"]), fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", choices=SHAPES, default="3b")
    p.add_argument("--layers", type=int, default=4, help="language-model layers")
    p.add_argument("--model-path", help="use this checkpoint instead of building one")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument(
        "--torchao-config", default="", help="int8wo, int4wo-<group>, int8dq or 8da4w-<group>"
    )
    p.add_argument("--batch-sizes", type=lambda s: [int(x) for x in s.split(",")],
                   default=[1, 2, 4, 8, 16, 32])  # fmt: skip
    p.add_argument("--prompt-len", type=int, default=512)
    p.add_argument("--new-tokens", type=int, default=16)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--paths", default=",".join(PATHS), help=f"of {', '.join(PATHS)}")
    p.add_argument("--out", default="results/decode_step")
    return run_and_write(p.parse_args(argv), run, markdown, plot)


if __name__ == "__main__":
    main()
