"""Whether a launch fits before its weights load (and, when it does not, the settings that would),
and how large the CPU KV pool may be once they have (the rules in the package docstring)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, fields
from typing import Any

import torch

from sglang.srt.layers.quantization.checkpoint_formats import (
    PrequantizedFormat,
    UnsupportedQuantizedCheckpoint,
    read_format,
)
from sglang.srt.model_executor.host_memory import (
    device_memory_available,
    host_memory_available,
    host_memory_total,
)
from sglang.srt.model_executor.memory.estimate import (
    Quantization,
    estimate_weight_bytes,
    fmt_bytes,
    kv_bytes_per_token,
    min_kv_tokens,
)

logger = logging.getLogger(__name__)


CPU_KV_BUDGET_BYTES = 1 << 30


RUNTIME_RESERVE_BYTES = 512 << 20  # interpreter, torch, activations of a prefill chunk


class InsufficientMemoryError(RuntimeError):
    """The model cannot fit in the memory there is, with the settings asked for."""


@dataclass(frozen=True)
class FitPlan:
    """Bytes a launch needs: weights, the minimum KV pool, the embedding cache budget and the
    runtime reserve."""

    weights: int
    kv: int
    kv_tokens: int
    mm_cache: int
    reserve: int = RUNTIME_RESERVE_BYTES

    @property
    def total(self) -> int:
        return self.weights + self.kv + self.mm_cache + self.reserve

    def describe(self) -> str:
        return (
            f"{fmt_bytes(self.total)} (weights {fmt_bytes(self.weights)} + KV pool "
            f"{fmt_bytes(self.kv)} for {self.kv_tokens} tokens + embedding cache "
            f"{fmt_bytes(self.mm_cache)} + runtime reserve {fmt_bytes(self.reserve)})"
        )


@dataclass(frozen=True)
class FitInputs:
    """What the fit check needs to know about a launch (all before any weight loads)."""

    model_path: str
    text_config: Any
    dtype: torch.dtype
    quantization: str | None
    context_length: int
    kv_dtype: torch.dtype | None  # None: the model dtype (--kv-cache-dtype auto)
    max_total_tokens: int | None
    mm_cache_bytes: int
    device: str = "cpu"
    mem_fraction_static: float | None = None
    lm_head_dtype: str = "int8"  # --cpu-lm-head-dtype
    vision_int8dq: bool = False  # --vision-int8dq
    published: PrequantizedFormat | None = None  # a checkpoint published quantized
    weight_dtype: torch.dtype | None = None  # linear and embedding weights (--cpu-bf16-weights)

    def plan(self, **changes: Any) -> FitPlan | None:
        inp = _replace(self, **changes)
        weights = estimate_weight_bytes(
            inp.model_path,
            inp.dtype,
            inp.quantization,
            inp.lm_head_dtype,
            inp.vision_int8dq,
            inp.published,
            inp.weight_dtype,
        )
        if weights is None:
            return None
        tokens = min_kv_tokens(inp.max_total_tokens, inp.context_length)
        kv = tokens * kv_bytes_per_token(inp.text_config, inp.kv_dtype or inp.dtype)
        return FitPlan(weights, kv, tokens, inp.mm_cache_bytes)


def _replace(inp: FitInputs, **changes: Any) -> FitInputs:
    return FitInputs(**{**{f.name: getattr(inp, f.name) for f in fields(inp)}, **changes})


def _setting_name(inp: FitInputs) -> str:
    name = str(inp.dtype).removeprefix("torch.")
    if inp.weight_dtype is not None:
        name += f" on {str(inp.weight_dtype).removeprefix('torch.')} weights"
    return f"{name} + {inp.quantization}" if inp.quantization else name


def _candidates(inp: FitInputs) -> list[tuple[str, dict[str, Any]]]:
    """Cheaper settings to suggest, as (flags, changes to the inputs)."""
    out: list[tuple[str, dict[str, Any]]] = []
    half = torch.empty(0, dtype=inp.dtype).element_size() <= 2
    dtype_flag = "" if half else "--dtype bfloat16 "
    plain = {"quantization": None, "weight_dtype": None}
    if not half and inp.device == "cpu" and inp.weight_dtype is None and not inp.quantization:
        out.append(("--cpu-bf16-weights on", {**plain, "weight_dtype": torch.bfloat16}))
    if not half:
        out.append(("--dtype bfloat16", {**plain, "dtype": torch.bfloat16}))
    dtype = inp.dtype if half else torch.bfloat16
    current = Quantization.parse(inp.quantization)
    for spec in ("int8wo", "int4wo-128"):
        bits = Quantization.parse(spec).bits  # type: ignore[union-attr]
        if current is None or bits < current.bits:
            flags = f"{dtype_flag}--torchao-config {spec}"
            out.append((flags, {**plain, "dtype": dtype, "quantization": spec}))
    return out


def _kv_suggestion(inp: FitInputs, plan: FitPlan, available: int) -> str | None:
    """``--max-total-tokens N`` when the weights fit but the minimum KV pool does not."""
    per_token = kv_bytes_per_token(inp.text_config, inp.kv_dtype or inp.dtype)
    tokens = (available - plan.weights - plan.mm_cache - plan.reserve) // per_token
    if tokens < 256:
        return None
    flags = f"--max-total-tokens {tokens}"
    return flags + (f" --context-length {tokens}" if tokens < inp.context_length else "")


def refusal(inp: FitInputs, plan: FitPlan, available: int, source: str) -> str:
    fits = []
    kv = _kv_suggestion(inp, plan, available)
    if kv:
        fits.append(kv)
    for flags, changes in _candidates(inp):
        other = inp.plan(**changes)
        if other is not None and other.total <= available:
            fits.append(f"{flags} (needs {fmt_bytes(other.total)})")
    hint = "; ".join(fits) if fits else "none of --dtype bfloat16 / quantization fits either"
    return (
        f"not enough memory to serve {inp.model_path} in {_setting_name(inp)}: it needs "
        f"{plan.describe()}, and {fmt_bytes(available)} is available ({source}). "
        f"Settings that fit: {hint}."
    )


def _fraction_refusal(inp: FitInputs, plan: FitPlan) -> str | None:
    if inp.mem_fraction_static is None or inp.device != "cpu":
        return None
    total, source = host_memory_total()
    static = inp.mem_fraction_static * total
    if plan.weights + plan.kv <= static:
        return None
    return (
        f"--mem-fraction-static {inp.mem_fraction_static} of {fmt_bytes(total)} ({source}) is "
        f"{fmt_bytes(static)}, less than the weights ({fmt_bytes(plan.weights)}, "
        f"{_setting_name(inp)}) plus the minimum KV pool ({fmt_bytes(plan.kv)} for "
        f"{plan.kv_tokens} tokens): raise it or choose a smaller setting"
    )


def check_fits(inp: FitInputs) -> FitPlan | None:
    """Raise ``InsufficientMemoryError`` when the launch cannot fit; return its plan (None when
    the checkpoint has no safetensors to estimate from)."""
    plan = inp.plan()
    if plan is None:
        logger.info("no safetensors in %s: memory fit not checked", inp.model_path)
        return None
    available, source = device_memory_available(inp.device)
    if plan.total > available:
        raise InsufficientMemoryError(refusal(inp, plan, available, source))
    message = _fraction_refusal(inp, plan)
    if message:
        raise InsufficientMemoryError(message)
    return plan


def fit_inputs(
    args: Any,
    model_path: str,
    config: Any,
    dtype: torch.dtype,
    kv_dtype: torch.dtype,
    weight_dtype: torch.dtype | None = None,
) -> FitInputs:
    """The fit inputs of a launch from its ``EngineConfig`` and the dtypes it will run in
    (``weight_dtype``: the linear and embedding weights', where it is not ``dtype``)."""
    text_config = config.get_text_config()
    return FitInputs(
        model_path=model_path,
        text_config=text_config,
        dtype=dtype,
        quantization=args.torchao_config or None,
        context_length=args.context_length or text_config.max_position_embeddings,
        kv_dtype=None if args.kv_cache_dtype == "auto" else kv_dtype,
        max_total_tokens=args.max_total_tokens,
        mm_cache_bytes=args.mm_cache_bytes if hasattr(config, "vision_config") else 0,
        device=args.resolved_device,
        mem_fraction_static=args.mem_fraction_static,
        lm_head_dtype=args.cpu_lm_head_dtype,
        vision_int8dq=args.vision_int8dq,
        published=_published_format(config),
        weight_dtype=weight_dtype,
    )


def _published_format(config: Any) -> PrequantizedFormat | None:
    try:
        return read_format(config)
    except UnsupportedQuantizedCheckpoint:
        return None  # refused with its reason where the model is checked


def check_launch(args: Any, model_path: str) -> FitPlan | None:
    """``check_fits`` for a server launch, from the model's config alone."""
    from transformers import AutoConfig

    from sglang.srt.model_executor.dtypes import resolve_launch_dtypes

    config = AutoConfig.from_pretrained(model_path, trust_remote_code=args.trust_remote_code)
    choice, kv_dtype = resolve_launch_dtypes(args, config)
    inputs = fit_inputs(args, model_path, config, choice.dtype, kv_dtype, choice.weight_dtype)
    return check_fits(inputs)


def cpu_kv_budget(
    mem_fraction: float | None, weights: int, reserve: int, floor: int
) -> tuple[int, str]:
    """Bytes for the KV pool (and linear-attention state) on CPU, and the rule that set them
    (see the module docstring)."""
    if mem_fraction is not None:
        total, source = host_memory_total()
        budget = int(mem_fraction * total) - weights
        if budget < floor:
            raise InsufficientMemoryError(
                f"--mem-fraction-static {mem_fraction} of {fmt_bytes(total)} ({source}) leaves "
                f"{fmt_bytes(budget)} after {fmt_bytes(weights)} of weights; the KV pool needs "
                f"at least {fmt_bytes(floor)}"
            )
        available = host_memory_available()[0]
        if budget > available - reserve:
            logger.warning(
                "--mem-fraction-static gives the KV pool %s but only %s is available",
                fmt_bytes(budget),
                fmt_bytes(available),
            )
        return budget, "mem_fraction_static"
    available = host_memory_available()[0] - reserve
    return max(min(CPU_KV_BUDGET_BYTES, available), floor), "default"
