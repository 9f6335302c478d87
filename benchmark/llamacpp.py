"""Ours against llama.cpp's ``llama-server`` on the same checkpoint, width by width.

Widths: our bfloat16 checkpoint as ``--dtype`` (default ``auto``) serves it / ``--torchao-config
int8wo`` / ``int4wo-128`` / ``int8dq`` (with ``--vision-int8dq``) / ``8da4w-128`` (int4 head,
``--vision-int8dq``) against the GGUF language model in BF16 / Q8_0 / Q4_0 (``--pure``) / Q8_0 /
Q4_0; llama.cpp's vision tower is a BF16 mmproj at every width, ours is the checkpoint's except
with int4wo (int8 linears) and the dynamic modes with ``--vision-int8dq`` (int8dq linears). One
server runs at a time, in turn across repeats (ours bf16, llama BF16, ours int8, llama Q8_0, ...),
each launched fresh, all through the same HTTP client. Per launch:

- resident memory (RSS) of the server's process tree once ready and after the requests;
- decode tokens/s at batch 1: a fixed text-only chat, temperature 0, ``ignore_eos``,
  ``--max-tokens`` tokens; (tokens - 1) over the stream's time after the first token, median over
  ``--decode-requests`` requests after one warm-up;
- the multiturn image chat (``benchmark.multiturn_image``) at each of ``--resolutions``
  (default 640x480 and 1280x720, to multiples of 28): TTFT per round, one new image per round,
  the same images on both servers (best of the repeats per round); our rounds split by part
  (tower attention, tower rest, LM attention, LM rest), each against the matmul peak of its
  arithmetic, probed once at the start (``benchmark.llamacpp_report``).

Needs ``bash benchmark/peers/setup_peers.sh llamacpp``; the GGUF files are converted on first use
(``benchmark/peers/llamacpp_convert.py``) next to the checkpoint.

    python -m benchmark.llamacpp --shape 7b --layers 2 --vision-depth 2 --rounds 2 --repeats 1
    python -m benchmark.llamacpp --shape 7b --repeats 2          # the full 7B shape
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
from tqdm import tqdm

from benchmark.lib.client import chat
from benchmark.lib.hardware import cpu_info, cpu_line, matmul_peak_gflops, rss_snapshot
from benchmark.lib.images import parse_resolution
from benchmark.lib.report import run_and_write
from benchmark.lib.shaped_checkpoints import SHAPES, cached_checkpoint, shape_config
from benchmark.llamacpp_report import aggregate, markdown, plot, ratios
from benchmark.multiturn_image import compute_dtype, part_dtypes, run_conversation
from benchmark.peers.llamacpp_convert import TYPES, default_root, outputs
from benchmark.servers import Server, _stop, _wait_healthy, free_port, launch

# width -> (our server's flags, GGUF type of the language model)
WIDTHS: dict[str, tuple[list[str], str]] = {
    "bf16": ([], "bf16"),
    "int8": (["--torchao-config", "int8wo"], "q8_0"),
    "int4": (["--torchao-config", "int4wo-128"], "q4_0"),
    # the same bytes per token as llama.cpp's --pure Q4_0 (its head is Q4_0 too)
    "int4-head4": (["--torchao-config", "int4wo-128", "--cpu-lm-head-dtype", "int4"], "q4_0"),
    # int8 compute (activations too), language model and tower, against Q8_0's weights
    "int8dq": (["--torchao-config", "int8dq", "--vision-int8dq"], "q8_0"),
    # int4 weights times int8 activations, the head int4 too, the tower int8dq: against --pure
    # Q4_0, whose products take Q8_0 activations the same way
    "8da4w": (
        ["--torchao-config", "8da4w-128", "--cpu-lm-head-dtype", "int4", "--vision-int8dq"],
        "q4_0",
    ),
}
OUR_LABELS = {
    "bf16": "ours:bf16",
    "int8": "ours:int8wo",
    "int4": "ours:int4wo-128",
    "int4-head4": "ours:int4wo-128+int4 head",
    "int8dq": "ours:int8dq+vision",
    "8da4w": "ours:8da4w-128+int4 head+vision",
}
DEFAULT_WIDTHS = ("bf16", "int8", "int4")
# 640x480 and 1280x720 to the nearest multiples of 28 (Qwen2-VL's 14-pixel patches, merged 2x2),
# so that both servers see the image at its own size
DEFAULT_RESOLUTIONS = ("644x476", "1288x728")
DECODE_PROMPT = "Write a long story about a lighthouse keeper and the sea, chapter by chapter."
# A fresh connection per request: llama-server at times closes a kept-alive connection after
# a streamed response, and the next request sent on it fails.
CLOSE = {"Connection": "close"}


# Servers ---------------------------------------------------------------------------------------
def llama_label(width: str) -> str:
    return f"llama:{TYPES[WIDTHS[width][1]]}"


def llama_command(
    root: Path, lm: Path, mmproj: Path, port: int, ctx: int, threads: int
) -> list[str]:
    return [
        str(root / "bin" / "llama-server"),
        *("-m", str(lm), "--mmproj", str(mmproj), "--host", "127.0.0.1", "--port", str(port)),
        *("-t", str(threads), "-tb", str(threads), "-np", "1", "-c", str(ctx)),
    ]


@contextlib.contextmanager
def launch_llama(cmd: list[str], label: str, timeout: float, log_dir: Path) -> Iterator[Server]:
    """``llama-server`` on the port in ``cmd``; yields once ``/health`` answers 200 (503 while
    the model loads)."""
    port = cmd[cmd.index("--port") + 1]
    log_path = log_dir / f"{label.replace(':', '-')}-{port}.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    server = Server(f"http://127.0.0.1:{port}", "default", "llamacpp", label, proc, log_path)
    try:
        started = time.perf_counter()
        _wait_healthy(server, timeout)
        server.startup_s = time.perf_counter() - started
        yield server
    finally:
        _stop(proc)


def server_for(
    engine: str, width: str, args: argparse.Namespace, files: dict[str, Path], log_dir: Path
) -> contextlib.AbstractContextManager[Server]:
    if engine == "ours":
        flags = WIDTHS[width][0]
        return launch("ours", str(args.model_path), "per-image", flags, timeout=args.timeout,
                      log_dir=log_dir, dtype=args.dtype)  # fmt: skip
    lm = files[f"lm-{WIDTHS[width][1]}"]
    cmd = llama_command(args.llama_root, lm, files["mmproj"], free_port(), args.llama_ctx,
                        args.threads)  # fmt: skip
    return launch_llama(cmd, llama_label(width), args.timeout, log_dir)


# Measurements ----------------------------------------------------------------------------------
def decode_request(client: httpx.Client, server: Server, max_tokens: int) -> dict[str, Any]:
    """One text-only chat; decode tokens/s from the streamed chunks after the first token."""
    messages = [{"role": "user", "content": DECODE_PROMPT}]
    res = chat(client, server.base_url, server.model, messages, max_tokens,
               extra={"ignore_eos": True})  # fmt: skip
    if not res.ok:
        raise RuntimeError(f"decode request failed: {res.error}\n{server.log_tail(5)}")
    tokens = res.completion_tokens or len(res.itl) + 1
    span = sum(res.itl)
    return {
        "ttft_ms": res.ttft * 1e3,
        "prompt_tokens": res.prompt_tokens,
        "completion_tokens": tokens,
        "chunks": len(res.itl) + 1,
        "decode_tok_per_s": (tokens - 1) / span if tokens > 1 and span > 0 else None,
    }


def measure(
    server: Server, args: argparse.Namespace, repeat: int, bar: tqdm, peaks: dict[str, float]
) -> dict[str, Any]:
    """RSS once ready, the decode requests, the image conversation at each resolution (ours:
    each round split by part, against ``peaks``), RSS again."""
    assert server.proc is not None
    pid = server.proc.pid
    ready = rss_snapshot(pid)
    chats = {}
    with httpx.Client(timeout=3600, headers=CLOSE) as client:
        decode_request(client, server, args.max_tokens)  # warm-up
        decode = []
        for _ in range(args.decode_requests):
            decode.append(decode_request(client, server, args.max_tokens))
            bar.update(1)
        for k, resolution in enumerate(args.resolutions):
            chats["x".join(map(str, resolution))] = run_conversation(
                client, server.base_url, server.model, resolution, args.rounds,
                args.chat_tokens, progress=bar, image_offset=1000 * repeat + 100 * k,
                server_pid=pid, part_peaks=peaks,
            )  # fmt: skip
    return {"startup_s": server.startup_s, "rss_ready": ready, "rss_after": rss_snapshot(pid),
            "decode": decode, "chats": chats}  # fmt: skip


def probe_part_peaks(args: argparse.Namespace) -> tuple[dict[str, float], dict[str, dict]]:
    """The matmul peak of every arithmetic our widths run a part in, and per our label each
    part's peak (``multiturn_image.part_dtypes``: int8 where activations are int8)."""
    dtypes = {OUR_LABELS[w]: part_dtypes(argparse.Namespace(
        dtype=args.dtype, server_args=" ".join(WIDTHS[w][0]))) for w in args.widths}  # fmt: skip
    needed = sorted({d for parts in dtypes.values() for d in parts.values()})
    peaks = {d: matmul_peak_gflops(dtype=d)["gflop_per_s"] for d in needed}
    return peaks, {label: {part: peaks[d] for part, d in parts.items()}
                   for label, parts in dtypes.items()}  # fmt: skip


def play(
    args: argparse.Namespace, files: dict[str, Path], log_dir: Path
) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    """Every repeat: each width on ours then on llama-server, one server at a time."""
    runs: list[dict[str, Any]] = []
    failures: list[dict[str, str]] = []
    chat_rounds = args.rounds * len(args.resolutions)
    total = args.repeats * len(args.widths) * 2 * (args.decode_requests + chat_rounds)
    bar = tqdm(total=total, desc="llamacpp")
    for k in range(args.repeats):
        for width in args.widths:
            for engine in ("ours", "llamacpp"):
                label = OUR_LABELS[width] if engine == "ours" else llama_label(width)
                bar.set_description(f"r{k} {label}")
                try:
                    with server_for(engine, width, args, files, log_dir) as server:
                        run = measure(server, args, k, bar, args.part_peaks.get(label, {}))
                except (RuntimeError, TimeoutError, OSError, httpx.HTTPError) as exc:
                    failures.append({"label": label, "repeat": str(k), "error": str(exc)[-2000:]})
                    print(f"{label} failed: {failures[-1]['error']}")
                    continue
                runs.append({"engine": engine, "width": width, "label": label, "repeat": k, **run})
    bar.close()
    return runs, failures


# Driver ----------------------------------------------------------------------------------------
def ensure_gguf(args: argparse.Namespace) -> dict[str, Path]:
    """The GGUF files of the widths, converted (in a subprocess) where missing."""
    types = [WIDTHS[w][1] for w in args.widths]
    files = outputs(args.gguf_dir, types)
    if not all(path.is_file() for path in files.values()):
        script = Path(__file__).parent / "peers" / "llamacpp_convert.py"
        subprocess.run([sys.executable, str(script), str(args.model_path), str(args.gguf_dir),
                        "--types", ",".join(types), "--llama-root", str(args.llama_root)],
                       check=True)  # fmt: skip
    return files


def llama_version(root: Path) -> str:
    out = subprocess.run([str(root / "bin" / "llama-server"), "--version"], capture_output=True,
                         text=True, check=False)  # fmt: skip
    lines = (out.stdout + out.stderr).splitlines()
    return "llama-server " + "; ".join(
        line for line in lines if line.startswith(("version", "built"))
    )


def checkpoint_depths(model_path: Path, dims: dict[str, Any]) -> dict[str, Any]:
    """``dims`` with the language-model layers and vision blocks of the checkpoint's config."""
    config = json.loads((Path(model_path) / "config.json").read_text())
    text = config.get("text_config") or config
    layers = text.get("num_hidden_layers", dims["text"]["num_hidden_layers"])
    depth = (config.get("vision_config") or {}).get("depth", dims["vision"]["depth"])
    return {**dims, "text": {**dims["text"], "num_hidden_layers": layers},
            "vision": {**dims["vision"], "depth": depth}}  # fmt: skip


def run(args: argparse.Namespace) -> dict[str, Any]:
    server = args.llama_root / "bin" / "llama-server"
    if not server.exists():
        raise SystemExit(f"{server} missing: run bash benchmark/peers/setup_peers.sh llamacpp")
    cpu = cpu_info()
    print(cpu_line(cpu))
    dims = shape_config(args.shape, args.layers, args.vision_depth)
    if args.model_path:  # the depths the checkpoint has, whatever --shape's defaults say
        dims = checkpoint_depths(args.model_path, dims)
    args.model_path = args.model_path or cached_checkpoint(dims, args.shape)
    args.gguf_dir = args.gguf_dir or Path(f"{args.model_path}-gguf")
    files = ensure_gguf(args)
    version = llama_version(args.llama_root)
    print(version)
    peaks, args.part_peaks = probe_part_peaks(args)
    runs, failures = play(args, files, Path(tempfile.mkdtemp(prefix="bench-llamacpp-logs-")))
    per_label = aggregate(runs)
    labels = {w: (OUR_LABELS[w], llama_label(w)) for w in args.widths}
    config = {
        "shape": args.shape, "layers": dims["text"]["num_hidden_layers"],
        "vision_depth": dims["vision"]["depth"], "model_path": str(args.model_path),
        "gguf": {k: str(v) for k, v in files.items()}, "widths": args.widths,
        "rounds": args.rounds, "repeats": args.repeats, "max_tokens": args.max_tokens,
        "decode_requests": args.decode_requests, "chat_tokens": args.chat_tokens,
        "resolutions": ["x".join(map(str, r)) for r in args.resolutions],
        "llama_ctx": args.llama_ctx, "threads": args.threads, "llama_server_version": version,
        "dtype": args.dtype, "compute_dtype": compute_dtype(args.dtype),
        "peaks_gflop_per_s": peaks, "labels": labels,
    }  # fmt: skip
    return {"benchmark": "llamacpp", "cpu": cpu, "config": config, "runs": runs,
            "failures": failures, "per_label": per_label,
            "ratios": ratios(per_label, labels)}  # fmt: skip


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", choices=SHAPES, default="7b")
    p.add_argument("--layers", type=int, help="language-model layers (default: the shape's)")
    p.add_argument("--vision-depth", type=int, help="vision blocks (default: the shape's)")
    p.add_argument("--model-path", type=Path, help="use this checkpoint instead of building one")
    p.add_argument("--gguf-dir", type=Path, help="GGUF files (default: CHECKPOINT-gguf)")
    p.add_argument("--widths", default=",".join(DEFAULT_WIDTHS), help=f"of {', '.join(WIDTHS)}")
    p.add_argument("--rounds", type=int, default=8, help="image chat rounds")
    p.add_argument("--resolutions", "--resolution", default=",".join(DEFAULT_RESOLUTIONS),
                   help="WxH[,WxH...], multiples of 28")  # fmt: skip
    p.add_argument("--chat-tokens", type=int, default=16, help="max tokens per chat round")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--dtype", default="auto",
                   help="our server's --dtype (auto, its default: float32 activations over "
                        "bfloat16 weights on CPUs without native bfloat16)")  # fmt: skip
    p.add_argument("--max-tokens", type=int, default=64, help="decode request length")
    p.add_argument("--decode-requests", type=int, default=3, help="after one warm-up")
    p.add_argument("--llama-root", type=Path, default=default_root())
    p.add_argument("--llama-ctx", type=int, default=16384, help="llama-server -c")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="llama-server -t/-tb")
    p.add_argument("--timeout", type=float, default=1800, help="seconds for a server to start")
    p.add_argument("--out", default="results/llamacpp")
    args = p.parse_args(argv)
    args.widths = [w for w in args.widths.split(",") if w]
    if set(args.widths) - set(WIDTHS):
        p.error(f"widths must be of {list(WIDTHS)}")
    args.resolutions = [parse_resolution(r) for r in args.resolutions.split(",") if r]
    if any(side % 28 for r in args.resolutions for side in r):
        p.error(
            "--resolutions: sides must be multiples of 28 (Qwen2-VL's 14-pixel patches, merged 2x2)"
        )
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    return run_and_write(parse_args(argv), run, markdown, plot)


if __name__ == "__main__":
    main()
