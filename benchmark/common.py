"""Shared pieces of the benchmarks: images, the streaming chat client, statistics, output."""

from __future__ import annotations

import base64
import contextlib
import io
import json
import os
import platform
import statistics
import subprocess
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from PIL import Image

CACHE_MODES = ("per-image", "combined", "off")
THINK_MODES = ("none", "qwen3")


def think_mode_body(mode: str) -> dict[str, Any]:
    """Extra chat-request fields for a reasoning model's thinking switch: ``qwen3`` turns
    thinking off through the chat template (``enable_thinking: false``), as the reference
    Qwen3.5 runs do; ``none`` sends nothing."""
    if mode not in THINK_MODES:
        raise ValueError(f"think mode must be one of {THINK_MODES}, not {mode!r}")
    return {"chat_template_kwargs": {"enable_thinking": False}} if mode == "qwen3" else {}


ENCODER_KEYS = ("encoder_seconds", "encoded_items", "encoded_tokens", "encoder_calls", "hits")


def make_jpeg(image_id: int, width: int, height: int, quality: int = 85) -> bytes:
    """A deterministic JPEG: uniform noise from a generator seeded with the image id."""
    pixels = np.random.default_rng(image_id).integers(0, 256, (height, width, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="JPEG", quality=quality)
    return buf.getvalue()


def data_url(jpeg: bytes) -> str:
    return "data:image/jpeg;base64," + base64.b64encode(jpeg).decode()


def image_part(jpeg: bytes) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": data_url(jpeg)}}


def parse_resolution(text: str) -> tuple[int, int]:
    w, h = text.lower().split("x")
    return int(w), int(h)


@dataclass
class ChatResult:
    ok: bool = False
    text: str = ""
    ttft: float = 0.0  # seconds from sending to the first streamed content
    latency: float = 0.0
    itl: list[float] = field(default_factory=list)  # gaps between content chunks
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int | None = None
    error: str = ""


JSON = {"content-type": "application/json"}


def _chat_body(
    model: str, messages: list[dict], max_tokens: int, stream: bool, extra: dict | None
) -> bytes:
    """The request body, encoded before the clock starts: TTFT counts from sending the request,
    not the client's own JSON encoding (~40 ms for a chat of eight 720p images)."""
    body: dict[str, Any] = {
        "model": model,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": stream,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    return json.dumps({**body, **(extra or {})}).encode()


def _apply_usage(res: ChatResult, usage: dict | None) -> None:
    if not usage:
        return
    res.prompt_tokens = int(usage.get("prompt_tokens") or 0)
    res.completion_tokens = int(usage.get("completion_tokens") or 0)
    details = usage.get("prompt_tokens_details") or {}
    if details.get("cached_tokens") is not None:
        res.cached_tokens = int(details["cached_tokens"])


def _consume_sse_line(line: str, res: ChatResult, start: float, last: list[float]) -> None:
    if not line.startswith("data:"):
        return
    payload = line[5:].strip()
    if payload == "[DONE]" or not payload:
        return
    data = json.loads(payload)
    if "error" in data and not data.get("choices"):
        raise RuntimeError(str(data["error"]))
    _apply_usage(res, data.get("usage"))
    for choice in data.get("choices") or []:
        content = (choice.get("delta") or {}).get("content")
        if content:
            now = time.perf_counter()
            if not res.ttft:
                res.ttft = now - start
            else:
                res.itl.append(now - last[0])
            last[0] = now
            res.text += content


def chat(
    client: httpx.Client,
    base_url: str,
    model: str,
    messages: list[dict],
    max_tokens: int,
    stream: bool = True,
    extra: dict | None = None,
) -> ChatResult:
    """One OpenAI chat completion (streamed by default), timed on the client."""
    res = ChatResult()
    body = _chat_body(model, messages, max_tokens, stream, extra)
    start = time.perf_counter()
    last = [start]
    try:
        if stream:
            with client.stream(
                "POST", f"{base_url}/v1/chat/completions", content=body, headers=JSON
            ) as resp:
                if resp.status_code != 200:
                    resp.read()
                    raise RuntimeError(f"HTTP {resp.status_code}: {resp.text[:300]}")
                for line in resp.iter_lines():
                    _consume_sse_line(line, res, start, last)
        else:
            resp = client.post(f"{base_url}/v1/chat/completions", content=body, headers=JSON)
            if resp.status_code != 200:
                raise RuntimeError(f"HTTP {resp.status_code}: {resp.text[:300]}")
            data = resp.json()
            res.text = data["choices"][0]["message"].get("content") or ""
            _apply_usage(res, data.get("usage"))
        res.latency = time.perf_counter() - start
        res.ttft = res.ttft or res.latency
        res.ok = True
    except (httpx.HTTPError, RuntimeError, json.JSONDecodeError, KeyError) as exc:
        res.latency = time.perf_counter() - start
        res.error = f"{type(exc).__name__}: {exc}"[:500]
    return res


async def achat(
    client: httpx.AsyncClient,
    base_url: str,
    model: str,
    messages: list[dict],
    max_tokens: int,
    stream: bool = True,
    extra: dict | None = None,
) -> ChatResult:
    """Async twin of ``chat`` for concurrent load."""
    res = ChatResult()
    body = _chat_body(model, messages, max_tokens, stream, extra)
    start = time.perf_counter()
    last = [start]
    try:
        if stream:
            async with client.stream(
                "POST", f"{base_url}/v1/chat/completions", content=body, headers=JSON
            ) as r:
                if r.status_code != 200:
                    await r.aread()
                    raise RuntimeError(f"HTTP {r.status_code}: {r.text[:300]}")
                async for line in r.aiter_lines():
                    _consume_sse_line(line, res, start, last)
        else:
            r = await client.post(f"{base_url}/v1/chat/completions", content=body, headers=JSON)
            if r.status_code != 200:
                raise RuntimeError(f"HTTP {r.status_code}: {r.text[:300]}")
            data = r.json()
            res.text = data["choices"][0]["message"].get("content") or ""
            _apply_usage(res, data.get("usage"))
        res.latency = time.perf_counter() - start
        res.ttft = res.ttft or res.latency
        res.ok = True
    except (httpx.HTTPError, RuntimeError, json.JSONDecodeError, KeyError) as exc:
        res.latency = time.perf_counter() - start
        res.error = f"{type(exc).__name__}: {exc}"[:500]
    return res


def server_info(client: httpx.Client, base_url: str) -> dict[str, Any]:
    try:
        resp = client.get(f"{base_url}/server_info")
        return resp.json() if resp.status_code == 200 else {}
    except (httpx.HTTPError, json.JSONDecodeError):
        return {}


def encoder_counters(info: dict[str, Any]) -> dict[str, float] | None:
    cache = info.get("mm_embedding_cache")
    if not isinstance(cache, dict):
        return None
    return {k: float(cache.get(k, 0) or 0) for k in ENCODER_KEYS}


def gc_counters(info: dict[str, Any]) -> dict[str, float] | None:
    """The compute process's garbage-collection counters (servers of this project only)."""
    gc = info.get("gc")
    if not isinstance(gc, dict):
        return None
    return {k: float(gc.get(k, 0) or 0) for k in ("collections", "seconds")}


def counter_delta(
    before: dict[str, float] | None, after: dict[str, float] | None
) -> dict[str, float] | None:
    if before is None or after is None:
        return None
    return {k: after[k] - before[k] for k in after}


PERF_KEYS = (
    "vision_seconds",
    "vision_flops",
    "vision_attention_seconds",
    "vision_attention_flops",
    "lm_attention_seconds",
    "lm_attention_flops",
    "lm_linear_flops",
    "lm_head_flops",
    "prefill_forward_seconds",
    "decode_forward_seconds",
    "decode_steps",
    "decode_bytes",
    "sampling_seconds",
)


def perf_counters(info: dict[str, Any]) -> dict[str, float] | None:
    perf = info.get("perf")
    if not isinstance(perf, dict):
        return None
    return {k: float(perf.get(k, 0) or 0) for k in PERF_KEYS}


def achieved(delta: dict[str, float] | None, peak_gflops: float | None) -> dict[str, Any]:
    """GFLOP/s of the vision tower and of LM attention over a counter delta, and their
    fraction of the matmul peak."""
    out: dict[str, Any] = {}
    for part in ("vision", "lm_attention"):
        seconds = delta.get(f"{part}_seconds", 0.0) if delta else 0.0
        flops = delta.get(f"{part}_flops", 0.0) if delta else 0.0
        rate = flops / seconds / 1e9 if seconds > 0 else None
        out[f"{part}_ms"] = seconds * 1e3 if delta else None
        out[f"{part}_gflops"] = flops / 1e9 if delta else None
        out[f"{part}_gflop_per_s"] = rate
        out[f"{part}_of_peak"] = rate / peak_gflops if rate and peak_gflops else None
    return out


ROUND_PARTS = ("vision_attention", "vision_dense", "lm_attention", "lm_dense")


def parts_of_round(
    perf: dict[str, float] | None,
    encoder: dict[str, float] | None,
    ttft_s: float,
    peaks: dict[str, float | None],
) -> dict[str, Any]:
    """A prefill round's work in four parts (``ROUND_PARTS``), each against ``peaks[part]``,
    the peak of the arithmetic it runs in: the vision tower's attention and the LM's attention;
    the rest of the tower (linears, patch embedding, and the norms and activations between
    them) and of the LM forward (linears, head, norms, KV stores), which under int8dq multiply
    int8. Each part: ``<part>_ms``, ``<part>_gflop_per_s``, ``<part>_of_peak``.
    ``mfu_at_part_peaks``: the round's time if every part ran at its own peak, over TTFT (1.0 =
    no time lost anywhere, API and preprocessing included)."""
    if perf is None:
        return {}
    encoder_s = encoder["encoder_seconds"] if encoder else perf["vision_seconds"]
    lm_s = max(perf["prefill_forward_seconds"] - encoder_s, 0.0)
    vision_attention_s = perf["vision_attention_seconds"]
    work = {
        "vision_attention": (vision_attention_s, perf["vision_attention_flops"]),
        "vision_dense": (
            perf["vision_seconds"] - vision_attention_s,
            perf["vision_flops"] - perf["vision_attention_flops"],
        ),
        "lm_attention": (perf["lm_attention_seconds"], perf["lm_attention_flops"]),
        "lm_dense": (
            lm_s - perf["lm_attention_seconds"],
            perf["lm_linear_flops"] + perf["lm_head_flops"],
        ),
    }
    out: dict[str, Any] = {}
    for part, (seconds, flops) in work.items():
        peak = peaks.get(part)
        rate = flops / seconds / 1e9 if seconds > 0 else None
        out[f"{part}_ms"] = seconds * 1e3
        out[f"{part}_gflop_per_s"] = rate
        out[f"{part}_of_peak"] = rate / peak if rate and peak else None
    worked = {part: flops for part, (_, flops) in work.items() if flops}
    if ttft_s > 0 and all(peaks.get(part) for part in worked):
        ideal_s = sum(flops / (peaks[part] * 1e9) for part, flops in worked.items())
        out["mfu_at_part_peaks"] = ideal_s / ttft_s
    else:
        out["mfu_at_part_peaks"] = None
    return out


def round_breakdown(
    perf: dict[str, float] | None,
    encoder: dict[str, float] | None,
    ttft_s: float,
    peak_gflops: float | None,
    bandwidth_gbs: float | None,
) -> dict[str, Any]:
    """A round's model FLOPs utilisation (every FLOP of the round over TTFT over the GEMM peak in
    the dtype in use), where its time went, and its decode steps against memory bandwidth.

    Parts of TTFT: ``preprocess_ms`` (the encoder path outside the tower: preprocessing and the
    move to the device), ``vision_ms``, ``lm_ms`` (prefill forwards without the encoder path),
    ``sampling_ms``; ``api_other_ms`` is the rest (HTTP, tokenization, queueing, streaming).
    Decode: ``decode_ms_per_step`` and ``decode_of_bandwidth`` = (bytes a step must read /
    bandwidth) / its time, 1.0 at the bandwidth limit. FLOPs are the prefill forwards' (the
    runner counts none for decode steps); the parts of TTFT assume a request's decode steps come
    after its first token (true for one request)."""
    if perf is None:
        return {}
    flops = sum(perf[k] for k in ("vision_flops", "lm_attention_flops", "lm_linear_flops"))
    flops += perf["lm_head_flops"]
    encoder_s = encoder["encoder_seconds"] if encoder else perf["vision_seconds"]
    steps = perf["decode_steps"]
    prefill_s = perf["prefill_forward_seconds"]
    sampling_s = perf["sampling_seconds"] * (1 / (1 + steps))  # the first token's sampling
    decode_s = perf["decode_forward_seconds"]
    out = {
        "round_gflops": flops / 1e9,
        "mfu": flops / ttft_s / 1e9 / peak_gflops if peak_gflops and ttft_s > 0 else None,
        "preprocess_ms": max(encoder_s - perf["vision_seconds"], 0.0) * 1e3,
        "lm_ms": max(prefill_s - encoder_s, 0.0) * 1e3,
        "sampling_ms": sampling_s * 1e3,
        "api_other_ms": max(ttft_s - prefill_s - sampling_s, 0.0) * 1e3,
        "decode_ms_per_step": decode_s / steps * 1e3 if steps else None,
        "decode_of_bandwidth": None,
    }
    if steps and bandwidth_gbs and decode_s > 0:
        out["decode_of_bandwidth"] = perf["decode_bytes"] / (bandwidth_gbs * 1e9) / decode_s
    return out


def matmul_peak_gflops(
    size: int = 1024, seconds: float = 1.5, dtype: str = "float32"
) -> dict[str, Any]:
    """The machine's matrix-multiply rate in ``dtype`` with torch's default threads: the best of
    repeated size^3 products over about ``seconds`` (best, because other load only slows it).
    In bfloat16, where the engine's own GEMM serves the packed linears (``packed_linear``), the
    faster of torch's product and it (both rates are reported). ``int8``: the rate of
    ``vpdpbusd`` itself on every thread (``linear_int8dq.peak_ops``), the peak int8dq's MFU is
    counted against."""
    import torch

    if dtype == "int8":
        from sglang.srt import kernels

        int8 = kernels.load("linear_int8dq")
        rate = int8.peak_ops(seconds) / 1e9 if int8 is not None else 0.0
        return {"gflop_per_s": rate, "instruction": "vpdpbusd", "size": None,
                "threads": torch.get_num_threads(), "dtype": dtype}  # fmt: skip

    from sglang.srt.layers import packed_linear

    kind = getattr(torch, dtype)
    a, b = torch.randn(size, size).to(kind), torch.randn(size, size).to(kind)
    rates = {"torch": _best_rate(lambda: torch.mm(a, b), size, seconds)}
    native = packed_linear.native_gemm() if kind == torch.bfloat16 else None
    if native is not None:
        packed = native.pack(b.t().contiguous())
        rates["native"] = _best_rate(lambda: native.linear(a, packed, None, size), size, seconds)
    return {
        "gflop_per_s": max(rates.values()),
        **{f"{name}_gflop_per_s": rate for name, rate in rates.items()},
        "size": size,
        "threads": torch.get_num_threads(),
        "dtype": dtype,
    }


def cuda_matmul_peak_gflops(size: int = 8192, repeats: int = 10) -> dict[str, Any]:
    """The GPU's bfloat16 matrix-multiply rate: the best of ``repeats`` size^3 products, each
    timed with CUDA events."""
    import torch

    a, b = (torch.randn(size, size, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    torch.mm(a, b)
    best = float("inf")
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.mm(a, b)
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / 1e3)
    return {"gflop_per_s": 2 * size**3 / best / 1e9, "size": size, "dtype": "bfloat16"}


def _best_rate(product: Callable[[], Any], size: int, seconds: float) -> float:
    product()  # warm-up: packing and kernel selection
    best, deadline = float("inf"), time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        start = time.perf_counter()
        product()
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best / 1e9


def memory_bandwidth_gbs(megabytes: int = 512, seconds: float = 1.0) -> dict[str, Any]:
    """Host memory bandwidth from a copy probe: bytes read plus bytes written per second, best
    of repeated copies of a buffer far larger than the caches."""
    import torch

    src = torch.ones(megabytes * 2**20 // 4)
    dst = torch.empty_like(src)
    dst.copy_(src)
    best, deadline = float("inf"), time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        start = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - start)
    moved = 2 * src.numel() * src.element_size()
    threads = torch.get_num_threads()
    return {"gb_per_s": moved / best / 1e9, "megabytes": megabytes, "threads": threads}


def cpu_info() -> dict[str, Any]:
    """``lscpu``'s model name and the ISA flags that matter for bfloat16 / int8 matmuls."""
    text = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    flags = set(fields.get("Flags", "").split())
    wanted = ("amx_bf16", "amx_int8", "amx_tile", "avx512_bf16", "avx512_vnni", "avx512f", "avx2")
    return {
        "model_name": fields.get("Model name", platform.processor()).strip(),
        "cores": os.cpu_count(),
        "isa": {flag: flag in flags for flag in wanted},
    }


def gpu_info() -> dict[str, Any] | None:
    """The CUDA device torch sees (None without one): name, memory, multiprocessors, and the
    torch, CUDA and driver versions."""
    import torch

    if not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(0)
    query = ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]
    try:
        driver = subprocess.run(query, capture_output=True, text=True, check=False).stdout.strip()
    except OSError:
        driver = ""
    return {
        "name": props.name,
        "memory_gib": round(props.total_memory / 2**30, 1),
        "multiprocessors": props.multi_processor_count,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "driver": driver or None,
    }


def gpu_line(info: dict[str, Any]) -> str:
    return (
        f"GPU: {info['name']}, {info['memory_gib']} GiB, {info['multiprocessors']} SMs; "
        f"torch {info['torch']}, CUDA {info['cuda']}, driver {info['driver']}"
    )


def cpu_line(info: dict[str, Any]) -> str:
    have = [flag for flag, ok in info["isa"].items() if ok]
    return f"CPU: {info['model_name']}, {info['cores']} cores; ISA: {' '.join(have) or 'none'}"


def process_tree_cpu_seconds(pid: int | None) -> float | None:
    """User + system CPU seconds used so far by process ``pid`` and its live descendants: work
    per request that other load on the machine does not inflate (unlike wall time)."""
    procs = _process_tree(pid)
    if procs is None:
        return None
    import psutil

    total = 0.0
    for proc in procs:
        try:
            times = proc.cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system
    return total


def _process_tree(pid: int | None) -> list[Any] | None:
    """psutil handles of process ``pid`` and its live descendants (None: no such process)."""
    if pid is None:
        return None
    import psutil

    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return None


@contextlib.contextmanager
def paused(pids: list[int | None]) -> Iterator[None]:
    """Stops (SIGSTOP) the processes ``pids`` and their descendants for the block, then resumes
    them: servers left idle beside the one measured (vLLM's polls its queues while idle, ~0.4
    of a core) cannot take CPU from it."""
    import psutil

    procs = [proc for pid in pids for proc in _process_tree(pid) or []]
    stopped = []
    try:
        for proc in procs:
            try:
                proc.suspend()
                stopped.append(proc)
            except psutil.Error:
                continue
        yield
    finally:
        for proc in reversed(stopped):
            try:
                proc.resume()
            except psutil.Error:
                continue


def flush_cache(client: httpx.Client, base_url: str) -> bool:
    """Flush the prefix (and embedding) caches: SGLang's /flush_cache, else vLLM's dev routes."""
    for path in ("/flush_cache", "/reset_prefix_cache", "/reset_mm_cache"):
        try:
            if client.post(f"{base_url}{path}").status_code == 200 and path == "/flush_cache":
                return True
        except httpx.HTTPError:
            pass
    return False


def served_model(client: httpx.Client, base_url: str, default: str = "default") -> str:
    try:
        data = client.get(f"{base_url}/v1/models").json()["data"]
        return str(data[0]["id"])
    except (httpx.HTTPError, json.JSONDecodeError, KeyError, IndexError):
        return default


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
