"""Convert a Qwen2-VL / Qwen2.5-VL checkpoint to GGUF for llama.cpp: the language model in
BF16, Q8_0 and Q4_0, and the vision tower (``--mmproj``) in BF16.

    python benchmark/peers/llamacpp_convert.py CHECKPOINT OUTDIR [--types bf16,q8_0,q4_0]

Writes OUTDIR/LM-BF16.gguf, LM-Q8_0.gguf, LM-Q4_0.gguf and mmproj-BF16.gguf, skipping files that
exist. Uses the converter and ``llama-quantize`` that ``setup_peers.sh llamacpp`` installed under
``--llama-root`` (default ``$PEER_VENVS/llamacpp``), run in this python (torch, transformers)."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

PEER_VENVS = Path(os.environ.get("PEER_VENVS", Path.home() / ".cache/sglang-bench/venvs"))
TYPES = {"bf16": "BF16", "q8_0": "Q8_0", "q4_0": "Q4_0"}
DIRECT = ("bf16", "q8_0")  # types the converter writes itself; Q4_0 goes through llama-quantize


def default_root() -> Path:
    return PEER_VENVS / "llamacpp"


def outputs(outdir: Path, types: list[str]) -> dict[str, Path]:
    """The files for ``types``: ``lm-<type>`` and ``mmproj``."""
    files = {f"lm-{t}": outdir / f"LM-{TYPES[t]}.gguf" for t in types}
    return {**files, "mmproj": outdir / "mmproj-BF16.gguf"}


def _import_converter(root: Path) -> object:
    """llama.cpp's ``convert_hf_to_gguf`` module, patched for our checkpoints (once)."""
    for path in (root / "pylib", root / "gguf-py", root):
        if path.is_dir() and str(path) not in sys.path:
            sys.path.insert(0, str(path))
    import convert_hf_to_gguf
    from conversion.base import TextModel
    from conversion.qwenvl import Qwen2VLVisionModel

    if not getattr(convert_hf_to_gguf, "_bench_patched", False):
        _patch_pre_tokenizer(TextModel)
        _patch_vision_names(Qwen2VLVisionModel)
        _patch_merger_map(Qwen2VLVisionModel)
        convert_hf_to_gguf._bench_patched = True  # type: ignore[attr-defined]
    return convert_hf_to_gguf


def _patch_pre_tokenizer(model_class: Any) -> None:
    """A BPE pre-tokenizer the converter does not know by hash (our locally trained byte-level
    BPE with GPT-2 splitting) is declared ``gpt-2``, a name llama.cpp's loader accepts."""
    original = model_class.get_vocab_base_pre

    def get_vocab_base_pre(self: Any, tokenizer: Any) -> str:
        try:
            return original(self, tokenizer)
        except NotImplementedError:
            return "gpt-2"

    model_class.get_vocab_base_pre = get_vocab_base_pre


def _patch_vision_names(model_class: Any) -> None:
    """transformers 5 saves Qwen2(.5)-VL's tower as ``model.visual.*``; the Qwen2-VL mmproj
    converter keeps only ``visual.*`` (its Qwen3-VL one already renames)."""
    original = model_class.filter_tensors.__func__

    def filter_tensors(cls: Any, item: tuple[str, Any]) -> tuple[str, Any] | None:
        name, gen = item
        if name.startswith("model.visual."):
            name = name.removeprefix("model.")
        return original(cls, (name, gen))

    model_class.filter_tensors = classmethod(filter_tensors)


def _patch_merger_map(model_class: Any) -> None:
    """The merger's second linear (``visual.merger.mlp.2``) is mapped through a block-indexed
    name, so a tower of fewer than 3 blocks (our small test checkpoints) cannot map it: such a
    tower gets the name map of 3 blocks."""
    import gguf

    original = model_class.__init__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        if self.block_count < 3:
            self.tensor_map = gguf.get_tensor_name_map(gguf.MODEL_ARCH.MMPROJ, 3)

    model_class.__init__ = __init__


def _convert(root: Path, checkpoint: Path, out: Path, outtype: str, mmproj: bool) -> None:
    """One converter run, into a temporary name renamed on success (an interrupted run leaves
    no file that the cache check would take for done)."""
    module = _import_converter(root)
    tmp = out.with_suffix(".part")
    argv = [str(checkpoint), "--outtype", outtype, "--outfile", str(tmp)]
    saved = sys.argv
    sys.argv = ["convert_hf_to_gguf.py", *argv, *(["--mmproj"] if mmproj else [])]
    try:
        module.main()  # type: ignore[attr-defined]
    finally:
        sys.argv = saved
    tmp.replace(out)


def _quantize(root: Path, source: Path, out: Path, qtype: str) -> None:
    """``--pure``: every tensor in ``qtype``; without it the output layer (and embedding) keep a
    wider type."""
    tmp = out.with_suffix(".part")
    cmd = [str(root / "bin" / "llama-quantize"), "--pure", str(source), str(tmp), qtype]
    subprocess.run([*cmd, str(os.cpu_count() or 1)], check=True)
    tmp.replace(out)


def convert(checkpoint: Path, outdir: Path, types: list[str], root: Path) -> dict[str, Path]:
    """Write the missing GGUF files of ``types`` (plus the BF16 vision tower); return them all."""
    outdir.mkdir(parents=True, exist_ok=True)
    files = outputs(outdir, types)
    bf16 = outdir / "LM-BF16.gguf"
    for kind, path in files.items():
        if path.is_file():
            continue
        if kind == "mmproj":
            _convert(root, checkpoint, path, "bf16", mmproj=True)
        elif kind.removeprefix("lm-") in DIRECT:
            _convert(root, checkpoint, path, kind.removeprefix("lm-"), mmproj=False)
        else:
            if not bf16.is_file():
                _convert(root, checkpoint, bf16, "bf16", mmproj=False)
            _quantize(root, bf16, path, TYPES[kind.removeprefix("lm-")])
    return files


def main(argv: list[str] | None = None) -> dict[str, Path]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("checkpoint", type=Path)
    p.add_argument("outdir", type=Path)
    p.add_argument("--types", default=",".join(TYPES), help=f"of {', '.join(TYPES)}")
    p.add_argument("--llama-root", type=Path, default=default_root())
    args = p.parse_args(argv)
    types = [t for t in args.types.lower().split(",") if t]
    unknown = sorted(set(types) - set(TYPES))
    if unknown:
        p.error(f"unknown types {unknown}; expected {list(TYPES)}")
    files = convert(args.checkpoint, args.outdir, types, args.llama_root)
    for path in files.values():
        print(f"{path}  {path.stat().st_size / 2**30:.2f} GiB")
    return files


if __name__ == "__main__":
    main()
