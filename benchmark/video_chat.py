"""Video chat on the offline Engine: (a) a multi-turn chat about one clip, (b) long clips under
chunked prefill, per-frame-group caching beside whole-video encoding.

(a) One clip, several questions, each turn re-sending the clip with the conversation so far
(as a chat client does). Per round: time to first token (the request asks for one token, so its
wall time is prefill plus one step, decoding of the clip included) and the encoder's work.
After round 1 the prefix cache covers the clip and nothing is encoded.

(b) Clips of growing length sampled at 2 fps, chunked prefill. For each clip and each video
cache mode (``per-group``: one cache entry per frame group, encoded when a chunk reaches it;
``whole``: one entry per video, encoded by the first chunk that touches it): time to first
token, the most tokens in one encoder call and the encoder's peak memory (the process's peak
resident memory over each encoder call above its resident memory before the call, Linux's
VmHWM reset through ``/proc/self/clear_refs``; malloc's mmap threshold is pinned so that freed
tensors leave the resident set).

(c) With ``--served ours,vllm``: chat (a) over HTTP (OpenAI chat, the clip re-sent as a
``video_url`` data URL with every turn, as a client does), against our server and vLLM CPU
(``bash benchmark/peers/setup_peers.sh vllm``); TTFT per round as the streaming client sees it.
Each engine samples the clip its own way (prompt tokens are reported).

    python -m benchmark.video_chat --quick
    python -m benchmark.video_chat --rounds 8 --lengths 30,60,120,240
    python -m benchmark.video_chat --served ours,vllm --skip-offline
"""

from __future__ import annotations

import argparse
import base64
import ctypes
import time
from pathlib import Path
from typing import Any

import httpx
from tqdm import tqdm

from benchmark.lib.client import chat
from benchmark.lib.hardware import cpu_info, cpu_line
from benchmark.lib.report import markdown_table, pyplot, write_json
from benchmark.servers import launch
from sglang_dev.tiny_models import tiny_model_path
from sglang_dev.video_clips import encode_clip, random_frames

VIDEO = "<|vision_start|><|video_pad|><|vision_end|>"
QUESTIONS = [
    "What happens in the clip?",
    "What colour dominates?",
    "Is anything moving?",
    "How many scenes are there?",
    "What happens at the end?",
    "Describe the background.",
    "Is there any text?",
    "Summarise it in one sentence.",
]
PRESETS: dict[str, dict[str, Any]] = {
    "quick": {"rounds": 4, "chat_seconds": 20, "lengths": [30, 120], "chunk": 256},
    "full": {"rounds": 8, "chat_seconds": 60, "lengths": [30, 60, 120, 240], "chunk": 512},
}
NATIVE_FPS = 4.0  # clips are encoded at 4 fps and sampled at the model's 2 fps
CLIP_SIZE = (112, 112)  # height, width: 8x8 patches, 16 tokens per frame group


def make_clip(seconds: float, seed: int = 0) -> bytes:
    frames = random_frames(seed, int(seconds * NATIVE_FPS), *CLIP_SIZE)
    return encode_clip(frames, fps=NATIVE_FPS, gop=int(NATIVE_FPS * 2))


def _turn(history: str, question: str, first: bool) -> str:
    user = (VIDEO if first else "") + question
    return history + f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"


class EncoderRecorder:
    """Wraps the embedder's encoder calls: tokens, seconds and peak memory of each."""

    def __init__(self, engine: Any) -> None:
        self.calls: list[dict[str, float]] = []
        embedder = engine.runner.embedder
        encode_batch = embedder._encode_batch

        def record(items: list) -> Any:
            before = _reset_peak()
            start = time.perf_counter()
            out = encode_batch(items)
            seconds = time.perf_counter() - start
            peak = _status_kib("VmHWM")
            tokens = sum(item.num_tokens for item in items)
            self.calls.append({"tokens": tokens, "ms": seconds * 1e3, "peak_kib": peak - before})
            return out

        embedder._encode_batch = record

    def take(self) -> list[dict[str, float]]:
        calls, self.calls = self.calls, []
        return calls


def _pin_mmap_threshold(size: int = 128 * 1024) -> None:
    """Allocations above ``size`` are mmapped and unmapped on free (glibc otherwise raises its
    threshold as tensors come and go, and freed memory stays resident, hiding peaks)."""
    try:
        ctypes.CDLL("libc.so.6").mallopt(-3, size)  # M_MMAP_THRESHOLD
    except (OSError, AttributeError):
        pass


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def _reset_peak() -> int:
    """Reset the peak resident memory to the current one; return the current one (KiB)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass
    return _status_kib("VmRSS")


def _summary(calls: list[dict[str, float]]) -> dict[str, float]:
    return {
        "encoder_calls": len(calls),
        "encoded_tokens": sum(c["tokens"] for c in calls),
        "encoder_ms": sum(c["ms"] for c in calls),
        "max_call_tokens": max((c["tokens"] for c in calls), default=0),
        "encoder_peak_mib": max((c["peak_kib"] for c in calls), default=0) / 1024,
    }


def run_chat(model_path: str, rounds: int, seconds: float, chunk: int, bar: tqdm) -> list[dict]:
    import sglang

    engine = sglang.Engine(model_path=model_path, chunked_prefill_size=chunk)
    recorder = EncoderRecorder(engine)
    clip = make_clip(seconds)
    history, out_rounds = "", []
    for r in range(rounds):
        prompt = _turn(history, QUESTIONS[r % len(QUESTIONS)], r == 0)
        start = time.perf_counter()
        first = engine.generate(prompt, {"temperature": 0, "max_new_tokens": 1}, video_data=clip)
        ttft = time.perf_counter() - start
        calls = recorder.take()
        answer = engine.generate(prompt, {"temperature": 0, "max_new_tokens": 8}, video_data=clip)
        recorder.take()
        history = prompt + answer["text"] + "<|im_end|>\n"
        meta = first["meta_info"]
        out_rounds.append(
            {"round": r + 1, "ttft_ms": ttft * 1e3, "prompt_tokens": meta["prompt_tokens"],
             "cached_tokens": meta["cached_tokens"], **_summary(calls)}
        )  # fmt: skip
        bar.update(1)
    engine.shutdown()
    return out_rounds


def run_long(model_path: str, lengths: list[float], chunk: int, bar: tqdm) -> list[dict]:
    import sglang

    clips = {seconds: make_clip(seconds, seed=1) for seconds in lengths}
    rows = []
    for mode in ("per-group", "whole"):
        engine = sglang.Engine(
            model_path=model_path,
            chunked_prefill_size=chunk,
            mm_video_cache=mode,
            disable_radix_cache=True,
            mm_embedding_cache_mb=1024,
        )
        recorder = EncoderRecorder(engine)
        prompt = _turn("", "Describe the clip.", True)
        engine.generate(prompt, {"temperature": 0, "max_new_tokens": 1}, video_data=make_clip(2))
        for seconds, clip in clips.items():
            engine.scheduler.flush_cache()
            recorder.take()
            start = time.perf_counter()
            out = engine.generate(prompt, {"temperature": 0, "max_new_tokens": 1}, video_data=clip)
            ttft = time.perf_counter() - start
            rows.append(
                {"mode": mode, "clip_s": seconds, "ttft_ms": ttft * 1e3,
                 "prompt_tokens": out["meta_info"]["prompt_tokens"], **_summary(recorder.take())}
            )  # fmt: skip
            bar.update(1)
        engine.shutdown()
    return rows


def run_served(
    engines: list[str], model_path: str, rounds: int, seconds: float, bar: tqdm
) -> list[dict]:
    """Chat (a) over HTTP against each engine: TTFT per round as the client sees it."""
    url = "data:video/mp4;base64," + base64.b64encode(make_clip(seconds)).decode()
    rows = []
    for engine in engines:
        with launch(engine, model_path, videos=1) as server, httpx.Client(timeout=3600) as client:
            messages: list[dict[str, Any]] = []
            for r in range(rounds):
                question = {"type": "text", "text": QUESTIONS[r % len(QUESTIONS)]}
                if r == 0:
                    video = {"type": "video_url", "video_url": {"url": url}}
                    messages.append({"role": "user", "content": [video, question]})
                else:
                    messages.append({"role": "user", "content": [question]})
                res = chat(client, server.base_url, server.model, messages, 8)
                if not res.ok:
                    raise RuntimeError(f"{engine} round {r + 1}: {res.error}")
                messages.append({"role": "assistant", "content": res.text})
                rows.append(
                    {"engine": engine, "round": r + 1, "ttft_ms": res.ttft * 1e3,
                     "prompt_tokens": res.prompt_tokens, "cached_tokens": res.cached_tokens}
                )  # fmt: skip
                bar.update(1)
    return rows


def markdown(result: dict[str, Any]) -> str:
    chat = result["chat"]
    head = ["round", "TTFT ms", "prompt tokens", "cached", "encoder calls", "encoded tokens",
            "encoder ms"]  # fmt: skip
    rows = [[r["round"], r["ttft_ms"], r["prompt_tokens"], r["cached_tokens"], r["encoder_calls"],
             r["encoded_tokens"], r["encoder_ms"]] for r in chat]  # fmt: skip
    long_head = ["mode", "clip s", "prompt tokens", "TTFT ms", "encoder calls",
                 "max tokens per call", "encoder peak MiB"]  # fmt: skip
    long_rows = [[r["mode"], r["clip_s"], r["prompt_tokens"], r["ttft_ms"], r["encoder_calls"],
                  r["max_call_tokens"], r["encoder_peak_mib"]] for r in result["long"]]  # fmt: skip
    text = f"{result['cpu_line']}\n\n"
    if chat:
        text += "## (a) multi-turn chat about one clip\n\n" + markdown_table(head, rows) + "\n\n"
    if result["long"]:
        text += "## (b) long clips, chunked prefill\n\n" + markdown_table(long_head, long_rows)
        text += "\n\n"
    served = result.get("served") or []
    if served:
        engines = list(dict.fromkeys(r["engine"] for r in served))
        by_round: dict[int, dict[str, dict]] = {}
        for r in served:
            by_round.setdefault(r["round"], {})[r["engine"]] = r
        served_head = ["round", *(f"{e} TTFT ms" for e in engines),
                       *(f"{e} prompt tokens" for e in engines)]  # fmt: skip
        served_rows = [
            [n, *(by_round[n].get(e, {}).get("ttft_ms") for e in engines),
             *(by_round[n].get(e, {}).get("prompt_tokens") for e in engines)]
            for n in sorted(by_round)
        ]  # fmt: skip
        text += "## (c) the chat over HTTP, side by side\n\n"
        text += markdown_table(served_head, served_rows) + "\n"
        for error in result.get("served_errors", []):
            text += f"\n{error}\n"
    return text


def plot(result: dict[str, Any], path: Path) -> None:
    plt = pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.2))
    chat = result["chat"] or result["served"]
    rounds = [r["round"] for r in chat]
    ax1.plot(rounds, [r["ttft_ms"] for r in chat], marker="o", label="TTFT ms")
    if result["chat"]:
        ax1.bar(rounds, [r["encoder_ms"] for r in chat], alpha=0.5, label="encoder ms")
    ax1.set_xlabel("round")
    ax1.set_title("(a) multi-turn video chat", fontsize=9)
    ax1.legend(fontsize=7)
    for mode in ("per-group", "whole"):
        rows = [r for r in result["long"] if r["mode"] == mode]
        ax2.plot([r["clip_s"] for r in rows], [r["encoder_peak_mib"] for r in rows], marker="o",
                 label=f"{mode}: encoder peak MiB")  # fmt: skip
    ax2.set_xlabel("clip length (s, sampled at 2 fps)")
    ax2.set_title("(b) encoder peak memory", fontsize=9)
    ax2.legend(fontsize=7)
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=70)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", choices=PRESETS, default="full")
    p.add_argument("--quick", action="store_true", help="same as --preset quick")
    p.add_argument("--rounds", type=int)
    p.add_argument("--chat-seconds", type=float, help="length of the chat clip")
    p.add_argument("--lengths", help="comma-separated long-clip lengths in seconds")
    p.add_argument("--chunk", type=int, help="chunked prefill size")
    p.add_argument("--model-path", help="default: the embedded small Qwen2.5-VL")
    p.add_argument("--out", help="default: results/video_chat_<preset>")
    p.add_argument(
        "--served", default="", help="(c): engines to chat with over HTTP, e.g. ours,vllm"
    )
    p.add_argument("--skip-offline", action="store_true", help="run (c) only")
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads (1: on a shared 2-core machine each parallel op otherwise "
        "waits for a descheduled thread, which penalises many small encoder calls)",
    )
    args = p.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    name = "quick" if args.quick else args.preset
    preset = PRESETS[name]
    rounds = args.rounds or preset["rounds"]
    lengths = [float(x) for x in args.lengths.split(",")] if args.lengths else preset["lengths"]
    chunk = args.chunk or preset["chunk"]
    model_path = args.model_path or str(tiny_model_path("qwen2_5_vl", size="small"))
    _pin_mmap_threshold()
    cpu = cpu_info()
    print(cpu_line(cpu))
    served_engines = [e for e in args.served.split(",") if e]
    offline = 0 if args.skip_offline else rounds + 2 * len(lengths)
    seconds = args.chat_seconds or preset["chat_seconds"]
    served, served_errors = [], []
    with tqdm(total=offline + rounds * len(served_engines), desc="video_chat") as bar:
        chat = [] if args.skip_offline else run_chat(model_path, rounds, seconds, chunk, bar)
        long = [] if args.skip_offline else run_long(model_path, lengths, chunk, bar)
        for engine in served_engines:
            try:
                served += run_served([engine], model_path, rounds, seconds, bar)
            except (RuntimeError, TimeoutError, OSError, httpx.HTTPError) as exc:
                if engine == "ours":
                    raise
                served_errors.append(f"{engine} failed: {type(exc).__name__}: {exc}"[-1500:])
    result = {
        "benchmark": "video_chat",
        "cpu": cpu,
        "cpu_line": cpu_line(cpu),
        "config": {"threads": args.threads, "rounds": rounds, "lengths_s": lengths,
                   "chunk": chunk, "fps": 2.0, "native_fps": NATIVE_FPS,
                   "clip_size": list(CLIP_SIZE), "model_path": model_path},
        "chat": chat,
        "long": long,
        "served": served,
        "served_errors": served_errors,
    }  # fmt: skip
    out = Path(args.out or f"results/video_chat_{name}")
    write_json(out.with_suffix(".json"), result)
    md = markdown(result)
    out.with_suffix(".md").write_text(md)
    plot(result, out.with_suffix(".png"))
    print(md)
    return result


if __name__ == "__main__":
    main()
