"""Tiny retrieval checkpoints over a family's tiny model, with the files a published one ships:
an embedding model's sentence-transformers ``modules.json`` and ``1_Pooling/config.json`` (GME /
Qwen3-VL-Embedding style: last token, normalised), and a reranker's head: a
``*ForSequenceClassification`` ``score`` linear (jina-reranker-m0 style), or
``classifier_from_token`` yes / no logits (Qwen3-Reranker style)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from sglang_dev.tiny_models.build import build_tiny_model

_ST_MODES = {"last": "pooling_mode_lasttoken", "mean": "pooling_mode_mean_tokens",
             "cls": "pooling_mode_cls_token"}  # fmt: skip
# the rerankers' tokens: a real one names "no" / "yes"; the tiny byte-level vocabularies hold
# "n" / "y" as single tokens (the words are two)
RERANK_TOKENS = ("n", "y")


def build_tiny_embedding_model(
    family: str,
    out_dir: str | Path,
    pooling: str = "last",
    normalize: bool = True,
    matryoshka_dimensions: list[int] | None = None,
    seed: int = 0,
    size: str = "tiny",
) -> Path:
    """``family``'s tiny (or small) model with a sentence-transformers pooling config."""
    out = _base(family, Path(out_dir), seed, size)
    config = json.loads((out / "config.json").read_text())
    hidden = _hidden_size(config)
    st = "sentence_transformers.models."
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": st + "Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": st + "Pooling"},
    ]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": st + "Normalize"})
        (out / "2_Normalize").mkdir(exist_ok=True)
    _write(out / "modules.json", modules)
    settings = {"word_embedding_dimension": hidden, "include_prompt": True}
    settings |= {key: name == pooling for name, key in _ST_MODES.items()}
    (out / "1_Pooling").mkdir(exist_ok=True)
    _write(out / "1_Pooling" / "config.json", settings)
    if matryoshka_dimensions:
        _patch(out / "config.json", matryoshka_dimensions=matryoshka_dimensions)
    return out


def build_tiny_reranker(family: str, out_dir: str | Path, head: str, seed: int = 0) -> Path:
    """``head="score"``: a one-label ``score`` linear (architecture
    ``<Family>ForSequenceClassification``); ``head="tokens"``: the LM's logits of "no" / "yes"."""
    import torch
    from safetensors.torch import load_file, save_file

    out = _base(family, Path(out_dir), seed)
    if head == "tokens":
        _patch(out / "config.json", classifier_from_token=list(RERANK_TOKENS))
        return out
    if head != "score":
        raise ValueError(f"head must be score or tokens, not {head!r}")
    config = json.loads((out / "config.json").read_text())
    arch = config["architectures"][0].replace("ForConditionalGeneration", "")
    _patch(out / "config.json", architectures=[f"{arch}ForSequenceClassification"], num_labels=1)
    weights_path = out / "model.safetensors"
    weights = load_file(str(weights_path))
    generator = torch.Generator().manual_seed(seed + 1)
    weights["score.weight"] = torch.randn(1, _hidden_size(config), generator=generator) * 0.5
    save_file(weights, str(weights_path), metadata={"format": "pt"})
    return out


def _base(family: str, out: Path, seed: int, size: str = "tiny") -> Path:
    if out.exists():
        shutil.rmtree(out)
    return build_tiny_model(family, out, seed=seed, size=size)


def _hidden_size(config: dict[str, Any]) -> int:
    return int(config.get("text_config", config).get("hidden_size") or config["hidden_size"])


def _patch(path: Path, **fields: Any) -> None:
    data = json.loads(path.read_text())
    _write(path, {**data, **fields})


def _write(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n")
