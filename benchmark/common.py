"""Shared pieces of the benchmarks: images, the streaming chat client, statistics, output."""

from __future__ import annotations

import base64
import io
import json
import statistics
import time
from collections.abc import Iterable
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


def _chat_body(
    model: str, messages: list[dict], max_tokens: int, stream: bool, extra: dict | None
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": model,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": stream,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    return {**body, **(extra or {})}


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
            with client.stream("POST", f"{base_url}/v1/chat/completions", json=body) as resp:
                if resp.status_code != 200:
                    resp.read()
                    raise RuntimeError(f"HTTP {resp.status_code}: {resp.text[:300]}")
                for line in resp.iter_lines():
                    _consume_sse_line(line, res, start, last)
        else:
            resp = client.post(f"{base_url}/v1/chat/completions", json=body)
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
            async with client.stream("POST", f"{base_url}/v1/chat/completions", json=body) as r:
                if r.status_code != 200:
                    await r.aread()
                    raise RuntimeError(f"HTTP {r.status_code}: {r.text[:300]}")
                async for line in r.aiter_lines():
                    _consume_sse_line(line, res, start, last)
        else:
            r = await client.post(f"{base_url}/v1/chat/completions", json=body)
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


def counter_delta(
    before: dict[str, float] | None, after: dict[str, float] | None
) -> dict[str, float] | None:
    if before is None or after is None:
        return None
    return {k: after[k] - before[k] for k in after}


PERF_KEYS = ("vision_seconds", "vision_flops", "lm_attention_seconds", "lm_attention_flops")


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


def matmul_peak_gflops(size: int = 1024, seconds: float = 1.5) -> dict[str, Any]:
    """The machine's float32 matrix-multiply rate with torch's default threads: the best of
    repeated size^3 products over about ``seconds`` (best, because other load only slows it)."""
    import torch

    a, b = torch.randn(size, size), torch.randn(size, size)
    best, deadline = float("inf"), time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        start = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - start)
    return {
        "gflop_per_s": 2 * size**3 / best / 1e9,
        "size": size,
        "threads": torch.get_num_threads(),
        "dtype": "float32",
    }


def process_tree_cpu_seconds(pid: int | None) -> float | None:
    """User + system CPU seconds used so far by process ``pid`` and its live descendants: work
    per request that other load on the machine does not inflate (unlike wall time)."""
    if pid is None:
        return None
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return None
    total = 0.0
    for proc in procs:
        try:
            times = proc.cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system
    return total


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
