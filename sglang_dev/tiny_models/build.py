"""The tiny builder by family name (``REGISTRY``), and its CLI.

``spec_builder`` builds from a ``Family`` spec; this module resolves the names the tests and
benchmarks use.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from sglang_dev.tiny_models import spec_builder as _spec_builder
from sglang_dev.tiny_models.common import Family
from sglang_dev.tiny_models.registry import DEFAULT_FAMILY, FAMILIES, REGISTRY, SMALL_FAMILIES
from sglang_dev.tiny_models.spec_builder import SIZES


def family_spec(family: str) -> Family:
    """The registered spec of ``family``; a clear error for an unknown name."""
    if family not in REGISTRY:
        raise ValueError(f"unknown family {family!r}; expected one of {FAMILIES}")
    return REGISTRY[family]


def build_tokenizer(family: str) -> Any:
    """The tokenizer of ``family`` (trained from its spec, as ``build_tiny_model`` saves it)."""
    return _spec_builder.build_tokenizer(family_spec(family))


def build_tiny_model(family: str, out_dir: str | Path, seed: int = 0, size: str = "tiny") -> Path:
    """Build a tiny random HF checkout of ``family`` into ``out_dir`` and return its path.

    ``size="small"`` (``SMALL_FAMILIES``) builds the heavier benchmark variant."""
    return _spec_builder.build_tiny_model(family_spec(family), out_dir, seed=seed, size=size)


def tiny_model_path(family: str, size: str = "tiny") -> Path:
    """Return a cached tiny checkout of ``family`` (built once, safe across processes)."""
    return _spec_builder.tiny_model_path(family_spec(family), size=size)


def main(argv: list[str] | None = None) -> None:
    """``python -m sglang_dev.tiny_models [--family F] [--out DIR] [--seed S] [--size S]``:
    build into ``--out``, or into the cache, and print the folder."""
    parser = argparse.ArgumentParser(
        prog="python -m sglang_dev.tiny_models",
        description="Build a tiny random HF checkpoint of a registered family.",
    )
    parser.add_argument("--family", choices=FAMILIES, default=DEFAULT_FAMILY)
    parser.add_argument("--out", default=None, help="output folder (default: the cache)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--size", choices=SIZES, default="tiny")
    args = parser.parse_args(argv)
    if args.size == "small" and args.family not in SMALL_FAMILIES:
        parser.error(f"--size small is available for {', '.join(SMALL_FAMILIES)}")
    if args.out is None:
        print(tiny_model_path(args.family, size=args.size))
    else:
        print(build_tiny_model(args.family, args.out, seed=args.seed, size=args.size))
