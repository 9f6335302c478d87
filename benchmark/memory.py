"""Memory per setting on a Qwen2.5-VL-7B-shaped checkpoint: peak RSS, TTFT and decode speed.

Builds (once, cached under the project cache dir) a checkpoint with Qwen2.5-VL-7B-Instruct's
real shapes and random bfloat16 weights (``benchmark.lib.shaped_checkpoints``). Then, per
setting (bfloat16, and int8wo / int4wo-128 where the server has ``--torchao-config``; on request
int8dq / 8da4w-128 (int8 activations, the tower's too), bfloat16-plain (the language model's
plain weights as served on CPUs without the native GEMM), auto (the server's default dtype:
bfloat16 weights under float32 compute on CPUs without native bfloat16), float32, and awq /
gptq: a twin of the checkpoint in that published format, built beside it), it launches the
server and records the peak RSS of its processes once ready and after one chat request with two
448x448 JPEGs, that request's TTFT and decode tokens/s.
A float32 launch shows the fit check: refused before loading, with its peak RSS.

    python -m benchmark.memory                               # the full 7B shape (~17 GB RAM)
    python -m benchmark.memory --layers 2 --vision-depth 2   # real widths, 2 + 2 layers
    python -m benchmark.memory --shape tiny                  # tiny widths, for tests
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from tqdm import tqdm

from benchmark.lib.client import server_info
from benchmark.lib.counters import counter_delta, perf_counters
from benchmark.lib.hardware import cpu_info, cpu_line, memory_bandwidth_gbs, rss_snapshot
from benchmark.lib.images import image_part, make_jpeg
from benchmark.lib.report import markdown_table, pyplot, write_json
from benchmark.lib.shaped_checkpoints import (
    GIB,
    SHAPES,
    cached_checkpoint,
    checkpoint_bytes,
    published_twin,
    shape_config,
)
from benchmark.servers import Server, free_port, launch

# name -> (dtype, server flags); the first three run by default.
SETTINGS: dict[str, tuple[str, list[str]]] = {
    "bfloat16": ("bfloat16", []),
    "int8wo": ("bfloat16", ["--torchao-config", "int8wo"]),
    "int4wo-128": ("bfloat16", ["--torchao-config", "int4wo-128"]),
    "int8dq": ("bfloat16", ["--torchao-config", "int8dq", "--vision-int8dq"]),
    "8da4w-128": ("bfloat16", ["--torchao-config", "8da4w-128", "--vision-int8dq"]),
    "bfloat16-plain": ("bfloat16", ["--cpu-packed-lm-weights", "off"]),  # no native GEMM
    # the server's default: bfloat16 weights under float32 compute on CPUs without native
    # bfloat16 (--cpu-bf16-weights auto), bfloat16 elsewhere
    "auto": ("auto", []),
    "float32": ("float32", []),
    # the same weights' shapes published quantized (random codes, group 128), loaded as they are
    "awq": ("bfloat16", ["--quantization", "awq"]),
    "gptq": ("bfloat16", ["--quantization", "gptq"]),
}
PUBLISHED = ("awq", "gptq")  # settings that serve a quantized twin of the checkpoint
DEFAULT_SETTINGS = ("bfloat16", "int8wo", "int4wo-128")


# Measurements ----------------------------------------------------------------------------------


def timed_chat(client: httpx.Client, server: Server, images: list[bytes], max_tokens: int) -> dict:
    """One streamed two-image chat. ``logprobs`` makes every token its own chunk, even one the
    small tokenizer decodes to nothing (the random model's ids reach past its vocabulary)."""
    content = [*(image_part(img) for img in images), {"type": "text", "text": "Describe both."}]
    body = {
        "model": server.model, "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "logprobs": True,
        "stream": True, "stream_options": {"include_usage": True},
    }  # fmt: skip
    start = time.perf_counter()
    first = last = None
    usage: dict[str, Any] = {}
    with client.stream("POST", f"{server.base_url}/v1/chat/completions", json=body) as resp:
        if resp.status_code != 200:
            resp.read()
            raise RuntimeError(f"HTTP {resp.status_code}: {resp.text[:300]}")
        for line in resp.iter_lines():
            if not line.startswith("data:") or line[5:].strip() == "[DONE]":
                continue
            data = json.loads(line[5:])
            usage = data.get("usage") or usage
            if any(_has_token(choice) for choice in data.get("choices") or []):
                last = time.perf_counter()
                first = first or last
    tokens = int(usage.get("completion_tokens") or 0)
    ttft = (first or time.perf_counter()) - start
    decode_s = (last - first) if first and last else 0.0
    return {
        "ttft_s": ttft,
        "prompt_tokens": int(usage.get("prompt_tokens") or 0),
        "completion_tokens": tokens,
        "decode_tok_per_s": (tokens - 1) / decode_s if tokens > 1 and decode_s > 0 else None,
    }


def _has_token(choice: dict[str, Any]) -> bool:
    """A chunk that carries output (not the opening role-only chunk)."""
    logprobs = choice.get("logprobs") or {}
    return bool((choice.get("delta") or {}).get("content") or logprobs.get("content"))


def run_setting(
    model: Path,
    setting: str,
    dtype: str,
    flags: list[str],
    opts: argparse.Namespace,
    log_dir: Path,
) -> dict[str, Any]:
    """Launch, measure RSS once ready, send ``opts.requests`` two-image chats (new images
    each: the first is cold, later ones run with the weights' pages resident), measure again."""
    timeout, max_tokens = opts.timeout, opts.max_tokens
    with launch("ours", str(model), "per-image", flags, timeout=timeout, log_dir=log_dir,
                dtype=dtype) as server, httpx.Client(timeout=3600) as client:  # fmt: skip
        assert server.proc is not None
        at_start = rss_snapshot(server.proc.pid)
        memory = client.get(f"{server.base_url}/server_info").json().get("memory")
        requests = []
        before, copy_gb_per_s = None, 0.0
        for k in range(opts.requests):
            images = [make_jpeg(7000 + 2 * k + i, 448, 448) for i in range(2)]
            if k == opts.requests - 1:  # the last (warm) request's decode against a probe
                copy_gb_per_s = memory_bandwidth_gbs(seconds=0.3)["gb_per_s"]
                before = perf_counters(server_info(client, server.base_url))
            requests.append(timed_chat(client, server, images, max_tokens))
        delta = counter_delta(before, perf_counters(server_info(client, server.base_url)))
        after = rss_snapshot(server.proc.pid)
    return {
        "setting": setting,
        "flags": ["--dtype", dtype, *flags],
        "startup_s": server.startup_s,
        "rss_at_start": at_start,
        "rss_after_request": after,
        "request": requests[0],
        "warm_request": requests[-1] if len(requests) > 1 else None,
        "server_memory": memory,
        "decode_read": decode_read(delta, copy_gb_per_s),
    }


def decode_read(delta: dict[str, float] | None, copy_gb_per_s: float) -> dict[str, Any] | None:
    """The warm request's decode steps: bytes each read (weights and KV), the rate the forward
    passes read them at, and that rate over the copy probe taken just before the request."""
    if not delta or not delta.get("decode_steps") or not delta.get("decode_forward_seconds"):
        return None
    if copy_gb_per_s <= 0:
        return None
    rate = delta["decode_bytes"] / delta["decode_forward_seconds"] / 1e9
    return {
        "bytes_per_step": delta["decode_bytes"] / delta["decode_steps"],
        "gb_per_s": rate,
        "copy_gb_per_s": copy_gb_per_s,
        "of_bandwidth": rate / copy_gb_per_s,
    }


def refusal_run(model: Path, dtype: str, timeout: float, env: dict[str, str]) -> dict[str, Any]:
    """Launch with ``dtype`` and expect the fit check to refuse it: the exit status, the
    message and the peak RSS of the launch's whole process tree (from ``wait4``). A launch
    that starts serving instead is stopped and reported as not refused."""
    port = free_port()
    cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", str(model),
           "--port", str(port), "--dtype", dtype, "--enable-multimodal"]  # fmt: skip
    start = time.perf_counter()
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **env},
            start_new_session=True,
        )  # fmt: skip
        status, ru = _wait4(proc.pid, timeout, f"http://127.0.0.1:{port}/health")
        proc.returncode = os.waitstatus_to_exitcode(status)
        log.seek(0)
        text = log.read().decode(errors="replace")
    message = ([""] + re.findall(r".*not enough memory.*", text))[-1]
    return {
        "dtype": dtype,
        "refused": proc.returncode != 0 and bool(message),
        "exit_code": proc.returncode,
        "seconds": time.perf_counter() - start,
        "message": message.removeprefix("error: ").strip(),
        "max_rss_mb": ru.ru_maxrss / 1024,
    }


def _wait4(pid: int, timeout: float, health_url: str) -> tuple[int, Any]:
    """Reap ``pid``, ending its process group when it serves or outlives ``timeout``: its wait
    status and the rusage of it and its reaped descendants (``ru_maxrss``: the largest peak)."""
    deadline = time.monotonic() + timeout
    while True:
        done, status, ru = os.wait4(pid, os.WNOHANG)
        if done:
            return status, ru
        if time.monotonic() > deadline or _healthy(health_url):
            os.killpg(pid, signal.SIGTERM)
            _, status, ru = os.wait4(pid, 0)
            return status, ru
        time.sleep(0.5)


def _healthy(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


# Report ----------------------------------------------------------------------------------------
def has_torchao_flag() -> bool:
    from sglang.srt.server_args import ServerArgs

    return "torchao_config" in {f.name for f in dataclasses.fields(ServerArgs)}


def markdown(result: dict[str, Any]) -> str:
    rows = []
    for r in result["runs"]:
        req, mem = r["request"], r["server_memory"] or {}
        weights, kv = mem.get("weights_bytes") or 0, mem.get("kv_pool_bytes") or 0
        warm = r["warm_request"] or req
        after = r["rss_after_request"]
        read = r.get("decode_read") or {}
        rows.append([
            r["setting"], r.get("checkpoint_bytes", 0) / GIB, weights / GIB, kv / GIB,
            r["rss_at_start"]["peak_mb"] / 1024, r.get("load_peak_over_checkpoint"),
            after["peak_mb"] / 1024, after["rss_mb"] / 1024, after["file_mb"] / 1024,
            req["ttft_s"], warm["ttft_s"], warm["decode_tok_per_s"], read.get("gb_per_s"),
            read.get("copy_gb_per_s"), read.get("of_bandwidth"), r["startup_s"],
        ])  # fmt: skip
    head = ["setting", "checkpoint GiB", "weights GiB", "KV pool GiB", "peak RSS at start GiB",
            "loading process peak / checkpoint",
            "peak RSS after requests GiB", "RSS after requests GiB", "of it file pages GiB",
            "TTFT s (cold)", "TTFT s (warm)", "decode tok/s (warm)", "decode reads GB/s",
            "copy probe GB/s", "of the probe", "start-up s"]  # fmt: skip
    text = cpu_line(result["cpu"]) + "\n\n" + markdown_table(head, rows) + "\n"
    for note in result["skipped"]:
        text += f"\nskipped: {note}\n"
    ref = result.get("refusal")
    if ref:
        text += (
            f"\n{ref['dtype']} launch: refused={ref['refused']} (exit {ref['exit_code']}, "
            f"{ref['seconds']:.1f} s, peak RSS {ref['max_rss_mb']:.0f} MiB)\n\n> {ref['message']}\n"
        )
    return text


def plot(result: dict[str, Any], path: Path) -> None:
    plt = pyplot()
    runs = result["runs"]
    labels = [r["setting"] for r in runs]
    xs = range(len(runs))
    fig, (a, b, c) = plt.subplots(1, 3, figsize=(10.5, 3.2))
    a.bar([x - 0.2 for x in xs], [r["rss_after_request"]["peak_mb"] / 1024 for r in runs], 0.4,
          label="peak (loading included)")  # fmt: skip
    a.bar([x + 0.2 for x in xs], [r["rss_after_request"]["rss_mb"] / 1024 for r in runs], 0.4,
          label="resident after the requests")  # fmt: skip
    a.bar([x + 0.2 for x in xs], [r["rss_after_request"]["anon_mb"] / 1024 for r in runs], 0.4,
          color="black", alpha=0.35, label="of it anonymous (not file pages)")  # fmt: skip
    a.set_ylabel("RSS of the server (GiB)")
    a.legend(fontsize=7)
    b.bar(labels, [r["request"]["ttft_s"] for r in runs])
    b.set_ylabel("TTFT, 2 x 448x448, cold (s)")
    c.bar(labels, [(r["warm_request"] or r["request"])["decode_tok_per_s"] or 0 for r in runs])
    c.set_ylabel("decode tokens / s")
    for ax in (a, b, c):
        ax.set_xticks(list(xs), labels)
        ax.grid(alpha=0.3, axis="y")
    fig.suptitle(cpu_line(result["cpu"]), fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=70)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", choices=SHAPES, default="7b")
    p.add_argument("--layers", type=int, help="language-model layers (default: the shape's)")
    p.add_argument("--vision-depth", type=int, help="vision blocks (default: the shape's)")
    p.add_argument("--model-path", help="use this checkpoint instead of building one")
    p.add_argument("--settings", default=",".join(DEFAULT_SETTINGS), help=f"of {list(SETTINGS)}")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--requests", type=int, default=2, help="two-image chats per setting")
    p.add_argument("--refuse-dtype", default="float32", help="launch to refuse ('' skips it)")
    p.add_argument(
        "--refuse-available-bytes", type=int, help="its SGLANG_AVAILABLE_MEMORY_BYTES (tests)"
    )
    p.add_argument("--timeout", type=float, default=1800, help="seconds for a server to start")
    p.add_argument("--out", default="results/memory")
    p.add_argument("--build-only", action="store_true", help="build the checkpoint, print it")
    args = p.parse_args(argv)
    dims = shape_config(args.shape, args.layers, args.vision_depth)
    if args.build_only:
        print(cached_checkpoint(dims, args.shape))
        return {}
    cpu = cpu_info()
    print(cpu_line(cpu))
    model = Path(args.model_path) if args.model_path else cached_checkpoint(dims, args.shape)
    out = Path(args.out)
    result: dict[str, Any] = {
        "benchmark": "memory", "cpu": cpu, "shape": args.shape, "dims": dims,
        "model_path": str(model), "runs": [], "skipped": [],
    }  # fmt: skip
    if args.refuse_dtype:  # first: nothing else has run in this process' children yet
        avail = args.refuse_available_bytes
        env = {"SGLANG_AVAILABLE_MEMORY_BYTES": str(avail)} if avail else {}
        result["refusal"] = refusal_run(model, args.refuse_dtype, args.timeout, env)
        print(f"{args.refuse_dtype}: {result['refusal']['message'] or 'not refused'}")
    settings = [s for s in args.settings.split(",") if s]
    quantized = [s for s in settings if "--torchao-config" in SETTINGS[s][1]]
    if quantized and not has_torchao_flag():
        note = f"{', '.join(quantized)}: this server has no --torchao-config"
        print(f"skipping {note}")
        result["skipped"].append(note)
        settings = [s for s in settings if s not in quantized]
    log_dir = Path(tempfile.mkdtemp(prefix="bench-memory-logs-"))
    for setting in tqdm(settings, desc="memory"):
        dtype, flags = SETTINGS[setting]
        path = published_twin(model, setting) if setting in PUBLISHED else model
        run = run_setting(path, setting, dtype, flags, args, log_dir)
        run["checkpoint_bytes"] = checkpoint_bytes(path)
        # the loading process's own peak (the scheduler's; the API process loads no weights)
        loading_peak = run["rss_at_start"]["max_process_peak_mb"] * 2**20
        run["load_peak_over_checkpoint"] = loading_peak / run["checkpoint_bytes"]
        result["runs"].append(run)
        write_json(out.with_suffix(".partial.json"), result)
    write_json(out.with_suffix(".json"), result)
    out.with_suffix(".partial.json").unlink(missing_ok=True)
    md = markdown(result)
    out.with_suffix(".md").write_text(md)
    if result["runs"]:
        plot(result, out.with_suffix(".png"))
    print(md)
    return result


if __name__ == "__main__":
    main()
