"""Image-limit probe: add images one at a time to one request until it fails or a cap is reached.

Per image count: TTFT and the peak memory of that step, per cache mode. Caches are flushed
before every step, so each step is a cold request with that many distinct images. Memory: on
the server's processes, the peak resident set (Linux VmHWM, reset per step through
/proc/PID/clear_refs; sampled RSS where that is not allowed); with --offline, the in-process
engine's torch.cuda.max_memory_allocated on GPU, the process' peak RSS on CPU.

    python -m benchmark.image_limit --quick
    python -m benchmark.image_limit --resolution 1920x1080 --cap 64 --chunk 2048
"""

from __future__ import annotations

import argparse
import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
from tqdm import tqdm

from benchmark.lib.client import CACHE_MODES, chat, flush_cache
from benchmark.lib.images import image_part, make_jpeg, parse_resolution
from benchmark.lib.report import markdown_table, pyplot, write_json
from benchmark.servers import launch

PH = "<|vision_start|><|image_pad|><|vision_end|>"
PRESETS: dict[str, dict[str, Any]] = {
    "quick": {"resolution": "640x360", "cap": 12, "chunk": 512, "size": "small"},
    "full": {"resolution": "1280x720", "cap": 48, "chunk": 2048, "size": "small"},
}


class PeakRss:
    """Peak resident memory of a set of processes over one step (MB)."""

    def __init__(self, pids: Callable[[], list[int]]) -> None:
        self.pids = pids
        self._stop = threading.Event()
        self._sampled = 0

    def _reset(self) -> bool:
        ok = True
        for pid in self.pids():
            try:
                Path(f"/proc/{pid}/clear_refs").write_text("5")
            except OSError:
                ok = False
        return ok

    @staticmethod
    def _hwm(pid: int) -> int:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
        return 0

    def _sample(self) -> None:
        while not self._stop.wait(0.01):
            total = 0
            for pid in self.pids():
                with contextlib.suppress(psutil.Error):
                    total = max(total, psutil.Process(pid).memory_info().rss)
            self._sampled = max(self._sampled, total)

    @contextlib.contextmanager
    def measure(self) -> Iterator[dict[str, float]]:
        result: dict[str, float] = {}
        exact = self._reset()
        thread = None
        if not exact:
            self._sampled, self._stop = 0, threading.Event()
            thread = threading.Thread(target=self._sample, daemon=True)
            thread.start()
        try:
            yield result
        finally:
            if thread is not None:
                self._stop.set()
                thread.join()
                result["peak_mb"] = self._sampled / 2**20
            else:
                result["peak_mb"] = max(self._hwm(pid) for pid in self.pids()) / 2**20
            result["method"] = 1.0 if exact else 0.0


def _tree(pid: int) -> Callable[[], list[int]]:
    def pids() -> list[int]:
        try:
            proc = psutil.Process(pid)
            return [pid] + [c.pid for c in proc.children(recursive=True)]
        except psutil.Error:
            return []

    return pids


def probe_server(
    server: Any, images: list[bytes], cap: int, max_tokens: int, progress: tqdm
) -> list[dict[str, Any]]:
    meter = PeakRss(_tree(server.proc.pid))
    steps = []
    with httpx.Client(timeout=3600) as client:
        for n in range(1, cap + 1):
            flush_cache(client, server.base_url)
            parts = [image_part(img) for img in images[:n]]
            content = [*parts, {"type": "text", "text": "Describe these images."}]
            messages = [{"role": "user", "content": content}]
            with meter.measure() as mem:
                res = chat(client, server.base_url, server.model, messages, max_tokens)
            steps.append(_step(n, res.ok, res.ttft, res.prompt_tokens, mem, res.error))
            progress.update(1)
            if not res.ok:
                break
    return steps


def probe_offline(
    model_path: str,
    mode: str,
    chunk: int,
    images: list[bytes],
    cap: int,
    progress: tqdm,
    context_length: int | None = None,
) -> list[dict[str, Any]]:
    import os

    import torch

    import sglang

    engine = sglang.Engine(
        model_path=model_path,
        mm_cache_mode=mode,
        chunked_prefill_size=chunk,
        context_length=context_length,
    )
    cuda = engine.runner.device.startswith("cuda")
    meter = PeakRss(lambda: [os.getpid()])
    steps = []
    for n in range(1, cap + 1):
        engine.flush_cache()
        prompt = " ".join(f"picture {PH}" for _ in range(n)) + " Describe these images."
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        ok, err, tokens = True, "", 0
        start = time.perf_counter()
        with meter.measure() as mem:
            try:
                out = engine.generate(prompt, {"max_new_tokens": 1}, image_data=images[:n])
                tokens = out["meta_info"]["prompt_tokens"]
            except (ValueError, RuntimeError) as exc:  # incl. torch.OutOfMemoryError
                ok, err = False, f"{type(exc).__name__}: {exc}"[:300]
        ttft = time.perf_counter() - start
        if cuda:
            mem["peak_mb"], mem["method"] = torch.cuda.max_memory_allocated() / 2**20, 2.0
        steps.append(_step(n, ok, ttft, tokens, mem, err))
        progress.update(1)
        if not ok:
            break
    engine.shutdown()
    return steps


def _step(n: int, ok: bool, ttft: float, tokens: int, mem: dict, error: str) -> dict[str, Any]:
    method = {0.0: "sampled_rss", 1.0: "vm_hwm", 2.0: "cuda_max_allocated"}[mem["method"]]
    return {
        "images": n,
        "ok": ok,
        "ttft_ms": ttft * 1e3,
        "prompt_tokens": tokens,
        "peak_mb": mem["peak_mb"],
        "memory_method": method,
        "error": error,
    }


def plot(results: list[dict[str, Any]], path: Path) -> None:
    plt = pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(8.4, 3.2))
    for res in results:
        ok = [s for s in res["steps"] if s["ok"]]
        xs = [s["images"] for s in ok]
        a.plot(xs, [s["ttft_ms"] for s in ok], marker="o", ms=3, label=res["mode"])
        b.plot(xs, [s["peak_mb"] for s in ok], marker="o", ms=3, label=res["mode"])
    a.set_ylabel("TTFT (ms)")
    b.set_ylabel("peak memory of the step (MB)")
    for ax in (a, b):
        ax.set_xlabel("images in the request")
        ax.grid(alpha=0.3)
    a.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=70)
    plt.close(fig)


def markdown(results: list[dict[str, Any]]) -> str:
    modes = [r["mode"] for r in results]
    n = max(len(r["steps"]) for r in results)
    rows = []
    for i in range(n):
        row: list[Any] = [i + 1]
        for r in results:
            s = r["steps"][i] if i < len(r["steps"]) else None
            row += (
                [None, None] if s is None else [s["ttft_ms"], s["peak_mb"] if s["ok"] else "fail"]
            )
        rows.append(row)
    head = ["images"] + [f"{m} {k}" for m in modes for k in ("TTFT ms", "peak MB")]
    limits = ", ".join(f"{r['mode']}: {r['max_ok_images']}" for r in results)
    return markdown_table(head, rows) + f"\n\nlargest successful request (images): {limits}\n"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", choices=PRESETS, default="full")
    p.add_argument("--quick", action="store_true", help="same as --preset quick")
    p.add_argument("--resolution")
    p.add_argument("--cap", type=int, help="stop after this many images")
    p.add_argument("--chunk", type=int, help="chunked prefill size")
    p.add_argument("--max-tokens", type=int, default=1)
    p.add_argument("--model-path")
    p.add_argument("--model-size", choices=("tiny", "small"))
    p.add_argument("--modes", default=",".join(CACHE_MODES))
    p.add_argument("--offline", action="store_true", help="in-process Engine instead of HTTP")
    p.add_argument("--context-length", type=int, help="the server's (default: the model's)")
    p.add_argument("--server-args", default="", help="extra flags for our server")
    p.add_argument("--out", default="results/image_limit")
    args = p.parse_args(argv)
    preset = PRESETS["quick" if args.quick else args.preset]
    w, h = parse_resolution(args.resolution or preset["resolution"])
    cap, chunk = args.cap or preset["cap"], args.chunk or preset["chunk"]
    if args.model_path is None:
        from benchmark.multiturn_image import default_model

        args.model_path = default_model(args.model_size or preset["size"])
    images = [make_jpeg(i, w, h) for i in range(cap)]
    modes = args.modes.split(",")
    results = []
    with tqdm(total=cap * len(modes), desc="image_limit") as bar:
        for mode in modes:
            bar.set_description(f"image_limit {mode}")
            if args.offline:
                steps = probe_offline(
                    args.model_path, mode, chunk, images, cap, bar, args.context_length
                )
            else:
                extra = ["--chunked-prefill-size", str(chunk), *args.server_args.split()]
                if args.context_length:
                    extra += ["--context-length", str(args.context_length)]
                with launch("ours", args.model_path, mode, extra) as server:
                    steps = probe_server(server, images, cap, args.max_tokens, bar)
            ok = [s["images"] for s in steps if s["ok"]]
            results.append({"mode": mode, "max_ok_images": max(ok, default=0), "steps": steps})
            bar.update(cap - len(steps))
    result = {
        "benchmark": "image_limit",
        "config": {"resolution": f"{w}x{h}", "cap": cap, "chunk": chunk,
                   "model_path": args.model_path, "offline": args.offline,
                   "context_length": args.context_length},
        "results": results,
    }  # fmt: skip
    out = Path(args.out)
    write_json(out.with_suffix(".json"), result)
    md = markdown(results)
    out.with_suffix(".md").write_text(md)
    plot(results, out.with_suffix(".png"))
    print(md)
    return result


if __name__ == "__main__":
    main()
