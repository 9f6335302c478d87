"""Extra benchmark models built locally from the tiny recipes (random weights).

``qwen2_vl_256x4``: the tiny Qwen2-VL of the peer comparisons in the project brief: text hidden
256 x 4 layers (8 heads, 4 KV heads), vision tower depth 2 x width 128, Qwen's real pixel range.

    python -m benchmark.bench_models            # prints the cached folder (built once)
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

TEXT = {
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "max_position_embeddings": 65536,
}
VISION = {"depth": 2, "embed_dim": 128, "num_heads": 4, "mlp_ratio": 2, "hidden_size": 256}
MIN_PIXELS, MAX_PIXELS = 56 * 56, 16384 * 28 * 28


def qwen2_vl_256x4(root: str | Path | None = None) -> Path:
    """Build (once) and return the folder of the 256 x 4 / 2 x 128 Qwen2-VL."""
    import torch
    import transformers

    from sglang_dev.tiny_models import tiny_model_path
    from sglang_dev.tiny_models.common import cache_root

    out = Path(root) if root else cache_root() / "bench-qwen2_vl-256x4-v1"
    if (out / "config.json").is_file():
        return out
    base = tiny_model_path("qwen2_vl")
    config = json.loads((base / "config.json").read_text())
    text = {k: v for k, v in config["text_config"].items() if k != "layer_types"}
    config["text_config"] = {**text, **TEXT}
    config["vision_config"] = {**config["vision_config"], **VISION}
    config.update({k: v for k, v in TEXT.items() if k in config})
    cfg = transformers.Qwen2VLConfig(**config)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(base, tmp, ignore=shutil.ignore_patterns("*.safetensors", "config.json"))
    torch.manual_seed(0)
    model = transformers.Qwen2VLForConditionalGeneration(cfg).to(torch.float32)
    model.save_pretrained(tmp)
    pre = json.loads((tmp / "preprocessor_config.json").read_text())
    pre["size"] = {"shortest_edge": MIN_PIXELS, "longest_edge": MAX_PIXELS}
    if "max_pixels" in pre:
        pre.update(min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS)
    (tmp / "preprocessor_config.json").write_text(json.dumps(pre, indent=2))
    tmp.rename(out)
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", help="folder (default: the tiny-model cache)")
    print(qwen2_vl_256x4(p.parse_args(argv).out))


if __name__ == "__main__":
    main()
