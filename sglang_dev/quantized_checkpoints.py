"""Checkpoints in the formats quantized VLMs are published in, written from each format's own
definition, for tests and benchmarks: AWQ (AutoAWQ's GEMM packing), GPTQ (AutoGPTQ's v1
packing, zero points stored less one) and compressed-tensors (llm-compressor's W4A16
``pack-quantized`` and W8A8 ``int-quantized``).

``write_quantized`` turns an unquantized checkpoint folder into one format: the language
model's decoder linears are quantized (round to nearest: per group min / max with a zero point
for AWQ and GPTQ, symmetric for compressed-tensors), everything else is stored as the format's
tools store it (float16 for AWQ and GPTQ, the source dtype for compressed-tensors). With
``reference`` it also writes the same model with each quantized weight replaced by its exact
dequantized value (float32), which HF loads as an ordinary checkpoint. ``random_codes`` makes
the quantized tensors directly from random codes (the 7B-shaped benchmarks: no dense weight is
ever built)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from sglang.srt.model_executor.memory.estimate import _is_lm_linear

FORMATS = ("awq", "gptq", "ct-w4a16", "ct-w8a8")
AWQ_PACK_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]  # AutoAWQ's order_map


def quantization_config(fmt: str, group: int) -> dict[str, Any]:
    if fmt == "awq":
        return {
            "quant_method": "awq",
            "bits": 4,
            "group_size": group,
            "zero_point": True,
            "version": "gemm",
            "modules_to_not_convert": ["visual"],
        }
    if fmt == "gptq":
        return {
            "quant_method": "gptq",
            "bits": 4,
            "group_size": group,
            "desc_act": False,
            "sym": False,
            "checkpoint_format": "gptq",
        }
    weights = {
        "num_bits": 4,
        "type": "int",
        "symmetric": True,
        "strategy": "group",
        "group_size": group,
    }
    inputs = None
    if fmt == "ct-w8a8":
        weights = {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel"}
        inputs = {
            "num_bits": 8,
            "type": "int",
            "symmetric": True,
            "dynamic": True,
            "strategy": "token",
        }
    return {
        "quant_method": "compressed-tensors",
        "format": "pack-quantized" if fmt == "ct-w4a16" else "int-quantized",
        "config_groups": {
            "group_0": {"targets": ["Linear"], "weights": weights, "input_activations": inputs}
        },
        "ignore": ["lm_head", "re:visual.*"],
    }


# Packing, as each format defines it ------------------------------------------------------------
def _words(nibbles: np.ndarray) -> np.ndarray:
    """(..., 8) values 0..15 -> int32 words, value i in bits 4 i .. 4 i + 3."""
    word = np.zeros(nibbles.shape[:-1], dtype=np.uint32)
    for i in range(8):
        word |= nibbles[..., i].astype(np.uint32) << np.uint32(4 * i)
    return word.view(np.int32)


def pack_awq(codes_in_out: np.ndarray) -> np.ndarray:
    """(in, out) -> (in, out / 8): word c holds columns 8 c + AWQ_PACK_ORDER[i] at nibble i."""
    rows, cols = codes_in_out.shape
    blocks = codes_in_out.reshape(rows, cols // 8, 8)
    return _words(blocks[..., AWQ_PACK_ORDER])


def pack_gptq_rows(codes_in_out: np.ndarray) -> np.ndarray:
    """(in, out) -> (in / 8, out): word r of a column holds inputs 8 r + i at nibble i."""
    rows, cols = codes_in_out.shape
    return _words(codes_in_out.reshape(rows // 8, 8, cols).transpose(0, 2, 1))


def pack_columns(values: np.ndarray) -> np.ndarray:
    """(rows, n) -> (rows, n / 8): word w holds columns 8 w + i at nibble i (GPTQ's zeros,
    compressed-tensors' weights)."""
    rows, cols = values.shape
    return _words(values.reshape(rows, cols // 8, 8))


# Quantizing a dense weight ---------------------------------------------------------------------
def _asymmetric(
    weight: torch.Tensor, group: int, lowest_zero: int = 0
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Codes (out, in), float16 scales and integer zeros (out, groups): W ~ s (q - z). GPTQ v1
    stores z - 1 in four bits, so there z >= 1 (``lowest_zero``)."""
    out, cols = weight.shape
    w = weight.double().reshape(out, cols // group, group)
    low, high = w.amin(-1).clamp(max=0), w.amax(-1).clamp(min=0)
    scale = ((high - low) / 15).clamp(min=1e-6).half()
    s = scale.double()
    zero = (-low / s).round().clamp(lowest_zero, 15)
    codes = (w / s[..., None] + zero[..., None]).round().clamp(0, 15)
    return (
        codes.reshape(out, cols).numpy().astype(np.uint8),
        scale.numpy(),
        zero.numpy().astype(np.uint8),
    )


def _symmetric(weight: torch.Tensor, group: int, bits: int, dtype: torch.dtype):
    """Signed codes (out, in) and scales (out, groups) in ``dtype``: W ~ s q."""
    out, cols = weight.shape
    top = 2 ** (bits - 1) - 1
    w = weight.double().reshape(out, cols // group, group)
    scale = (w.abs().amax(-1) / top).clamp(min=1e-6).to(dtype)
    codes = (w / scale.double()[..., None]).round().clamp(-top - 1, top)
    return codes.reshape(out, cols).to(torch.int8), scale


def quantize_tensor(
    name: str, weight: torch.Tensor, fmt: str, group: int
) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """The format's tensors for linear ``name`` (…``.weight``) and the weight they stand for
    (float64, exact)."""
    prefix = name.removesuffix(".weight")
    out, cols = weight.shape
    if fmt in ("awq", "gptq"):
        codes, scale, zero = _asymmetric(weight, group, 1 if fmt == "gptq" else 0)
        dense = (codes.astype(np.float64) - np.repeat(zero, group, 1)) * np.repeat(
            scale.astype(np.float64), group, 1
        )
        if fmt == "awq":
            tensors = {"qweight": pack_awq(codes.T), "qzeros": pack_awq(zero.T.copy())}
        else:
            zeros_less_one = zero - 1  # v1
            tensors = {
                "qweight": pack_gptq_rows(np.ascontiguousarray(codes.T)),
                "qzeros": pack_columns(np.ascontiguousarray(zeros_less_one.T)),
                "g_idx": np.arange(cols, dtype=np.int32) // group,
            }
        tensors["scales"] = np.ascontiguousarray(scale.T)
        out_tensors = {
            f"{prefix}.{k}": torch.from_numpy(np.ascontiguousarray(v)) for k, v in tensors.items()
        }
        return out_tensors, torch.from_numpy(dense)
    if fmt == "ct-w4a16":
        codes, scale = _symmetric(weight, group, 4, weight.dtype)
        dense = codes.double() * scale.double().repeat_interleave(group, 1)
        unsigned = (codes.numpy().astype(np.int16) + 8).astype(np.uint8)
        return {
            f"{prefix}.weight_packed": torch.from_numpy(pack_columns(unsigned)),
            f"{prefix}.weight_scale": scale,
            f"{prefix}.weight_shape": torch.tensor([out, cols], dtype=torch.int64),
        }, dense
    codes, scale = _symmetric(weight, cols, 8, weight.dtype)
    dense = codes.double() * scale.double()
    return {f"{prefix}.weight": codes, f"{prefix}.weight_scale": scale}, dense


def quantizable(name: str, shape: tuple[int, ...], group: int) -> bool:
    return _is_lm_linear(name, shape) and shape[0] % 8 == 0 and shape[1] % group == 0


def write_quantized(
    src: str | Path,
    out: str | Path,
    fmt: str,
    group: int = 128,
    reference: str | Path | None = None,
    random_seed: int | None = None,
) -> Path:
    """``src`` (an unquantized checkpoint folder) written in ``fmt``; see the module docstring.
    With ``random_seed`` the quantized tensors are ``random_codes`` instead (AWQ and GPTQ)."""
    src, out = Path(src), Path(out)
    shutil.copytree(src, out, ignore=shutil.ignore_patterns("*.safetensors*"))
    if reference is not None:
        shutil.copytree(src, reference, ignore=shutil.ignore_patterns("*.safetensors*"))
    dense_dtype = torch.float16 if fmt in ("awq", "gptq") else None
    gen = None if random_seed is None else torch.Generator().manual_seed(random_seed)
    for file in sorted(src.glob("*.safetensors")):
        stored, exact = {}, {}
        with safe_open(file, "pt") as f:
            for name in f.keys():
                shape = tuple(f.get_slice(name).get_shape())
                if gen is not None and quantizable(name, shape, group):
                    stored |= random_codes(name, shape, fmt, group, gen)
                    continue
                tensor = f.get_tensor(name)
                if quantizable(name, shape, group):
                    tensors, dense = quantize_tensor(name, tensor, fmt, group)
                    stored |= tensors
                    exact[name] = dense.float()
                else:
                    is_float = tensor.is_floating_point()
                    stored[name] = tensor.to(dense_dtype) if dense_dtype and is_float else tensor
                    exact[name] = stored[name]
        save_file(stored, out / file.name, metadata={"format": "pt"})
        if reference is not None:
            save_file(exact, Path(reference) / file.name, metadata={"format": "pt"})
    for index in src.glob("*.safetensors.index.json"):
        _write_index(out, index.name)
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"] = quantization_config(fmt, group)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out


def _write_index(folder: Path, name: str) -> None:
    weight_map = {}
    for file in sorted(folder.glob("*.safetensors")):
        with safe_open(file, "pt") as f:
            weight_map |= {key: file.name for key in f.keys()}
    (folder / name).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def random_codes(
    name: str, shape: tuple[int, int], fmt: str, group: int, gen: torch.Generator
) -> dict[str, torch.Tensor]:
    """A linear's tensors in ``fmt`` from random codes, zeros and small scales (weights of
    about the size of a trained model's), without building the dense weight."""
    out, cols = shape
    prefix = name.removesuffix(".weight")
    groups = cols // group

    def words(rows: int, n: int) -> torch.Tensor:
        return torch.randint(-(2**31), 2**31 - 1, (rows, n), generator=gen, dtype=torch.int64).to(
            torch.int32
        )

    scale = (torch.rand(groups, out, generator=gen) * 2e-3 + 1e-3).half()
    if fmt == "awq":
        return {
            f"{prefix}.qweight": words(cols, out // 8),
            f"{prefix}.qzeros": words(groups, out // 8),
            f"{prefix}.scales": scale,
        }
    if fmt == "gptq":
        return {
            f"{prefix}.qweight": words(cols // 8, out),
            f"{prefix}.qzeros": words(groups, out // 8),
            f"{prefix}.scales": scale,
            f"{prefix}.g_idx": torch.arange(cols, dtype=torch.int32) // group,
        }
    raise ValueError(f"random_codes: {fmt} not written")
