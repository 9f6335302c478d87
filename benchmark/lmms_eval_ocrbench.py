"""Run lmms-eval's own ``ocrbench`` task on a synthetic set, against our server.

lmms-eval (``pip install lmms-eval`` in a virtualenv of its own: its torchvision pin pulls a
CUDA torch) loads OCRBench from the hub. This script turns a set written by
``benchmark.ocrbench_synth`` (``OCRBench.json`` and its images) into what its task reads, on
local files: a parquet of the hub's columns (``dataset``, ``question``, ``question_type``,
``answer`` as a list, ``image``) and a task file that includes the installed ``ocrbench.yaml``
with ``dataset_path: parquet``. Run it with the lmms-eval environment's Python (it needs
``datasets`` and ``lmms_eval``, nothing of ours):

    python -m benchmark.ocrbench_synth --set mix --count 1000 --out /tmp/ocr-mix
    LMMS/bin/python benchmark/lmms_eval_ocrbench.py /tmp/ocr-mix /tmp/ocr-mix-task
    python -m sglang.launch_server --enable-multimodal --port 30000 &    # the embedded reader
    LMMS/bin/python -m lmms_eval --model openai_compatible \\
        --model_args model_version=default,base_url=http://127.0.0.1:30000/v1,api_key=EMPTY \\
        --include_path /tmp/ocr-mix-task --tasks ocrbench_synth --batch_size 1 \\
        --output_path /tmp/ocr-mix-lmms

Its score prints as a fraction of 1,000 questions (``ocrbench_accuracy``): a 1,000-question
set reads directly.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

TASK = "ocrbench_synth"


def write_parquet(data: Path, out: Path) -> Path:
    """The set's entries as the hub dataset's columns, images embedded."""
    from datasets import Dataset, Features, Image, Sequence, Value

    entries = json.loads((data / "OCRBench.json").read_text())
    features = Features({
        "dataset": Value("string"), "question": Value("string"),
        "question_type": Value("string"), "answer": Sequence(Value("string")), "image": Image(),
    })  # fmt: skip
    rows = {
        "dataset": [e["dataset_name"] for e in entries],
        "question": [e["question"] for e in entries],
        "question_type": [e["type"] for e in entries],
        "answer": [e["answers"] if isinstance(e["answers"], list) else [e["answers"]]
                   for e in entries],
        "image": [str(data / e["image_path"]) for e in entries],
    }  # fmt: skip
    path = out / f"{TASK}.parquet"
    Dataset.from_dict(rows, features=features).to_parquet(str(path))
    return path


def write_task(parquet: Path, out: Path) -> Path:
    """A task file that takes everything from the installed ``ocrbench.yaml`` (prompt,
    generation settings, scoring) but the data."""
    import lmms_eval

    base = Path(lmms_eval.__file__).parent / "tasks" / "ocrbench" / "ocrbench.yaml"
    if not base.is_file():
        raise FileNotFoundError(f"no ocrbench task in this lmms-eval ({base})")
    text = (
        f"include: {base}\n"
        f"task: {TASK}\n"
        "dataset_path: parquet\n"
        "dataset_kwargs:\n"
        "  data_files:\n"
        f"    test: {parquet}\n"
    )
    path = out / f"{TASK}.yaml"
    path.write_text(text)
    return path


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("data", type=Path, help="a folder written by benchmark.ocrbench_synth")
    p.add_argument("out", type=Path, help="where the parquet and the task file go")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    parquet = write_parquet(args.data.resolve(), args.out.resolve())
    print(write_task(parquet, args.out.resolve()))


if __name__ == "__main__":
    main()
