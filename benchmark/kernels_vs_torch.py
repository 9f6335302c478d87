"""Every native CPU kernel against the torch path the engine would take without it, per shape,
on the machine it runs on: the ratio torch time / kernel time (above 1: the kernel is faster)
for each kernel build this CPU can load (the native one, and with ``--portable`` the plain C++
build of the kernels that have one, what a CPU without their vector paths runs, at decode rows).

The torch side is the engine's own fallback, not a hand-written ideal: the attention backends
``torch_native`` against ``cpu_native`` on one batch; a ``QuantizedLinear`` with its kernel
against the same layer without it (torch's product over the dequantized weight); a decode-routed
or packed ``nn.Linear`` against the plain one; HF's own modules and functions for the norms,
activations and rotary embeddings. Shapes are Qwen2.5-VL-7B's (language model) and its tower's
(``--shape small`` for tests). Cells where the kernel is slower than torch are listed at the end:
the dispatcher should not pick them.

    python -m benchmark.kernels_vs_torch                 # 7B shapes, native builds
    python -m benchmark.kernels_vs_torch --portable      # and the portable builds
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from tqdm import tqdm

from benchmark.lib.hardware import cpu_info, cpu_line
from benchmark.lib.report import best_seconds, markdown_table, pyplot, write_results

# (hidden, intermediate, heads, kv heads, head dim, tower width, tower heads) per shape
SHAPES = {
    "7b": {"hidden": 3584, "inter": 18944, "heads": 28, "kv": 4, "dim": 128, "tower": 1280,
           "tower_heads": 16, "prompt": 433, "context": 1024, "image": 1564},
    "small": {"hidden": 256, "inter": 512, "heads": 8, "kv": 4, "dim": 32, "tower": 128,
              "tower_heads": 4, "prompt": 40, "context": 64, "image": 64},
}  # fmt: skip
PORTABLE = ("linear_quant", "linear_int8dq")  # kernels with a plain C++ build (SGLANG_PORTABLE)


@dataclass(frozen=True)
class Case:
    kernel: str  # csrc/<kernel>.cpp
    label: str  # what is measured, with its shape
    torch_call: Callable[[], Any]
    kernel_call: Callable[[], Any]


def _attention_cases(s: dict[str, int], dtype: torch.dtype) -> list[Case]:
    from sglang.srt.core.forward_batch import ForwardBatch
    from sglang.srt.layers.attention import create_attention_backend
    from sglang.srt.mem_cache.memory_pool import KVPool, ReqToTokenPool

    heads, kv, dim, context = s["heads"], s["kv"], s["dim"], s["context"]
    pool = KVPool(s["prompt"] + 4 * (context + 1) + 8, [(kv, dim)], dtype, "cpu")
    rows = ReqToTokenPool(8, context + 8, "cpu")
    backends = {n: create_attention_backend(n, kv_pool=pool, req_to_token_pool=rows)
                for n in ("torch_native", "cpu_native")}  # fmt: skip
    cases = []
    for label, batch in _batches(pool, rows, s, dtype):
        n = sum(batch.extend_lens)
        q = torch.randn(1, n, heads, dim, dtype=dtype).transpose(1, 2)
        k = torch.randn(1, kv, n, dim, dtype=dtype)

        def call(name: str, batch: ForwardBatch = batch, q=q, k=k) -> Any:
            backend = backends[name]
            backend.prepare_metadata(batch)
            return backend.forward(q, k, k, 0, batch, scaling=dim**-0.5, save_kv=False)

        kernel = "decode_attention" if batch.is_decode else "prefill_attention"
        cases.append(Case(kernel, label, lambda c=call: c("torch_native"),
                          lambda c=call: c("cpu_native")))  # fmt: skip
    return cases


def _batches(pool: Any, rows: Any, s: dict[str, int], dtype: torch.dtype) -> list[tuple]:
    from sglang.srt.core.forward_batch import ForwardBatch

    context, kv, dim = s["context"], s["kv"], s["dim"]
    out = []
    for decode, reqs in ((False, [(0, s["prompt"])]), (True, [(context, 1)] * 4)):
        row_ids, locs = [], []
        for prefix, extend in reqs:
            row, slots = rows.alloc(), pool.alloc(prefix + extend)
            rows.req_to_token[row, : prefix + extend] = slots
            kv_rows = torch.randn(prefix + extend, kv, dim, dtype=dtype)
            pool.set_kv(0, slots, kv_rows, kv_rows)
            row_ids.append(row)
            locs.append(slots[prefix:])
        n = sum(e for _, e in reqs)
        batch = ForwardBatch(
            reqs=[], input_ids=torch.zeros(n, dtype=torch.int64), positions=torch.zeros(n),
            out_cache_loc=torch.cat(locs), req_pool_indices=row_ids,
            prefix_lens=[p for p, _ in reqs], extend_lens=[e for _, e in reqs],
            bidirectional_spans=[[] for _ in reqs], is_decode=decode,
        )  # fmt: skip
        what = f"decode 4 x {context} keys" if decode else f"prefill {s['prompt']} tokens"
        out.append((f"{what}, {s['heads']}/{kv} heads x {dim}, {_name(dtype)}", batch))
    return out


def _linear_cases(s: dict[str, int], portable: bool) -> list[Case]:
    from sglang.srt.layers.quantization import decode_linear, packed_linear
    from sglang.srt.layers.quantization.quantized_linear import quantize

    hidden, inter = s["hidden"], s["inter"]
    cases = []
    for rows in (1, 8, s["prompt"]):
        x = torch.randn(rows, hidden, dtype=torch.bfloat16)
        plain = torch.nn.Linear(hidden, inter, bias=False, dtype=torch.bfloat16)
        shape = f"{rows} x {hidden} -> {inter}"
        if rows <= 16:
            routed = torch.nn.Linear(hidden, inter, bias=False, dtype=torch.bfloat16)
            routed.weight.data.copy_(plain.weight)
            if decode_linear.install([routed]):
                cases.append(Case("linear_bf16", f"bf16 {shape}", _no_grad(plain, x),
                                  _no_grad(routed, x)))  # fmt: skip
            cases += _float32_compute_cases(plain, x.float(), shape)
        packed = torch.nn.Linear(hidden, inter, bias=False, dtype=torch.bfloat16)
        packed.weight.data.copy_(plain.weight)
        if packed_linear.install([packed], native_only=True):
            cases.append(Case("gemm_bf16", f"bf16 {shape}", _no_grad(plain, x),
                              _no_grad(packed, x)))  # fmt: skip
        for bits, group, dynamic, name, kernel in (
            (8, None, False, "int8wo", "linear_quant"),
            (4, 128, False, "int4wo-128", "linear_quant"),
            (8, None, True, "int8dq", "linear_int8dq"),
            (4, 128, True, "8da4w-128", "linear_int8dq"),
        ):
            layer = quantize(plain, bits, group, dynamic)
            # the portable builds at decode rows only: a prompt chunk in plain C++ takes minutes
            with_portable = portable and rows <= 16
            for build in ("native", "portable") if with_portable else ("native",):
                case = _kernel_or_not(layer, kernel, build, f"{name} {shape}", x)
                cases += [case] if case is not None else []
    return cases


def _kernel_or_not(layer: Any, kernel: str, build: str, label: str, x: torch.Tensor) -> Case | None:
    """The layer on a build of its kernel against the same layer with none (torch's product)."""
    from sglang.srt import kernels

    module = kernels.load_portable(kernel) if build == "portable" else kernels.load(kernel)
    if module is None:
        return None
    kernel = kernel if build == "native" else f"{kernel} (portable)"

    def on(kernel_module: Any) -> Callable[[], Any]:
        def call() -> Any:
            layer.use_kernel(kernel_module)
            with torch.no_grad():
                return layer(x)

        return call

    return Case(kernel, label, on(None), on(module))


def _float32_compute_cases(plain: torch.nn.Linear, x: torch.Tensor, shape: str) -> list[Case]:
    """The decode rows of a model computing in float32 (CPUs without native bfloat16): float32
    weights routed to ``linear_f32`` (2-16 rows) against torch's float32 product, and bfloat16
    weights widened as read (``--cpu-bf16-weights``, ``linear_mixed``) against torch widening
    the same weights before its product (the path without the kernel)."""
    from sglang.srt.layers.quantization import bf16_weights, decode_linear

    cases = []
    if x.shape[0] >= decode_linear.FLOAT32_MIN_ROWS:
        f32, routed = _twin(plain, torch.float32), _twin(plain, torch.float32)
        if decode_linear.install([routed], torch.float32):
            cases.append(Case("linear_bf16", f"f32 {shape}", _no_grad(f32, x),
                              _no_grad(routed, x)))  # fmt: skip
    mixed, widened_by_torch = _twin(plain, torch.bfloat16), _twin(plain, torch.bfloat16)
    bf16_weights.store_in_bfloat16(torch.nn.Sequential(mixed, widened_by_torch))
    if mixed._widening_kernel is not None:
        widened_by_torch._widening_kernel = None
        cases.append(Case("linear_bf16", f"bf16 weights, f32 rows {shape}",
                          _no_grad(widened_by_torch, x), _no_grad(mixed, x)))  # fmt: skip
    return cases


def _twin(plain: torch.nn.Linear, dtype: torch.dtype) -> torch.nn.Linear:
    twin = torch.nn.Linear(plain.in_features, plain.out_features, bias=False, dtype=dtype)
    twin.weight.data.copy_(plain.weight)
    return twin


def _elementwise_cases(s: dict[str, int]) -> list[Case]:
    from transformers.activations import QuickGELUActivation
    from transformers.models.llama.modeling_llama import LlamaRMSNorm, apply_rotary_pos_emb
    from transformers.models.qwen2_5_vl import modeling_qwen2_5_vl as qwen_vl

    from sglang.srt.kernels import ops
    from sglang.srt.layers import native_norm
    from sglang.srt.layers.native_activation import NativeQuickGELU

    bf16, rows = torch.bfloat16, s["prompt"]
    hidden, inter, heads, dim = s["hidden"], s["inter"], s["heads"], s["dim"]
    cases = []
    x = torch.randn(rows, hidden, dtype=bf16)
    norm = LlamaRMSNorm(hidden).to(bf16)
    native = LlamaRMSNorm(hidden).to(bf16)
    if native_norm.install_rms_norms([native]):
        cases.append(Case("rms_norm", f"RMSNorm {rows} x {hidden}", _no_grad(norm, x),
                          _no_grad(native, x)))  # fmt: skip
    gate, up = torch.randn(rows, inter, dtype=bf16), torch.randn(rows, inter, dtype=bf16)
    silu = ops.silu_and_mul()
    if silu is not None:
        cases.append(Case("silu_and_mul", f"silu(gate) * up {rows} x {inter}",
                          lambda: torch.nn.functional.silu(gate) * up,
                          lambda: silu.silu_and_mul(gate, up)))  # fmt: skip
    wide = torch.randn(s["image"], 4 * s["tower"], dtype=bf16)
    gelu = ops.quick_gelu()
    if gelu is not None:
        cases.append(Case("quick_gelu", f"QuickGELU {s['image']} x {4 * s['tower']}",
                          _no_grad(QuickGELUActivation(), wide),
                          _no_grad(NativeQuickGELU(gelu), wide)))  # fmt: skip
    rotary = ops.rotary()
    q = torch.randn(1, heads, rows, dim, dtype=bf16)
    cos, sin = torch.randn(1, rows, dim, dtype=bf16), torch.randn(1, rows, dim, dtype=bf16)
    if rotary is not None:
        cases.append(Case("rotary", f"rotary q, k 1 x {heads} x {rows} x {dim}",
                          lambda: apply_rotary_pos_emb(q, q, cos, sin),
                          lambda: rotary.rotary_pair(q, q, cos, sin)))  # fmt: skip
    vision = ops.vision_rotary()
    tower_dim = s["tower"] // s["tower_heads"]
    vq = torch.randn(s["image"], s["tower_heads"], tower_dim, dtype=bf16)
    vcos = torch.randn(s["image"], tower_dim)  # float32, as the towers make them
    if vision is not None:
        label = f"tower rotary {s['image']} x {s['tower_heads']} x {tower_dim}"
        hf = qwen_vl.apply_rotary_pos_emb_vision
        cases.append(Case("vision_rotary", label, lambda: hf(vq, vq, vcos, vcos),
                          lambda: vision.rotary_pair(vq, vq, vcos, vcos)))  # fmt: skip
    return cases


def _no_grad(module: torch.nn.Module, x: torch.Tensor) -> Callable[[], Any]:
    def call() -> Any:
        with torch.no_grad():
            return module(x)

    return call


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def cases(shape: str, portable: bool = False) -> list[Case]:
    s = SHAPES[shape]
    out = [*_attention_cases(s, torch.bfloat16), *_attention_cases(s, torch.float32)]
    return out + _linear_cases(s, portable) + _elementwise_cases(s)


def measure(all_cases: list[Case], repeats: int) -> list[dict[str, Any]]:
    """Best of ``repeats`` for each case's two calls, taking turns."""
    rows = []
    for case in tqdm(all_cases, desc="kernels_vs_torch"):
        best = best_seconds({"torch": case.torch_call, "kernel": case.kernel_call}, repeats)
        rows.append({"kernel": case.kernel, "case": case.label, "torch_ms": best["torch"] * 1e3,
                     "kernel_ms": best["kernel"] * 1e3,
                     "torch_over_kernel": best["torch"] / best["kernel"]})  # fmt: skip
    return rows


def markdown(result: dict[str, Any]) -> str:
    rows = result["rows"]
    table = markdown_table(
        ["kernel", "case", "torch ms", "kernel ms", "torch / kernel"],
        [[r["kernel"], r["case"], r["torch_ms"], r["kernel_ms"], r["torch_over_kernel"]]
         for r in rows],
    )  # fmt: skip
    slower = [f"{r['kernel']}: {r['case']} ({r['torch_over_kernel']:.2f})" for r in rows
              if r["torch_over_kernel"] < 1.0]  # fmt: skip
    tail = "slower than torch: " + ("; ".join(slower) if slower else "none")
    idle = result.get("not_taken", {})
    if idle:
        tail += "\n\nbuilt, not taken here: " + "; ".join(f"{k} ({v})" for k, v in idle.items())
    return f"{cpu_line(result['cpu'])}\n\n{table}\n\n{tail}\n"


def not_taken() -> dict[str, str]:
    """Kernels built on this CPU that the engine does not dispatch to here, with why."""
    from sglang.srt import kernels
    from sglang.srt.kernels import ops

    idle = {}
    if kernels.load("gemm_bf16") is not None and ops.native_gemm() is None:
        idle["gemm_bf16"] = "oneDNN's product: AMX, or no AVX512-BF16"
    return idle


def plot(result: dict[str, Any], path: Any) -> None:
    plt = pyplot()
    rows = result["rows"]
    fig, ax = plt.subplots(figsize=(7, 0.22 * len(rows) + 1))
    labels = [f"{r['kernel']}: {r['case']}" for r in rows]
    ratios = [r["torch_over_kernel"] for r in rows]
    ax.barh(range(len(rows)), ratios, color=["#c44" if v < 1 else "#48a" for v in ratios])
    ax.axvline(1.0, color="black", lw=0.8)
    ax.set_yticks(range(len(rows)), labels, fontsize=6)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("torch time / kernel time (above 1: the kernel is faster)")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", choices=SHAPES, default="7b")
    p.add_argument("--portable", action="store_true", help="the portable builds too")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", default="results/kernels_vs_torch")
    args = p.parse_args(argv)
    torch.manual_seed(0)
    cpu = cpu_info()
    print(cpu_line(cpu))
    from sglang.srt import kernels

    isa = {name: kernels.load(name).isa() for name in kernels.kernel_names()
           if kernels.load(name) is not None}  # fmt: skip
    rows = measure(cases(args.shape, args.portable), args.repeats)
    result = {"benchmark": "kernels_vs_torch", "shape": args.shape, "cpu": cpu,
              "threads": torch.get_num_threads(), "kernel_isa": isa, "rows": rows,
              "not_taken": not_taken()}  # fmt: skip
    write_results(args.out, result, markdown(result), lambda path: plot(result, path))
    return result


if __name__ == "__main__":
    main()
