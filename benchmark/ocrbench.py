"""OCRBench runner: ask every question with its image, score with OCRBench's rule.

Reads a local OCRBench folder (``OCRBench.json`` plus its images; entries have ``dataset_name``,
``id``, ``image_path``, ``question``, ``answers``, ``type``). A prediction is correct when one
gold answer is a substring of it: lowercased, stripped and with newlines as spaces, except for
HME100k (handwritten math), which is case-sensitive with every space removed from both sides.
``python -m benchmark.ocrbench_synth`` writes a small synthetic set in the same format.

``--configs`` runs our server once per named configuration (``CONFIGS``: float32, bfloat16,
fp8 KV cache, int8wo, int4wo, int8dq and 8da4w (tower too), a chunk size that cuts through
images, and the model written as AWQ, GPTQ or compressed-tensors W4A16 / W8A8 checkpoints)
and cache mode; every report gives the accuracy with its 95% (Wilson) interval, and the run
writes JSON, a markdown table and a plot. The trained reader (``python/sglang/default_model``,
``benchmark.train_reader``) on the synthetic sets is the run that measures what a mode costs in
accuracy.

    python -m benchmark.ocrbench --data DIR --modes per-image,combined,off
    python -m benchmark.ocrbench --data DIR --model-path python/sglang/default_model \\
        --configs float32,bfloat16,fp8-kv,int8wo,int4wo,chunk-16 --modes per-image
    python -m benchmark.ocrbench --data DIR --base-url http://127.0.0.1:30000 --concurrency 8
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import math
import mimetypes
import tempfile
from pathlib import Path
from typing import Any

import httpx
from tqdm import tqdm

from benchmark.lib.client import CACHE_MODES, THINK_MODES, achat, think_mode_body
from benchmark.lib.hardware import cpu_info, cpu_line
from benchmark.lib.report import markdown_table, pyplot, write_json
from benchmark.servers import Server, connect, launch

CATEGORIES = (
    "Regular Text Recognition",
    "Irregular Text Recognition",
    "Artistic Text Recognition",
    "Handwriting Recognition",
    "Digit String Recognition",
    "Non-Semantic Text Recognition",
    "Scene Text-centric VQA",
    "Doc-oriented VQA",
    "Key Information Extraction",
    "Handwritten Mathematical Expression Recognition",
)
TEXT_RECOGNITION = CATEGORIES[:6]
HME_DATASET = "HME100k"
# Named server configurations: (dtype, our other flags); "default" is launch()'s own.
CONFIGS = {
    "default": ("float32", []),
    "float32": ("float32", []),
    "bfloat16": ("bfloat16", []),
    "fp8-kv": ("bfloat16", ["--kv-cache-dtype", "fp8_e4m3"]),
    "int8wo": ("bfloat16", ["--torchao-config", "int8wo"]),
    "int4wo": ("bfloat16", ["--torchao-config", "int4wo-128"]),
    "int8dq": ("bfloat16", ["--torchao-config", "int8dq", "--vision-int8dq"]),
    "8da4w": ("bfloat16", ["--torchao-config", "8da4w-128", "--vision-int8dq"]),
    "chunk-16": ("float32", ["--chunked-prefill-size", "16"]),
    # the model's language-model linears written in a published format (round to nearest,
    # group 128; sglang_dev.quantized_checkpoints) and served from that checkpoint
    "awq": ("bfloat16", ["--quantization", "awq"]),
    "gptq": ("bfloat16", ["--quantization", "gptq"]),
    "w4a16": ("bfloat16", ["--quantization", "compressed-tensors"]),
    "w8a8": ("bfloat16", ["--quantization", "compressed-tensors"]),
}
PUBLISHED = {"awq": "awq", "gptq": "gptq", "w4a16": "ct-w4a16", "w8a8": "ct-w8a8"}


def published_copy(model_path: str, config: str, root: Path) -> str:
    """``model_path`` written in ``config``'s published format under ``root``."""
    from sglang_dev.quantized_checkpoints import write_quantized

    return str(write_quantized(model_path, root / config, PUBLISHED[config], 128))


def wilson_interval(correct: int, total: int, z: float = 1.96) -> tuple[float, float]:
    """The 95% Wilson score interval of an accuracy of ``correct`` / ``total``."""
    if total == 0:
        return (0.0, 1.0)
    p = correct / total
    centre = (p + z * z / (2 * total)) / (1 + z * z / total)
    half = z * math.sqrt(p * (1 - p) / total + z * z / (4 * total * total)) / (1 + z * z / total)
    return (max(0.0, centre - half), min(1.0, centre + half))


def _normal(text: str) -> str:
    return text.lower().strip().replace("\n", " ")


def _hme(text: str) -> str:
    return text.strip().replace("\n", " ").replace(" ", "")


def is_correct(prediction: str, answers: str | list[str], dataset_name: str) -> bool:
    """OCRBench's rule: any gold answer is a substring of the normalised prediction."""
    norm = _hme if dataset_name == HME_DATASET else _normal
    golds = [answers] if isinstance(answers, str) else list(answers)
    pred = norm(prediction)
    return any(norm(str(gold)) in pred for gold in golds)


def score(entries: list[dict[str, Any]], predictions: list[str]) -> dict[str, Any]:
    """Per-category correct / total, the text-recognition group, and the total (score and
    fraction)."""
    per: dict[str, list[int]] = {}
    for entry, pred in zip(entries, predictions):
        ok = is_correct(pred, entry["answers"], entry["dataset_name"])
        cell = per.setdefault(entry["type"], [0, 0])
        cell[0] += int(ok)
        cell[1] += 1
    order = [c for c in CATEGORIES if c in per] + sorted(set(per) - set(CATEGORIES))
    categories = {c: {"correct": per[c][0], "total": per[c][1]} for c in order}
    text = [per[c] for c in TEXT_RECOGNITION if c in per]
    correct = sum(v[0] for v in per.values())
    total = sum(v[1] for v in per.values())
    return {
        "categories": categories,
        "text_recognition": {"correct": sum(t[0] for t in text), "total": sum(t[1] for t in text)},
        "correct": correct,
        "total": total,
        "accuracy": correct / total if total else 0.0,
        "ci95": list(wilson_interval(correct, total)),
    }


def load_dataset(folder: str | Path, limit: int | None = None) -> list[dict[str, Any]]:
    folder = Path(folder)
    entries = json.loads((folder / "OCRBench.json").read_text())
    for entry in entries:
        rel = str(entry["image_path"]).lstrip("./")
        candidates = [folder / rel, folder / "OCRBench_Images" / rel, Path(entry["image_path"])]
        found = next((c for c in candidates if c.is_file()), None)
        if found is None:
            raise FileNotFoundError(f"image of entry {entry.get('id')} not found: {rel}")
        entry["_image_file"] = str(found)
    return entries[:limit] if limit else entries


def _image_url(path: str) -> str:
    mime = mimetypes.guess_type(path)[0] or "image/jpeg"
    return f"data:{mime};base64," + base64.b64encode(Path(path).read_bytes()).decode()


async def _ask_all(
    server: Server, entries: list[dict[str, Any]], args: argparse.Namespace, bar: tqdm
) -> list[dict[str, Any]]:
    sem = asyncio.Semaphore(args.concurrency)
    extra = think_mode_body(args.think_mode)
    limits = httpx.Limits(max_connections=args.concurrency + 2)

    async with httpx.AsyncClient(timeout=3600, limits=limits) as client:

        async def ask(entry: dict[str, Any]) -> dict[str, Any]:
            content = [
                {"type": "image_url", "image_url": {"url": _image_url(entry["_image_file"])}},
                {"type": "text", "text": entry["question"]},
            ]
            async with sem:
                res = await achat(
                    client, server.base_url, server.model, [{"role": "user", "content": content}],
                    args.max_tokens, stream=args.stream, extra=extra,
                )  # fmt: skip
            bar.update(1)
            return {"id": entry.get("id"), "prediction": res.text, "ok": res.ok,
                    "error": res.error, "latency_ms": res.latency * 1e3}  # fmt: skip

        return list(await asyncio.gather(*(ask(e) for e in entries)))


def evaluate(server: Server, entries: list[dict[str, Any]], args: argparse.Namespace) -> dict:
    with tqdm(total=len(entries), desc=f"ocrbench {server.label}") as bar:
        answers = asyncio.run(_ask_all(server, entries, args, bar))
    result = score(entries, [a["prediction"] for a in answers])
    for entry, ans in zip(entries, answers):
        ans["correct"] = is_correct(ans["prediction"], entry["answers"], entry["dataset_name"])
        ans["type"] = entry["type"]
    return {"label": server.label, **result, "errors": sum(not a["ok"] for a in answers),
            "predictions": answers}  # fmt: skip


def markdown(reports: list[dict[str, Any]]) -> str:
    cats = list(dict.fromkeys(c for r in reports for c in r["categories"]))
    rows = [
        [c] + [f"{r['categories'][c]['correct']}/{r['categories'][c]['total']}" for r in reports]
        for c in cats
    ]
    rows.append(
        ["Text Recognition (6 above)"]
        + [f"{r['text_recognition']['correct']}/{r['text_recognition']['total']}" for r in reports]
    )
    rows.append(["Total"] + [f"{r['correct']}/{r['total']} ({r['accuracy']:.3f})" for r in reports])
    rows.append(["95% interval"] + [f"{r['ci95'][0]:.3f}-{r['ci95'][1]:.3f}" for r in reports])
    return markdown_table(["category"] + [r["label"] for r in reports], rows) + "\n"


def plot(reports: list[dict[str, Any]], path: Path, title: str) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(max(4.0, 0.7 * len(reports) + 1.5), 3.4))
    acc = [r["accuracy"] for r in reports]
    err = [[a - r["ci95"][0] for a, r in zip(acc, reports)],
           [r["ci95"][1] - a for a, r in zip(acc, reports)]]  # fmt: skip
    ax.bar(range(len(reports)), acc, yerr=err, capsize=3, color="#4a7ab0")
    ax.set_xticks(range(len(reports)), [r["label"].removeprefix("ours:") for r in reports],
                  rotation=45, ha="right", fontsize=7)  # fmt: skip
    ax.set_ylim(0, 1)
    ax.set_ylabel("OCRBench accuracy (95% interval)")
    fig.suptitle(title, fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True, help="folder with OCRBench.json and the images")
    p.add_argument("--limit", type=int, help="only the first N questions")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--stream", action="store_true")
    p.add_argument("--think-mode", choices=THINK_MODES, default="none",
                   help="qwen3: send chat_template_kwargs {enable_thinking: false}")  # fmt: skip
    p.add_argument("--model-path")
    p.add_argument("--modes", default=",".join(CACHE_MODES))
    p.add_argument(
        "--configs",
        default="default",
        help=f"server configurations, comma-separated: {', '.join(CONFIGS)}",
    )
    p.add_argument("--server-args", default="", help="extra flags for our server")
    p.add_argument("--base-url", help="use a running server instead of launching")
    p.add_argument("--label", default="external")
    p.add_argument("--out", default="results/ocrbench")
    args = p.parse_args(argv)
    entries = load_dataset(args.data, args.limit)
    reports = []
    if args.base_url:
        with connect(args.base_url, args.label) as server:
            reports.append(evaluate(server, entries, args))
    else:
        for name in args.configs.split(","):
            if name not in CONFIGS:
                p.error(f"unknown config {name!r}; expected one of {', '.join(CONFIGS)}")
            dtype, flags = CONFIGS[name]
            with tempfile.TemporaryDirectory() as tmp:
                model = args.model_path
                if name in PUBLISHED:
                    model = published_copy(args.model_path, name, Path(tmp))
                for mode in args.modes.split(","):
                    extra = flags + args.server_args.split()
                    with launch("ours", model, mode, extra, dtype=dtype) as server:
                        if name != "default":
                            server.label = f"ours:{name}:{mode}"
                        reports.append(evaluate(server, entries, args))
    result = {
        "benchmark": "ocrbench",
        "config": {"data": str(args.data), "questions": len(entries),
                   "max_tokens": args.max_tokens, "model_path": args.model_path,
                   "think_mode": args.think_mode, "server_args": args.server_args},
        "cpu": cpu_info(),
        "reports": reports,
    }  # fmt: skip
    out = Path(args.out)
    write_json(out.with_suffix(".json"), result)
    md = markdown(reports)
    out.with_suffix(".md").write_text(md)
    plot(reports, out.with_suffix(".png"), f"{len(entries)} questions; {cpu_line(result['cpu'])}")
    print(md)
    return result


if __name__ == "__main__":
    main()
