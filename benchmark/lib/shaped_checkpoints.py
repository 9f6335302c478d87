"""Checkpoints with a released model's real shapes and random bfloat16 weights, never
materialised in float32: the model is laid out on the meta device and each tensor is created in
bfloat16 and written shard by shard; cached under the project cache dir. The tokenizer and
processor are the tiny models' (a small BPE, Qwen's image processor with its real pixel range).
``published_twin`` writes the same shapes in a published quantized format (AWQ, GPTQ)."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from tqdm import tqdm

GIB = 1 << 30


SHARD_BYTES = 2 * GIB


PIXELS = (56 * 56, 14 * 14 * 4 * 16384)  # Qwen2.5-VL's min_pixels, max_pixels


# Qwen/Qwen2.5-VL-7B-Instruct's config.json (text and vision) and a tiny twin for tests.
SHAPES: dict[str, dict[str, dict[str, Any]]] = {
    "7b": {
        "text": {
            "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
            "num_attention_heads": 28, "num_key_value_heads": 4, "vocab_size": 152064,
            "max_position_embeddings": 128000, "rms_norm_eps": 1e-6, "hidden_act": "silu",
            "sliding_window": 32768, "max_window_layers": 28, "use_sliding_window": False,
            "rope_parameters": {
                "rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [16, 24, 24]
            },
        },
        "vision": {
            "depth": 32, "hidden_size": 1280, "intermediate_size": 3420, "num_heads": 16,
            "out_hidden_size": 3584, "patch_size": 14, "spatial_merge_size": 2,
            "temporal_patch_size": 2, "window_size": 112, "fullatt_block_indexes": [7, 15, 23, 31],
            "tokens_per_second": 2, "hidden_act": "silu", "in_channels": 3,
        },
    },
    "3b": {  # Qwen2.5-VL-3B-Instruct's per-layer dims
        "text": {
            "hidden_size": 2048, "intermediate_size": 11008, "num_hidden_layers": 36,
            "num_attention_heads": 16, "num_key_value_heads": 2, "vocab_size": 151936,
            "max_position_embeddings": 128000, "rms_norm_eps": 1e-6, "hidden_act": "silu",
            "sliding_window": 32768, "max_window_layers": 70, "use_sliding_window": False,
            "rope_parameters": {
                "rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [16, 24, 24]
            },
        },
        "vision": {
            "depth": 32, "hidden_size": 1280, "intermediate_size": 3420, "num_heads": 16,
            "out_hidden_size": 2048, "patch_size": 14, "spatial_merge_size": 2,
            "temporal_patch_size": 2, "window_size": 112, "fullatt_block_indexes": [7, 15, 23, 31],
            "tokens_per_second": 2, "hidden_act": "silu", "in_channels": 3,
        },
    },
    "2b": {  # Qwen2-VL-2B-Instruct's per-layer dims (a Qwen2-VL: full-attention tower)
        "model_type": "qwen2_vl",
        "text": {
            "hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28,
            "num_attention_heads": 12, "num_key_value_heads": 2, "vocab_size": 151936,
            "max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "hidden_act": "silu",
            "sliding_window": 32768, "max_window_layers": 28, "use_sliding_window": False,
            "tie_word_embeddings": True,
            "rope_parameters": {
                "rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [16, 24, 24]
            },
        },
        "vision": {
            "depth": 32, "embed_dim": 1280, "hidden_size": 1536, "mlp_ratio": 4, "num_heads": 16,
            "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2,
            "hidden_act": "quick_gelu", "in_channels": 3,
        },
    },
    "tiny": {
        "text": {
            "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 2048,
            "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "hidden_act": "silu",
            "rope_parameters": {
                "rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [4, 6, 6]
            },
        },
        "vision": {
            "depth": 2, "hidden_size": 64, "intermediate_size": 128, "num_heads": 4,
            "out_hidden_size": 128, "patch_size": 14, "spatial_merge_size": 2,
            "temporal_patch_size": 2, "window_size": 112, "fullatt_block_indexes": [1],
            "tokens_per_second": 2, "hidden_act": "silu", "in_channels": 3,
        },
    },
}  # fmt: skip


BUILD_VERSION = 3  # bump when the checkpoint recipe changes


def shape_config(shape: str, layers: int | None, vision_depth: int | None) -> dict[str, Any]:
    spec = SHAPES[shape]
    text, vision = dict(spec["text"]), dict(spec["vision"])
    if layers:
        text["num_hidden_layers"] = layers
    if vision_depth:
        vision["depth"] = vision_depth
        if "fullatt_block_indexes" in vision:  # Qwen2.5-VL's windowed tower
            full = [i for i in vision["fullatt_block_indexes"] if i < vision_depth]
            vision["fullatt_block_indexes"] = full or [vision_depth - 1]
    return {"model_type": spec.get("model_type", "qwen2_5_vl"), "text": text, "vision": vision}


def _tensor_specs(config: Any) -> list[tuple[str, tuple[int, ...]]]:
    """Names and shapes of the model's weights, from a model on the meta device."""
    import torch
    import transformers

    with torch.device("meta"):
        model = transformers.AutoModelForImageTextToText.from_config(config)
    seen: set[int] = set()  # tied weights (the 2B's head is its embedding) are written once
    specs = []
    for name, t in model.state_dict(keep_vars=True).items():
        if id(t) not in seen:
            seen.add(id(t))
            specs.append((name, tuple(t.shape)))
    return specs


def _random_bf16(name: str, shape: tuple[int, ...], gen: Any) -> Any:
    """A host tensor of random bfloat16 weights, drawn on the generator's device."""
    import torch

    t = torch.empty(shape, dtype=torch.bfloat16, device=gen.device)
    if len(shape) == 1 and name.endswith("weight"):  # norm scales: near 1
        return t.normal_(1.0, 0.02, generator=gen).cpu()
    return t.normal_(0.0, 0.02, generator=gen).cpu()


def _shards(specs: list[tuple[str, tuple[int, ...]]]) -> list[list[tuple[str, tuple[int, ...]]]]:
    shards: list[list[tuple[str, tuple[int, ...]]]] = [[]]
    size = 0
    for name, shape in specs:
        nbytes = 2 * _numel(shape)
        if shards[-1] and size + nbytes > SHARD_BYTES:
            shards.append([])
            size = 0
        shards[-1].append((name, shape))
        size += nbytes
    return shards


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for dim in shape:
        n *= dim
    return n


def _write_weights(
    out: Path, specs: list[tuple[str, tuple[int, ...]]], seed: int, mute: Any
) -> None:
    """Random bfloat16 weights, shard by shard; the head's rows of the ``mute`` ids are zero.
    Drawn on the GPU where there is one (seconds for a 7B model, minutes on a CPU)."""
    import torch
    from safetensors.torch import save_file

    shards = _shards(specs)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator(device=device).manual_seed(seed)
    names = [name for name, _ in specs]
    head = ([n for n in names if n.endswith("lm_head.weight")]  # tied: the embedding
            or [n for n in names if n.endswith("embed_tokens.weight")])[0]  # fmt: skip
    weight_map: dict[str, str] = {}
    bar = tqdm(total=sum(2 * _numel(s) for _, s in specs), unit="B", unit_scale=True,
               desc="random bfloat16 weights")  # fmt: skip
    for i, shard in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        tensors = {name: _random_bf16(name, shape, gen) for name, shape in shard}
        if head in tensors:
            tensors[head][mute] = 0
        save_file(tensors, str(out / fname), metadata={"format": "pt"})
        os.chmod(out / fname, 0o644)
        bar.update(sum(t.numel() * 2 for t in tensors.values()))
        weight_map.update(dict.fromkeys(tensors, fname))
        del tensors
    bar.close()
    total = sum(2 * _numel(s) for _, s in specs)
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")


_FAMILY = {  # model_type -> (config class, processor class, architecture)
    "qwen2_vl": ("Qwen2VLConfig", "Qwen2VLProcessor", "Qwen2VLForConditionalGeneration"),
    "qwen2_5_vl": ("Qwen2_5_VLConfig", "Qwen2_5_VLProcessor", "Qwen2_5_VLForConditionalGeneration"),
}


def _write_processor_files(out: Path, tok: Any, processor_class: str) -> None:
    from sglang_dev.tiny_models.common import patch_json, qwen_generation, qwen_preprocessor
    from sglang_dev.tiny_models.common import write_json as write_config_json

    tok.save_pretrained(out)
    patch_json(out / "tokenizer_config.json", tokenizer_class="PreTrainedTokenizerFast")
    pre = qwen_preprocessor(14, processor_class, "Qwen2VLImageProcessor", legacy=True)
    pre.update(min_pixels=PIXELS[0], max_pixels=PIXELS[1])
    pre["size"] = {"shortest_edge": PIXELS[0], "longest_edge": PIXELS[1]}
    write_config_json(out / "preprocessor_config.json", pre)
    write_config_json(out / "generation_config.json", qwen_generation(tok))


def _mute_ids(tok: Any, vocab_size: int) -> Any:
    """Ids the random head must not pick: those the small tokenizer lacks, its special tokens
    and pieces that are no text alone. A greedy random model repeats one token; were it one of
    these, a streamed reply would show no text until its end, and client-timed TTFT (first
    content) would include every decode step."""
    import torch

    mute = torch.ones(vocab_size, dtype=torch.bool)
    special = set(tok.all_special_ids)
    for i in range(len(tok)):
        text = tok.decode([i])
        if i not in special and text.strip() and "\ufffd" not in text:
            mute[i] = False
    return mute


def build_checkpoint(out: Path, dims: dict[str, Any], seed: int = 0) -> Path:
    """Write a Qwen2-VL or Qwen2.5-VL checkpoint of ``dims`` (``shape_config``) with random
    bfloat16 weights into ``out``."""
    import torch
    import transformers

    from sglang_dev.tiny_models import build_tokenizer
    from sglang_dev.tiny_models.common import patch_json, qwen_ids

    config_class, processor_class, architecture = _FAMILY[dims["model_type"]]
    tok = build_tokenizer("qwen2_5_vl")
    eot, eos = tok.convert_tokens_to_ids("<|endoftext|>"), tok.convert_tokens_to_ids("<|im_end|>")
    text = {**dims["text"], "bos_token_id": eot, "eos_token_id": eos}
    tied = text.pop("tie_word_embeddings", False)
    config = getattr(transformers, config_class)(
        text_config=text, vision_config=dims["vision"], tie_word_embeddings=tied, **qwen_ids(tok)
    )
    config.dtype = torch.bfloat16
    config.architectures = [architecture]  # peers (vLLM) pick the generating model from it
    out.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(out)
    patch_json(out / "config.json", torch_dtype="bfloat16")
    tok.model_max_length = dims["text"]["max_position_embeddings"]
    _write_processor_files(out, tok, processor_class)
    _write_weights(out, _tensor_specs(config), seed, mute=_mute_ids(tok, text["vocab_size"]))
    return out


def cached_checkpoint(dims: dict[str, Any], shape: str) -> Path:
    """The checkpoint of ``dims`` under the project cache dir, built on first use."""
    family, text, vision = dims["model_type"], dims["text"], dims["vision"]
    name = f"{family}-{shape}-L{text['num_hidden_layers']}-V{vision['depth']}-v{BUILD_VERSION}"
    root = Path(os.environ.get("SGLANG_CACHE_DIR") or Path.home() / ".cache" / "sglang")
    final = root / "bench-models" / name
    if (final / "model.safetensors.index.json").is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=final.parent))
    os.chmod(tmp, 0o755)
    try:
        build_checkpoint(tmp, dims)
        os.replace(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def published_twin(model: Path, fmt: str) -> Path:
    """``model``'s shapes in a published quantized format (``awq`` or ``gptq``, group 128):
    the decoder linears as random codes, zeros and scales, everything else in float16, as
    AutoAWQ and AutoGPTQ store it; built beside ``model`` on first use."""
    from sglang_dev.quantized_checkpoints import write_quantized

    final = model.with_name(f"{model.name}-{fmt}")
    if (final / "config.json").is_file():
        return final
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=final.parent))
    shutil.rmtree(tmp)
    try:
        write_quantized(model, tmp, fmt, 128, random_seed=0)
        os.replace(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def checkpoint_bytes(model: Path) -> int:
    return sum(f.stat().st_size for f in model.glob("*.safetensors"))
