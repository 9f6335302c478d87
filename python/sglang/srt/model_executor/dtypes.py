"""Which dtype the model and its KV cache run in.

``--dtype auto`` decides as SGLang and vLLM do: a checkpoint is served in half precision, a float32
one included (both engines downcast float32 checkpoints under ``auto``). On a CPU that is bfloat16
where the CPU computes it natively (AMX or AVX512-BF16), otherwise float32; float16 runs as
bfloat16 on a CPU. On a GPU a half-precision checkpoint keeps its dtype and a float32 one runs in
bfloat16 (float16 where the GPU lacks bfloat16). ``--dtype float32`` is the exact reference mode:
greedy output equals HF's token for token.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass, replace
from typing import Any

import torch

from sglang.srt.kernels import cpu_flags

logger = logging.getLogger(__name__)

DTYPE_NAMES = {
    "float32": torch.float32,
    "float": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "half": torch.float16,
}
KV_CACHE_DTYPES = {
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float32": torch.float32,
    "fp8_e4m3": torch.float8_e4m3fn,
    "fp8_e5m2": torch.float8_e5m2,
}


@functools.cache
def cpu_bfloat16_isa() -> str | None:
    """The CPU's native bfloat16 instructions: 'amx' (AMX tiles), 'avx512_bf16', or None."""
    flags = cpu_flags()
    if "amx_bf16" in flags and "amx_tile" in flags:
        return "amx"
    if "avx512_bf16" in flags:
        return "avx512_bf16"
    return None


def checkpoint_dtype(config: Any) -> torch.dtype | None:
    """The dtype a checkpoint declares, read as transformers reads it: ``dtype`` (older configs'
    ``torch_dtype`` arrives under the same name) on the top-level config, else on its text
    config."""
    for cfg in (config, config.get_text_config()):
        declared = getattr(cfg, "dtype", None)
        if isinstance(declared, str):
            declared = DTYPE_NAMES.get(declared)
        if isinstance(declared, torch.dtype):
            return declared
    return None


@dataclass(frozen=True)
class DtypeChoice:
    dtype: torch.dtype
    reason: str
    fell_back: bool = False  # a half-precision checkpoint runs in float32 (warned at start-up)
    # where set (bfloat16), linear and embedding weights are stored so and widened as they are
    # read; everything else, and every product, in ``dtype``
    # (``layers/quantization/bf16_weights.py``)
    weight_dtype: torch.dtype | None = None


def resolve_dtype(name: str, config: Any, device: str) -> DtypeChoice:
    """The compute dtype for ``--dtype name``, with the reason (logged at start-up)."""
    if name != "auto":
        if name not in DTYPE_NAMES:
            raise ValueError(f"unknown dtype {name!r}; choose auto or one of {sorted(DTYPE_NAMES)}")
        dtype = DTYPE_NAMES[name]
        if device == "cpu" and dtype == torch.float16:
            return DtypeChoice(torch.bfloat16, "float16 requested: a CPU runs it as bfloat16")
        return DtypeChoice(dtype, "requested")
    declared = checkpoint_dtype(config)
    declared_half = declared in (torch.bfloat16, torch.float16)
    said = f"checkpoint declares {_name(declared)}"
    if device != "cpu":
        if declared_half:
            return DtypeChoice(declared, said)
        half = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return DtypeChoice(half, f"{said}: served in half precision (--dtype float32 is exact)")
    isa = cpu_bfloat16_isa()
    if isa is None:
        if not declared_half:
            return DtypeChoice(torch.float32, f"{said}; this CPU has no native bfloat16")
        return DtypeChoice(
            torch.float32,
            f"{said} but this CPU has no native bfloat16 (neither AMX nor AVX512-BF16): running "
            "float32, twice the memory",
            fell_back=True,
        )
    if not declared_half:
        said += ", served in bfloat16 (--dtype float32 is exact)"
    return DtypeChoice(torch.bfloat16, f"{said}; CPU has {isa}")


def resolve_launch_dtypes(args: Any, config: Any) -> tuple[DtypeChoice, torch.dtype]:
    """The model and KV cache dtypes of a launch (``EngineConfig``): quantized weights
    (``--torchao-config``, or a checkpoint published quantized) run in bfloat16, whatever
    ``--dtype`` would pick, except under ``--dtype auto`` on a CPU without native bfloat16
    (AVX2 only, say), where torch's bfloat16 products run ~40x slower than its float32 ones: there
    the activations stay float32 (the quantized kernels take them; the weights stay quantized)."""
    from sglang.srt.layers.quantization.checkpoint_formats import quantization_config

    choice = resolve_dtype(args.dtype, config, args.resolved_device)
    quantized = args.torchao_config or quantization_config(config) is not None
    if quantized and choice.dtype != torch.bfloat16:
        no_bf16_cpu = args.resolved_device == "cpu" and cpu_bfloat16_isa() is None
        if no_bf16_cpu and args.dtype == "auto":
            reason = "quantized weights, float32 activations: this CPU has no native bfloat16"
            choice = DtypeChoice(torch.float32, reason)
        else:
            choice = DtypeChoice(torch.bfloat16, "quantized weights run in bfloat16")
    if not quantized:
        choice = _with_bf16_weights(choice, args, config)
    return choice, resolve_kv_cache_dtype(args.kv_cache_dtype, choice.dtype)


def _with_bf16_weights(choice: DtypeChoice, args: Any, config: Any) -> DtypeChoice:
    """``--cpu-bf16-weights``: auto stores a bfloat16 checkpoint's linear and embedding weights
    in bfloat16 where ``--dtype auto`` runs it in float32 for want of native bfloat16; on does so
    for any float32 launch on a CPU."""
    setting = getattr(args, "cpu_bf16_weights", "auto")
    float_cpu = args.resolved_device == "cpu" and choice.dtype == torch.float32
    if setting == "off" or not float_cpu:
        return choice
    if setting == "auto":
        no_bf16 = args.dtype == "auto" and cpu_bfloat16_isa() is None
        if not no_bf16 or checkpoint_dtype(config) != torch.bfloat16:
            return choice
        reason = (
            "checkpoint declares bfloat16 but this CPU has no native bfloat16 (neither AMX nor "
            "AVX512-BF16): computing in float32, linear and embedding weights kept in bfloat16"
        )
        return DtypeChoice(torch.float32, reason, weight_dtype=torch.bfloat16)
    reason = f"{choice.reason}; linear and embedding weights stored in bfloat16 (requested)"
    return replace(choice, reason=reason, weight_dtype=torch.bfloat16)


def resolve_kv_cache_dtype(name: str, model_dtype: torch.dtype) -> torch.dtype:
    """``--kv-cache-dtype``: auto follows the model; fp8 formats are stored in the pool and
    converted to the model dtype when attention reads them."""
    if name == "auto":
        return model_dtype
    if name not in KV_CACHE_DTYPES:
        raise ValueError(
            f"unknown kv cache dtype {name!r}; choose auto or one of {sorted(KV_CACHE_DTYPES)}"
        )
    return KV_CACHE_DTYPES[name]


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _name(dtype: torch.dtype | None) -> str:
    return dtype_name(dtype) if dtype is not None else "no dtype"
