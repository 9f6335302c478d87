"""The server's counters as benchmarks read them: encoder, GC and perf deltas, achieved rates, and
a round's time split by part."""

from __future__ import annotations

from typing import Any

ENCODER_KEYS = ("encoder_seconds", "encoded_items", "encoded_tokens", "encoder_calls", "hits")


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
