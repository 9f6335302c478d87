"""The benchmarks' client of the server: the streaming chat request and what it measures,
`/server_info`, `/flush_cache` and the served model's name."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

CACHE_MODES = ("per-image", "combined", "off")


THINK_MODES = ("none", "qwen3")


def think_mode_body(mode: str) -> dict[str, Any]:
    """Extra chat-request fields for a reasoning model's thinking switch: ``qwen3`` turns
    thinking off through the chat template (``enable_thinking: false``), as the reference
    Qwen3.5 runs do; ``none`` sends nothing."""
    if mode not in THINK_MODES:
        raise ValueError(f"think mode must be one of {THINK_MODES}, not {mode!r}")
    return {"chat_template_kwargs": {"enable_thinking": False}} if mode == "qwen3" else {}


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
