"""Prometheus metrics under SGLang's ``sglang:`` names (only with --enable-metrics)."""

from __future__ import annotations

import time
from collections import deque
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

STORE_COUNTERS = ("hits", "misses", "saved", "rejected", "errors")
HICACHE_COUNTERS = (
    "tokens_loaded",
    "pages_loaded",
    "pages_saved",
    "rejected",
    "errors",
    "pages_dropped",
    "prefetch_timeouts",
)
GEN_WINDOW_S = 10.0
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class Metrics:
    """Every series carries SGLang's ``model_name`` label (the served model name)."""

    def __init__(self, model_name: str = "default") -> None:
        r = self.registry = CollectorRegistry()
        label = {"model_name": model_name}

        def histogram(name: str, doc: str) -> Any:
            metric = Histogram(name, doc, ["model_name"], buckets=LATENCY_BUCKETS, registry=r)
            return metric.labels(**label)

        def counter(name: str, doc: str) -> Any:
            return Counter(name, doc, ["model_name"], registry=r).labels(**label)

        self.ttft = histogram("sglang:time_to_first_token_seconds", "Time to first token")
        self.e2e = histogram("sglang:e2e_request_latency_seconds", "End-to-end request latency")
        self.itl = histogram("sglang:inter_token_latency_seconds", "Inter-token latency")
        self.prompt_tokens = counter("sglang:prompt_tokens", "Prompt tokens")
        self.generation_tokens = counter("sglang:generation_tokens", "Generated tokens")
        self.cached_tokens = counter("sglang:cached_tokens", "Prompt tokens from the prefix cache")
        self.requests = counter("sglang:num_requests", "Finished requests")
        gauges = {
            "num_running_reqs": "Running requests",
            "num_queue_reqs": "Queued requests",
            "num_grammar_queue_reqs": "Requests whose grammar is compiling",
            "num_used_tokens": "KV slots in use",
            "token_usage": "Fraction of KV slots in use",
            "gen_throughput": f"Generated tokens per second over the last {GEN_WINDOW_S:g} s",
            "cache_hit_rate": "Prefix cache hit rate (cached / prompt tokens)",
            "mm_cache_hits": "Embedding cache hits",
            "mm_cache_misses": "Embedding cache misses",
            "mm_cache_evictions": "Embedding cache evictions",
            "mm_cache_entries": "Embedding cache entries",
            "mm_cache_bytes_used": "Embedding cache bytes in use",
            "mm_encoded_items": "Images encoded by the vision tower",
            "mm_encoded_tokens": "Image tokens encoded by the vision tower",
            "mm_encoder_seconds": "Seconds spent in the vision tower",
            "mm_preprocess_skipped": "Images whose pixel preprocessing was skipped",
            "mm_global_cache_hits": "Embeddings loaded from the shared store",
            "mm_global_cache_misses": "Embeddings the shared store did not hold",
            "mm_global_cache_saved": "Embeddings written to the shared store",
            "mm_global_cache_rejected": "Shared-store entries rejected on arrival",
            "mm_global_cache_errors": "Shared-store operations that failed",
            "mm_global_cache_available": "1 while the shared store answers (0 without one)",
            "hicache_tokens_loaded": "Prefix tokens loaded from the KV page store",
            "hicache_pages_loaded": "KV pages loaded from the store",
            "hicache_pages_saved": "KV pages written to the store",
            "hicache_rejected": "KV pages rejected on arrival (corrupt, truncated, foreign)",
            "hicache_errors": "KV page store operations that failed",
            "hicache_pages_dropped": "KV page writes dropped over the pending-bytes bound",
            "hicache_prefetch_timeouts": "Prefetches admission stopped waiting for",
            "hicache_available": "1 while the KV page store answers (0 without one)",
            "mm_remote_items": "Embeddings received from encoder workers",
            "mm_remote_failures": "Calls to encoder workers that failed or timed out",
        }
        self.gauges = {
            k: Gauge(f"sglang:{k}", doc, ["model_name"], registry=r).labels(**label)
            for k, doc in gauges.items()
        }
        self._prompt_total = 0
        self._cached_total = 0
        self._generated: deque[tuple[float, int]] = deque()  # (time, tokens) in the window

    def observe(self, state: Any, out: Any, now: float) -> None:
        """Called for every scheduler output of a request."""
        if out.new_token_ids:
            if state.first_token_time is None:
                state.first_token_time = now
                self.ttft.observe(now - state.created)
            elif state.last_token_time is not None:
                gap = (now - state.last_token_time) / len(out.new_token_ids)
                self.itl.observe(gap)
            state.last_token_time = now
            self.generation_tokens.inc(len(out.new_token_ids))
            self._generated.append((now, len(out.new_token_ids)))
        if out.finish_reason is not None:
            self.e2e.observe(now - state.created)
            self.requests.inc()
            self.prompt_tokens.inc(out.prompt_tokens)
            self.cached_tokens.inc(out.cached_tokens)
            self._prompt_total += out.prompt_tokens
            self._cached_total += out.cached_tokens

    def gen_throughput(self, now: float) -> float:
        """Tokens generated in the last ``GEN_WINDOW_S`` seconds, per second of that window
        (of the time since the first of them, when that is shorter)."""
        while self._generated and self._generated[0][0] < now - GEN_WINDOW_S:
            self._generated.popleft()
        if not self._generated:
            return 0.0
        span = max(now - self._generated[0][0], 1.0)
        return sum(n for _, n in self._generated) / span

    def render(self, info: dict) -> tuple[bytes, str]:
        mm = info.get("mm_embedding_cache", {})
        store = info.get("mm_global_cache") or {}
        remote = info.get("encoder_workers") or {}
        hicache = info.get("hicache") or {}
        values = {
            "num_running_reqs": info.get("num_running_reqs", 0),
            "num_queue_reqs": info.get("num_queue_reqs", 0),
            "num_grammar_queue_reqs": info.get("num_grammar_queue_reqs", 0),
            "num_used_tokens": info.get("num_used_tokens", 0),
            "token_usage": info.get("token_usage", 0.0),
            "gen_throughput": self.gen_throughput(time.perf_counter()),
            "cache_hit_rate": self._cached_total / max(self._prompt_total, 1),
            "mm_cache_hits": mm.get("hits", 0),
            "mm_cache_misses": mm.get("misses", 0),
            "mm_cache_evictions": mm.get("evictions", 0),
            "mm_cache_entries": mm.get("entries", 0),
            "mm_cache_bytes_used": mm.get("bytes_used", 0),
            "mm_encoded_items": mm.get("encoded_items", 0),
            "mm_encoded_tokens": mm.get("encoded_tokens", 0),
            "mm_encoder_seconds": mm.get("encoder_seconds", 0.0),
            "mm_preprocess_skipped": mm.get("preprocess_skipped", 0),
            **{f"mm_global_cache_{k}": store.get(k, 0) for k in STORE_COUNTERS},
            "mm_global_cache_available": int(bool(store.get("available", False))),
            **{f"hicache_{k}": hicache.get(k, 0) for k in HICACHE_COUNTERS},
            "hicache_available": int(bool(hicache.get("available", False))),
            "mm_remote_items": remote.get("remote_items", 0),
            "mm_remote_failures": remote.get("remote_failures", 0),
        }
        for name, value in values.items():
            self.gauges[name].set(value)
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
