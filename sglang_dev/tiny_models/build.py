"""Build a tiny random Hugging Face model folder of a registered family, cache it; the CLI.

``build_tiny_model(family, out_dir)`` writes a standard HF checkout (config.json,
model.safetensors, tokenizer.json, tokenizer_config.json, chat template,
generation_config.json and, for VLMs, preprocessor_config.json / processor_config.json /
video_preprocessor_config.json) from the family's spec (``REGISTRY``) with randomly initialised
float32 weights. Everything is built locally and deterministically from ``seed``: the
byte-level BPE tokenizer is trained on a small corpus, and the weights come from a seeded torch
init.

``size="small"`` (``SMALL_FAMILIES``: the specs with ``small_vision``) gives a heavier model for
benchmarks: text hidden 256 with 4 layers, a depth-4 width-384 vision tower and Qwen's real
pixel range, so that the vision encoder's cost is visible and grows with the image's resolution
on a CPU.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from sglang_dev.tiny_models.common import (
    TEXT,
    VECTOR_NOISE,
    Family,
    Recipe,
    cache_root,
    file_lock,
    patch_json,
    quiet_progress_bars,
    torch_seed,
    train_tokenizer,
    write_json,
)
from sglang_dev.tiny_models.registry import DEFAULT_FAMILY, FAMILIES, REGISTRY, SMALL_FAMILIES

logger = logging.getLogger(__name__)

SIZES = ("tiny", "small")
# Bump whenever the recipe changes so that stale cached folders are not reused.
# 5: video_preprocessor_config.json and video parts in Qwen templates; 6: GLM-4.1V,
# LLaVA-OneVision and InternVL video processors and video parts
RECIPE_VERSION = 6

# "small": overrides of the tiny recipe (text; the vision tower's are the family's small_vision).
SMALL_TEXT = {
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,  # head_dim stays 32: the mrope sections still fit
    "num_key_value_heads": 4,
    "max_position_embeddings": 65536,
}
SMALL_MIN_PIXELS, SMALL_MAX_PIXELS = 56 * 56, 16384 * 28 * 28
_GEMMA_POST_NORM_BOOST = 3.0
_GEMMA_POST_NORMS = ("post_attention_layernorm.weight", "post_feedforward_layernorm.weight")


def family_spec(family: str) -> Family:
    """The registered spec of ``family``; a clear error for an unknown name."""
    if family not in REGISTRY:
        raise ValueError(f"unknown family {family!r}; expected one of {FAMILIES}")
    return REGISTRY[family]


def build_tokenizer(family: str) -> Any:
    """The tokenizer of ``family`` (trained from its spec, as ``build_tiny_model`` saves it)."""
    return train_tokenizer(family_spec(family).tokenizer)


def build_tiny_model(family: str, out_dir: str | Path, seed: int = 0, size: str = "tiny") -> Path:
    """Build a tiny random HF checkout of ``family`` into ``out_dir`` and return its path.

    ``size="small"`` (``SMALL_FAMILIES``) builds the heavier benchmark variant."""
    import torch
    import transformers

    spec = family_spec(family)
    if size not in SIZES or (size == "small" and spec.small_vision is None):
        raise ValueError(f"size {size!r} is not available for {spec.name!r}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    tokenizer = train_tokenizer(spec.tokenizer)
    vocab = len(tokenizer)
    recipe = spec.recipe(tokenizer, vocab)
    if size == "small":
        recipe = _small(recipe, spec.small_vision or {})
        tokenizer.model_max_length = SMALL_TEXT["max_position_embeddings"]
    recipe.config.dtype = torch.float32
    auto_cls = getattr(transformers, recipe.auto_class)
    with torch_seed(seed):
        model = auto_cls.from_config(recipe.config, dtype=torch.float32)
        _randomize_constants(model)
    model.generation_config = transformers.GenerationConfig(**recipe.generation)
    with quiet_progress_bars():
        model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    # Published-style spellings that older readers expect.
    patch_json(out / "config.json", torch_dtype="float32")
    bos = {"add_bos_token": True, "add_eos_token": False} if spec.tokenizer.add_bos else {}
    patch_json(out / "tokenizer_config.json", tokenizer_class="PreTrainedTokenizerFast", **bos)
    if recipe.preprocessor is not None:
        write_json(out / "preprocessor_config.json", recipe.preprocessor)
    if recipe.processor is not None:
        write_json(out / "processor_config.json", recipe.processor)
    if (recipe.video_preprocessor is not None) != spec.video:
        raise ValueError(f"{spec.name!r}: the recipe's video processor disagrees with its spec")
    if recipe.video_preprocessor is not None:
        write_json(out / "video_preprocessor_config.json", recipe.video_preprocessor)
    return out


def _small(recipe: Recipe, vision: dict[str, Any]) -> Recipe:
    """The "small" variant of a Qwen VLM recipe: the same config class rebuilt with overrides."""
    data = recipe.config.to_dict()
    text = {k: v for k, v in data["text_config"].items() if k != "layer_types"}
    data["text_config"] = {**text, **SMALL_TEXT}
    data["vision_config"] = {**data["vision_config"], **vision}
    config = type(recipe.config)(**data)
    pre = dict(recipe.preprocessor or {})
    pre["size"] = {"shortest_edge": SMALL_MIN_PIXELS, "longest_edge": SMALL_MAX_PIXELS}
    if "max_pixels" in pre:
        pre.update(min_pixels=SMALL_MIN_PIXELS, max_pixels=SMALL_MAX_PIXELS)
    return dataclasses.replace(recipe, config=config, preprocessor=pre)


def _randomize_constants(model: Any) -> None:
    """Randomise parameters that HF initialises to constants: 1-D ones (norm weights, biases)
    get noise, so a loader that skips them is caught; constant matrices (Gemma3's zero-init
    ``mm_input_projection_weight``, which would make images invisible) get a normal init.
    Gemma's sandwich post-norms are amplified, otherwise the tied, sqrt(hidden)-scaled
    embeddings dominate the residual stream and greedy decoding mostly repeats a token."""
    import torch

    gemma = "gemma" in type(model).__name__.lower()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if not param.is_floating_point():
                continue
            if param.ndim == 1:
                param.add_(torch.randn_like(param) * VECTOR_NOISE)
                if gemma and name.endswith(_GEMMA_POST_NORMS):
                    param.add_(_GEMMA_POST_NORM_BOOST)
            elif param.numel() > 1 and bool((param == param.flatten()[0]).all()):
                param.normal_(0.0, TEXT["initializer_range"])


def tiny_model_path(family: str, size: str = "tiny") -> Path:
    """Return a cached tiny checkout of ``family`` (built once, safe across processes)."""
    family_spec(family)  # an unknown name fails before anything is made
    root = cache_root()
    suffix = "" if size == "tiny" else f"-{size}"
    final = root / f"{family}{suffix}-v{RECIPE_VERSION}"
    if (final / "config.json").is_file():
        return final
    root.mkdir(parents=True, exist_ok=True)
    with file_lock(root / f".{final.name}.lock"):
        if (final / "config.json").is_file():
            return final
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=root))
        os.chmod(tmp, 0o755)
        logger.info(
            "building the %s %s checkpoint (a tokenizer trained here, seeded random weights): "
            "first use only, a few seconds; cached in %s",
            size,
            family,
            final,
        )
        start = time.perf_counter()
        try:
            build_tiny_model(family, tmp, size=size)
            os.replace(tmp, final)
            logger.info("built %s in %.1f s", final.name, time.perf_counter() - start)
        except OSError:
            if not (final / "config.json").is_file():
                raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return final


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
