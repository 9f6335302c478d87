"""What a model's parts take before they load: weight bytes from a checkpoint's safetensors
headers in the dtype and quantization the model will run in, and KV bytes per token."""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from sglang.srt.layers.quantization import quant_layouts
from sglang.srt.layers.quantization.checkpoint_formats import (
    PrequantizedFormat,
)
from sglang.srt.mem_cache.kv_layout import KVLayout
from sglang.srt.models import fast_vision

MIN_KV_TOKENS = 4096


GIB = 1 << 30


_SAFETENSORS_BYTES = {
    "F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
    "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1, "U16": 2, "U32": 4, "U64": 8,
}  # fmt: skip


_FLOAT_TYPES = {"F64", "F32", "F16", "BF16"}


_NOT_LM = ("visual", "vision", "vit.", "image", "mm_projector", "multi_modal", "norm")


# Estimates before loading ----------------------------------------------------------------------
@dataclass(frozen=True)
class Quantization:
    bits: int  # 8 or 4 bits per quantized linear weight element
    group_size: int | None  # int4: columns sharing one scale and zero point
    head_bits: int = 8  # the LM head: 8, 4 (in the groups; a tied one 8) or 0 (dense)
    dynamic: bool = False  # int8dq's int8 linears: each also keeps its column sums (int32)
    tower_int8: bool = False  # the vision tower's linears in int8 (int4wo; int8dq + vision)

    @classmethod
    def parse(
        cls, spec: str | None, lm_head_dtype: str = "int8", vision_int8dq: bool = False
    ) -> Quantization | None:
        """``int8wo`` / ``int8dq`` / ``int4wo-<group>`` / ``8da4w-<group>`` (torchao config names),
        ``--cpu-lm-head-dtype`` and ``--vision-int8dq``; None or an unknown spec: unquantized."""
        if not spec:
            return None
        head_bits = {"int8": 8, "int4": 4, "bfloat16": 0}.get(lm_head_dtype, 8)
        if spec.startswith("int8"):
            dynamic = spec == "int8dq"
            head = 8 if head_bits == 4 else head_bits
            return cls(8, None, head, dynamic, tower_int8=dynamic and vision_int8dq)
        if spec.startswith(("int4wo", "8da4w")):
            group = spec.rpartition("-")[2]
            group_size = int(group) if group.isdigit() else 128
            tower_dynamic = spec.startswith("8da4w") and vision_int8dq
            return cls(4, group_size, head_bits, tower_dynamic, tower_int8=True)
        return None


def safetensors_headers(model_path: str | Path) -> dict[str, tuple[str, tuple[int, ...]]] | None:
    """``name -> (dtype, shape)`` of every tensor in the checkpoint's safetensors files, read
    from their headers only; None when the folder has no safetensors."""
    files = sorted(Path(model_path).glob("*.safetensors"))
    if not files:
        return None
    out: dict[str, tuple[str, tuple[int, ...]]] = {}
    for path in files:
        with open(path, "rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(size))
        for name, entry in header.items():
            if name != "__metadata__":
                out[name] = (entry["dtype"], tuple(entry["shape"]))
    return out


def _is_lm_linear(name: str, shape: tuple[int, ...]) -> bool:
    """A linear weight of the language model's decoder layers: what ``--torchao-config``
    quantizes (not the vision tower, the embeddings or the LM head)."""
    return (
        len(shape) == 2
        and name.endswith(".weight")
        and "layers." in name
        and not any(word in name for word in _NOT_LM)
    )


def _is_tower_linear(name: str, shape: tuple[int, ...], patch_linear: bool = False) -> bool:
    """A linear weight of the vision tower or projector (what int4 stores in int8); with
    ``patch_linear``, the patchwise Conv3d of the patch embedding too (served as a linear:
    ``fast_vision.patch_embedding_is_linear``)."""
    tower = any(word in name for word in _NOT_LM if word != "norm")
    if patch_linear and tower and name.endswith("patch_embed.proj.weight") and len(shape) == 5:
        return True
    return tower and len(shape) == 2 and name.endswith(".weight") and "embed" not in name


def _head_bytes(shape: tuple[int, ...], elem: int, quant: Quantization) -> int:
    rows, cols = shape
    group = quant.group_size or 128
    if quant.head_bits == 4 and quant_layouts.int4_skip_reason(cols, group) is None:
        return rows * cols // 2 + 2 * rows * (cols // group) * 2  # bfloat16 scales and mins
    if quant.head_bits == 0:
        return rows * cols * elem
    return rows * cols + rows * 4  # int8 per output channel


def _published_bytes(name: str, numel: int, fmt: PrequantizedFormat) -> int | None:
    """A published checkpoint's format tensor as loaded
    (``layers/quantization/checkpoint_formats.py``), or None for an ordinary tensor (the codes
    keep their bytes as they are stored)."""
    suffix = name.rpartition(".")[2]
    if suffix in ("qzeros", "g_idx", "weight_shape"):
        return 0  # folded into the mins, or only checked
    if suffix == "scales" or (suffix == "weight_scale" and fmt.bits == 4):
        return numel * 8  # a float32 scale and min per group
    if suffix == "weight_scale":
        return numel * (8 if fmt.dynamic else 4)  # float32 scale (+ int8dq's column sums)
    return None


def tensor_bytes_as(
    name: str,
    dtype: str,
    shape: tuple[int, ...],
    run_dtype: torch.dtype,
    quant: Quantization | None,
    untied_head: bool = False,
    published: PrequantizedFormat | None = None,
    patch_linear: bool = False,
    weight_dtype: torch.dtype | None = None,
) -> int:
    """Bytes one checkpoint tensor takes once loaded in ``run_dtype`` (floating tensors) and,
    for the language model's linear weights, quantized as they are stored: int8 = 1 byte per
    element + a float32 scale per row; int4 = half a byte per element + a bfloat16 scale and
    min per group of ``group_size`` columns (weights whose width is not a multiple
    of the group and of 64 stay unquantized); an untied LM head (its own tensor) and then the
    token embeddings in int8, or a tied pair's one table in int8 unless the head stays dense
    (``quantize_head_and_embeddings``); with int4, the vision tower's
    linear weights in int8 (``quantize_vision_tower``; with int8dq and ``vision_int8dq`` too, plus
    int8dq's column sums), the patch embedding among them where ``patch_linear``. With
    ``weight_dtype`` (unquantized), 2-D weights (linears' and embeddings') take its bytes."""
    numel = 1
    for dim in shape:
        numel *= dim
    if published is not None:
        size = _published_bytes(name, numel, published)
        if size is not None:
            return size
    if dtype not in _FLOAT_TYPES:
        return numel * _SAFETENSORS_BYTES.get(dtype, 4)
    elem = torch.empty(0, dtype=run_dtype).element_size()
    if weight_dtype is not None and quant is None and len(shape) == 2 and name.endswith(".weight"):
        return numel * weight_dtype.itemsize
    if quant is not None and name.endswith("lm_head.weight") and len(shape) == 2:
        return _head_bytes(shape, elem, quant)
    if quant is not None and name.endswith("embed_tokens.weight"):
        if untied_head or quant.head_bits != 0:  # a tied table: the head's int8 codes
            return numel + shape[0] * 4  # int8 per row
    if quant is not None and quant.tower_int8 and _is_tower_linear(name, shape, patch_linear):
        return numel + shape[0] * (8 if quant.dynamic else 4)  # int8 per output channel
    if quant is None or not _is_lm_linear(name, shape):
        return numel * elem
    rows, cols = shape
    if quant.bits == 8:
        return numel + rows * (8 if quant.dynamic else 4)
    group = quant.group_size or 128
    if quant_layouts.int4_skip_reason(cols, group) is not None:
        return numel * elem
    return numel // 2 + 2 * rows * (cols // group) * 2  # bfloat16 scales and mins, any run dtype


def estimate_weight_bytes(
    model_path: str | Path,
    run_dtype: torch.dtype,
    quantization: str | None = None,
    lm_head_dtype: str = "int8",
    vision_int8dq: bool = False,
    published: PrequantizedFormat | None = None,
    weight_dtype: torch.dtype | None = None,
) -> int | None:
    """The weights' bytes once loaded in ``run_dtype`` with ``quantization`` (a torchao config
    name such as ``int8wo`` or ``int4wo-128``) or as a ``published`` quantized checkpoint, from
    the safetensors headers alone; ``weight_dtype``: the linear and embedding weights' dtype
    where it is not ``run_dtype`` (``--cpu-bf16-weights``)."""
    headers = safetensors_headers(model_path)
    if headers is None:
        return None
    quant = Quantization.parse(quantization, lm_head_dtype, vision_int8dq)
    untied_head = any(name.endswith("lm_head.weight") for name in headers)
    patch_linear = fast_vision.patch_embedding_is_linear(_model_type(model_path))
    return sum(
        tensor_bytes_as(
            name, dtype, shape, run_dtype, quant, untied_head, published, patch_linear, weight_dtype
        )
        for name, (dtype, shape) in headers.items()
    )


def _model_type(model_path: str | Path) -> str:
    try:
        return str(json.loads((Path(model_path) / "config.json").read_text()).get("model_type"))
    except (OSError, ValueError, AttributeError):
        return ""


def kv_bytes_per_token(text_config: Any, dtype: torch.dtype) -> int:
    return KVLayout.of(text_config).bytes_per_token(dtype)


def min_kv_tokens(max_total_tokens: int | None, context_length: int) -> int:
    return max_total_tokens or min(context_length, MIN_KV_TOKENS)


def fmt_bytes(n: float) -> str:
    return f"{n / GIB:.2f} GiB" if abs(n) >= GIB else f"{n / 2**20:.1f} MiB"
