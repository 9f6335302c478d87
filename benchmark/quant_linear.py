"""Decode-sized linears per weight width against memory bandwidth: one decoder layer's seven
linears (Qwen2.5-VL-7B's shapes by default, random weights) for a few rows of input.

A decode step reads every weight once, so its floor is the weights' bytes over the bandwidth
(a copy probe, bytes read plus written, taken before each width: a shared machine drifts).
Per width and row count it prints ms per layer, the weight bytes read per second, and
``of_bandwidth`` = floor / time (1.0 at the limit), and ``of_roofline``: the roofline's time
(the larger of that floor and the FLOPs over the width's compute peak, probed once in the same
run: the bfloat16 GEMM's for bf16 / int8 / int4, whose products are bfloat16 dot products, and
``vpdpbusd``'s for int8dq) over the time: with many rows the products, not the bytes, set the
limit. For:

- bf16: as the server holds it: each weight once, packed for the native GEMM, which serves
  every row count (CPUs without it: ``linear_bf16`` over the plain weights, torch for prompts);
- int8 / int4-<group>: ``QuantizedLinear`` (the native ``linear_quant`` kernel: the GEMM's tile
  over the codes in its panel order, at every row count);
- int8dq: ``QuantizedLinear`` with int8 activations (``linear_int8dq``: each row quantized as it
  arrives, vpdpbusd over the codes, exact int32 sums);
- 8da4w-<group>: int4 weights times int8 activations (``linear_int8dq``'s ``linear_int4``:
  exact int32 sums per group, its scale and min applied to them);
- torchao-int8 / torchao-int4-<group>: torchao's CPU tensors behind the same ``nn.Linear``
  (what ``--torchao-config`` ran before), for comparison in the same run;
- f32: the plain float32 ``nn.Linear`` (torch's product);
- f32-served: float32 as a server holds a float32 checkpoint on a CPU without native bfloat16:
  2-16 rows on ``linear_bf16``'s ``linear_f32``, the rest torch's product;
- bf16w: bfloat16 weights under float32 compute (``layers/quantization/bf16_weights.py``),
  what such a CPU serves a bfloat16 checkpoint with by default: float32 inputs, weights widened
  as they are read;
- <width>-portable (int8, int8dq, int4-<group>, 8da4w-<group>): the kernel's plain C++ build,
  what a CPU with none of its vector paths runs.

On a CPU without native bfloat16 (AVX2 only) the weight-only widths multiply in float32 FMAs,
so their compute peak is the float32 GEMM's; int8dq and 8da4w multiply with ``vpmaddubsw``, and
their peak is ``peak_ops``'s chain of it (vpmaddubsw, vpmaddwd, vpaddd: an upper bound, since
int8dq's product also moves each weight's sign onto the activation, a fourth instruction).

``--rows`` above 16 (e.g. 512) time prompt chunks: there ``of_bandwidth`` means little, and
``tflops`` (2 x rows x weights / time) is the figure to read. The widths alternate within each
repeat; each cell is the best of ``--repeats``. Each timed step runs the next of several copies
of the layer (``--stream-mb`` of weights in all), so that no weight comes back from the
last-level cache, as in a server's decode step.

    python -m benchmark.quant_linear --rows 1,2,4,8,16 --repeats 5
"""

from __future__ import annotations

import argparse
import itertools
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from tqdm import tqdm

from benchmark.lib.hardware import cpu_info, cpu_line, matmul_peak_gflops, memory_bandwidth_gbs
from benchmark.lib.report import markdown_table, pyplot, run_and_write

SHAPES = {  # (out, in) of one decoder layer's linears
    "7b": [(3584, 3584), (512, 3584), (512, 3584), (3584, 3584), (18944, 3584), (18944, 3584),
           (3584, 18944)],
    "2b": [(1536, 1536), (256, 1536), (256, 1536), (1536, 1536), (8960, 1536), (8960, 1536),
           (1536, 8960)],
}  # fmt: skip
WIDTHS = ("bf16", "int8", "int8dq", "int4-128", "8da4w-128", "torchao-int8", "torchao-int4-128")


def _layers(shape: str, width: str) -> list[nn.Module]:
    from sglang.srt.layers.quantization import bf16_weights, decode_linear, packed_linear
    from sglang.srt.layers.quantization.quantized_linear import quantize
    from sglang.srt.model_executor.quantization import _torchao, parse_torchao_config

    torch.manual_seed(0)
    dense = [nn.Linear(k, n, bias=False).bfloat16() for n, k in SHAPES[shape]]
    if width in ("f32", "f32-served"):
        wide = [layer.float() for layer in dense]
        if width == "f32-served":
            decode_linear.install(wide, torch.float32)
        return wide
    if width == "bf16w":
        for layer in dense:
            bf16_weights.store_in_bfloat16(layer)
        return dense
    if width == "bf16":  # as the server runs it: packed once where the native GEMM serves
        packed_linear.install(dense, native_only=True)
        decode_linear.install(dense)
        return dense
    if width.startswith("torchao-"):
        config = "int8wo" if width == "torchao-int8" else f"int4wo-{width.rsplit('-', 1)[1]}"
        quantize_, ao_config = _torchao(parse_torchao_config(config), "cpu")
        for layer in dense:
            quantize_(layer, ao_config)
        return dense
    from sglang.srt import kernels

    base = width.removesuffix("-portable")
    load = kernels.load_portable if base != width else kernels.load
    dynamic = base == "int8dq" or base.startswith("8da4w")
    bits, group = (8, None) if base.startswith("int8") else (4, int(base.rsplit("-", 1)[1]))
    kernel = load("linear_int8dq" if dynamic else "linear_quant")
    layers = []
    for layer in dense:
        quantized = quantize(layer, bits, group, dynamic)
        quantized.use_kernel(kernel)
        layers.append(quantized)
    return layers


def _weights(shape: str) -> int:
    return sum(n * k for n, k in SHAPES[shape])


def _weight_bytes(layers: list[nn.Module]) -> int:
    """Bytes a product reads: the layer's tensors, its packed weight in place of a released one
    (the padding of the last panel left out: the GEMM does not read it for decode)."""
    from sglang.srt.layers.quantization import packed_linear
    from sglang.srt.model_executor.host_memory import module_bytes

    total = 0
    for layer in layers:
        total += module_bytes(layer)
        if packed_linear.holds_only_packed(layer):
            total += layer.weight.numel() * layer.weight.element_size()
    return total


def _time(step: Callable[[], Any], seconds: float) -> float:
    step()
    best, deadline = float("inf"), time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        start = time.perf_counter()
        step()
        best = min(best, time.perf_counter() - start)
    return best


def _copies(shape: str, width: str, stream_bytes: int) -> list[list[nn.Module]]:
    """Enough copies of the layer that cycling through them streams ``stream_bytes`` or more:
    a decode step reads each weight once, so none may come back from the last-level cache
    (an int4 7B layer is 118 MB; the L3 of a server part is 32-256 MB)."""
    first = _layers(shape, width)
    count = -(-stream_bytes // _weight_bytes(first))
    return [first] + [_layers(shape, width) for _ in range(count - 1)]


def _stepper(
    sets: list[list[nn.Module]], inputs: dict[tuple[int, int], torch.Tensor], rows: int
) -> Callable[[], None]:
    """One layer's linears for ``rows`` rows, each call on the next copy (its weights cold); the
    inputs in the layers' dtype (bfloat16, or float32 for the f32 width)."""
    from sglang.srt.layers.quantization import bf16_weights

    order = itertools.cycle(sets)
    first = sets[0][0]
    if bf16_weights.stores_bfloat16(first) or (
        isinstance(first, nn.Linear) and first.weight.dtype == torch.float32
    ):
        inputs = {key: x.float() for key, x in inputs.items()}

    def step() -> None:
        for layer in next(order):
            layer(inputs[(rows, layer.in_features)])

    return step


def _compute_peaks(widths: list[str]) -> dict[str, float]:
    """GFLOP/s each width's products can reach on this machine (see the module's docstring)."""
    from sglang.srt.model_executor.dtypes import cpu_bfloat16_isa

    dynamic = [w for w in widths if w == "int8dq" or w.startswith("8da4w")]
    probes = {}  # keyed apart from the widths' names: the weight-only "int8" is a float product
    if dynamic:
        probes["int8 product"] = matmul_peak_gflops(dtype="int8")["gflop_per_s"]
    # the weight-only widths' products: bfloat16 dot products, or float32 FMAs without bfloat16
    float_dtype = "float32" if cpu_bfloat16_isa() is None else "bfloat16"
    probes["float"] = matmul_peak_gflops(dtype=float_dtype)["gflop_per_s"]
    f32 = [w for w in widths if w in ("f32", "f32-served", "bf16w")]
    if f32 and float_dtype != "float32":
        probes["f32"] = matmul_peak_gflops(dtype="float32")["gflop_per_s"]
    named = {w: "int8 product" if w in dynamic else "f32" if w in f32 else w for w in widths}
    return {w: probes.get(named[w], probes["float"]) for w in widths}


def run(args: argparse.Namespace) -> dict[str, Any]:
    rows_list = [int(r) for r in args.rows.split(",")]
    widths = args.widths.split(",")
    stream = args.stream_mb * 2**20
    copies = {width: _copies(args.shape, width, stream) for width in widths}
    layers = {width: sets[0] for width, sets in copies.items()}
    widths_in = {k for _, k in SHAPES[args.shape]}
    inputs = {(r, k): torch.randn(r, k).bfloat16() for r in rows_list for k in widths_in}
    peaks = _compute_peaks(widths)
    best: dict[tuple[str, int], dict[str, float]] = {}
    cells = [(width, rows) for width in widths for rows in rows_list]
    with torch.no_grad(), tqdm(total=args.repeats * len(cells), desc="quant_linear") as bar:
        for _ in range(args.repeats):
            for width, rows in cells:
                bandwidth = memory_bandwidth_gbs(seconds=0.3)["gb_per_s"]
                seconds = _time(_stepper(copies[width], inputs, rows), args.seconds)
                floor = _weight_bytes(layers[width]) / (bandwidth * 1e9)
                cell = {"ms": seconds * 1e3, "bandwidth_gbs": bandwidth, "floor_ms": floor * 1e3}
                if (width, rows) not in best or seconds * 1e3 < best[(width, rows)]["ms"]:
                    best[(width, rows)] = cell
                bar.update()
    results = []
    for width, rows in cells:
        cell = best[(width, rows)]
        nbytes = _weight_bytes(layers[width])
        flops = 2 * rows * _weights(args.shape)
        roofline_ms = max(cell["floor_ms"], flops / peaks[width] / 1e6)
        results.append(
            {
                "width": width,
                "rows": rows,
                "ms_per_layer": cell["ms"],
                "weight_bytes": nbytes,
                "weight_gb_per_s": nbytes / cell["ms"] / 1e6,
                "copy_bandwidth_gbs": cell["bandwidth_gbs"],
                "of_bandwidth": cell["floor_ms"] / cell["ms"],
                "tflops": flops / cell["ms"] / 1e9,
                "compute_peak_tflops": peaks[width] / 1e3,
                "of_roofline": roofline_ms / cell["ms"],
            }
        )
    return {
        "cpu": cpu_info(),
        "threads": torch.get_num_threads(),
        "shape": args.shape,
        "results": results,
    }


def markdown(result: dict[str, Any]) -> str:
    rows = [
        [r["width"], r["rows"], r["ms_per_layer"], r["weight_bytes"] / 2**20,
         r["weight_gb_per_s"], r["of_bandwidth"], r["tflops"], r["of_roofline"]]
        for r in result["results"]
    ]  # fmt: skip
    headers = ["width", "rows", "ms / layer", "weights MiB", "weight GB/s", "of bandwidth",
               "TFLOP/s", "of roofline"]  # fmt: skip
    title = f"{result['shape']}-shaped decoder layer, {cpu_line(result['cpu'])}"
    peaks = {r["width"]: r["compute_peak_tflops"] for r in result["results"]}
    peak_line = "; ".join(f"{width} {peak:.3f}" for width, peak in peaks.items())
    return (
        f"{title}, {result['threads']} threads; compute peaks (TFLOP/s): {peak_line}\n\n"
        + markdown_table(headers, rows)
    )


def plot(result: dict[str, Any], png: Path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    for width in dict.fromkeys(r["width"] for r in result["results"]):
        points = [r for r in result["results"] if r["width"] == width]
        ax.plot([r["rows"] for r in points], [r["of_roofline"] for r in points], "o-", label=width)
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("rows (requests in the decode batch)")
    ax.set_ylabel("roofline time / time")
    ax.set_title(f"{result['shape']}-shaped layer's linears: fraction of the roofline")
    ax.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=120)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", choices=SHAPES, default="7b")
    p.add_argument("--rows", default="1,2,4,8,16")
    others = "of these, f32, f32-served, bf16w, X-portable"
    p.add_argument("--widths", default=",".join(WIDTHS), help=others)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seconds", type=float, default=1.0, help="timing window per cell")
    p.add_argument(
        "--stream-mb", type=int, default=512, help="cycle through copies holding this many MiB"
    )
    p.add_argument("--out", default="results/quant_linear")
    run_and_write(p.parse_args(), run, markdown, plot)


if __name__ == "__main__":
    main()
