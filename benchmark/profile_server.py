"""Where does our server spend a multiturn_image conversation? py-spy, summarised.

Launches our server, attaches ``py-spy record`` (all its processes, idle frames dropped), plays
the multiturn_image conversation once, and reports the share of samples spent inside each part
of the request path (inclusive), plus the hottest functions.

    python -m benchmark.profile_server --resolution 1280x720 --mode per-image
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
from tqdm import tqdm

from benchmark.lib.images import parse_resolution
from benchmark.lib.report import markdown_table, write_json
from benchmark.multiturn_image import default_model, run_conversation
from benchmark.servers import launch

# part of the request path -> (function name, file) pairs whose frames mark it (inclusive)
PARTS: dict[str, tuple[tuple[str, str], ...]] = {
    "model forward (runner, all)": (("forward", "model_executor/model_runner.py"),),
    "image embedding (embedder.embed)": (("embed", "multimodal/embedder.py"),),
    "vision encoder (ViT forward)": (("get_image_features", ""),),
    "image preprocessing (HF processor)": (("__call__", "multimodal/processor.py"),),
    "attention backend (engine KV)": (("forward", "layers/attention/"),),
    "scheduler step": (("step", "managers/scheduler.py"),),
    "tokenizer manager (HTTP side)": (("", "managers/tokenizer_manager.py"),),
    "image loading / hashing": (("", "multimodal/image_io.py"),),
}


def summarize(raw: Path, top: int = 15) -> dict[str, Any]:
    total = 0
    parts: Counter[str] = Counter()
    funcs: Counter[str] = Counter()
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = stack.split(";")
        names = [(f.split(" (")[0].rsplit(".", 1)[-1], f) for f in frames]
        for part, keys in PARTS.items():
            if any(name.startswith(fn) and path in f for name, f in names for fn, path in keys):
                parts[part] += n
        if frames:
            funcs[frames[-1]] += n
    share = {p: parts[p] / total for p in PARTS} if total else {}
    hot = [(f, n / total) for f, n in funcs.most_common(top)] if total else []
    return {"samples": total, "inclusive_share": share, "self_share_top": hot}


def write_report(result: dict[str, Any], raw: Path, out: Path) -> None:
    """Summarise the collapsed stacks in ``raw`` into ``out``.json / .md (and print it)."""
    summary = summarize(raw)
    result.update(summary)
    write_json(out.with_suffix(".json"), result)
    md = markdown_table(
        ["part of the request path (inclusive)", "share of busy samples"],
        [[k, f"{v:.1%}"] for k, v in summary["inclusive_share"].items()],
    )
    md += "\n\nhottest functions (self):\n\n" + markdown_table(
        ["function", "share"], [[f"`{f[:90]}`", f"{s:.1%}"] for f, s in summary["self_share_top"]]
    )
    out.with_suffix(".md").write_text(md + "\n")
    print(md)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--resolution", default="1280x720")
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--mode", default="per-image")
    p.add_argument("--model-path")
    p.add_argument("--model-size", choices=("tiny", "small"), default="small")
    p.add_argument("--dtype", default="auto", help="the server's --dtype (default: its own)")
    p.add_argument("--server-args", default="", help="extra flags for our server")
    p.add_argument("--rate", type=int, default=100, help="py-spy samples per second")
    p.add_argument("--out", default="results/profile_server")
    args = p.parse_args(argv)
    pyspy = shutil.which("py-spy") or str(Path(__import__("sys").executable).parent / "py-spy")
    model_path = args.model_path or default_model(args.model_size)
    out = Path(args.out)
    raw = out.with_suffix(".collapsed.txt")
    raw.parent.mkdir(parents=True, exist_ok=True)
    with (
        launch("ours", model_path, args.mode, args.server_args.split(), dtype=args.dtype) as server,
        httpx.Client(timeout=3600) as client,
    ):
        assert server.proc is not None
        spy = subprocess.Popen(
            [pyspy, "record", "--pid", str(server.proc.pid), "--subprocesses", "--format", "raw",
             "--rate", str(args.rate), "--output", str(raw), "--nonblocking"],
            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
        )  # fmt: skip
        time.sleep(2)
        with tqdm(total=args.rounds, desc="profile") as bar:
            rows = run_conversation(
                client, server.base_url, server.model, parse_resolution(args.resolution),
                args.rounds, 16, bar,
            )  # fmt: skip
        spy.send_signal(2)  # SIGINT: py-spy writes its output and exits
        spy.wait(timeout=60)
    result = {"benchmark": "profile_server", "config": vars(args), "rounds": rows}
    write_report(result, raw, out)
    return result


if __name__ == "__main__":
    main()
