"""Memory accounting: what the weights, KV pool, linear-attention state pool and embedding cache
take, how large the KV pool may be, and whether a model fits before its weights load.

Host memory (cgroup-aware) is read by ``host_memory``.

CPU KV budget (bytes for the KV pool plus, on hybrid models, the linear-attention state):

- ``--max-total-tokens N``: a pool of N tokens, whatever the memory;
- ``--mem-fraction-static F``: SGLang's meaning moved to host memory: F of the host total holds
  the static allocations (weights + KV pool + state pool); the pool gets what the loaded weights
  leave of it;
- neither: ``min(1 GiB, available after loading - embedding cache budget - runtime reserve)``,
  never below the minimum pool.

The minimum pool is ``--max-total-tokens`` tokens when given, else ``min(context length, 4096)``
tokens; the fit check before loading needs the weights (estimated from the checkpoint's
safetensors headers in the dtype and quantization the model will run in), that minimum pool, the
embedding cache budget and the runtime reserve to be available.
"""

from __future__ import annotations

import json
import logging
import struct
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import torch

from sglang.srt.layers import quantized_linear
from sglang.srt.layers.checkpoint_formats import (
    PrequantizedFormat,
    UnsupportedQuantizedCheckpoint,
    read_format,
)
from sglang.srt.mem_cache.kv_layout import KVLayout
from sglang.srt.model_executor.host_memory import (
    device_memory_available,
    host_memory_available,
    host_memory_total,
)
from sglang.srt.models import fast_vision

logger = logging.getLogger(__name__)

CPU_KV_BUDGET_BYTES = 1 << 30
MIN_KV_TOKENS = 4096
RUNTIME_RESERVE_BYTES = 512 << 20  # interpreter, torch, activations of a prefill chunk
GIB = 1 << 30

_SAFETENSORS_BYTES = {
    "F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
    "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1, "U16": 2, "U32": 4, "U64": 8,
}  # fmt: skip
_FLOAT_TYPES = {"F64", "F32", "F16", "BF16"}
_NOT_LM = ("visual", "vision", "vit.", "image", "mm_projector", "multi_modal", "norm")


class InsufficientMemoryError(RuntimeError):
    """The model cannot fit in the memory there is, with the settings asked for."""


# The heap while weights load ----------------------------------------------------------------


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
    if quant.head_bits == 4 and quantized_linear.int4_skip_reason(cols, group) is None:
        return rows * cols // 2 + 2 * rows * (cols // group) * 2  # bfloat16 scales and mins
    if quant.head_bits == 0:
        return rows * cols * elem
    return rows * cols + rows * 4  # int8 per output channel


def _published_bytes(name: str, numel: int, fmt: PrequantizedFormat) -> int | None:
    """A published checkpoint's format tensor as loaded (``layers/checkpoint_formats.py``), or
    None for an ordinary tensor (the codes keep their bytes as they are stored)."""
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
) -> int:
    """Bytes one checkpoint tensor takes once loaded in ``run_dtype`` (floating tensors) and,
    for the language model's linear weights, quantized as they are stored: int8 = 1 byte per
    element + a float32 scale per row; int4 = half a byte per element + a bfloat16 scale and
    min per group of ``group_size`` columns (weights whose width is not a multiple
    of the group and of 64 stay unquantized); an untied LM head (its own tensor) and then the
    token embeddings in int8, or a tied pair's one table in int8 unless the head stays dense
    (``quantize_head_and_embeddings``); with int4, the vision tower's
    linear weights in int8 (``quantize_vision_tower``; with int8dq and ``vision_int8dq`` too, plus
    int8dq's column sums), the patch embedding among them where ``patch_linear``."""
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
    if quantized_linear.int4_skip_reason(cols, group) is not None:
        return numel * elem
    return numel // 2 + 2 * rows * (cols // group) * 2  # bfloat16 scales and mins, any run dtype


def estimate_weight_bytes(
    model_path: str | Path,
    run_dtype: torch.dtype,
    quantization: str | None = None,
    lm_head_dtype: str = "int8",
    vision_int8dq: bool = False,
    published: PrequantizedFormat | None = None,
) -> int | None:
    """The weights' bytes once loaded in ``run_dtype`` with ``quantization`` (a torchao config
    name such as ``int8wo`` or ``int4wo-128``) or as a ``published`` quantized checkpoint, from
    the safetensors headers alone."""
    headers = safetensors_headers(model_path)
    if headers is None:
        return None
    quant = Quantization.parse(quantization, lm_head_dtype, vision_int8dq)
    untied_head = any(name.endswith("lm_head.weight") for name in headers)
    patch_linear = fast_vision.patch_embedding_is_linear(_model_type(model_path))
    return sum(
        tensor_bytes_as(name, dtype, shape, run_dtype, quant, untied_head, published, patch_linear)
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


# Fit check before loading ----------------------------------------------------------------------
def fmt_bytes(n: float) -> str:
    return f"{n / GIB:.2f} GiB" if abs(n) >= GIB else f"{n / 2**20:.1f} MiB"


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

    def plan(self, **changes: Any) -> FitPlan | None:
        inp = _replace(self, **changes)
        weights = estimate_weight_bytes(
            inp.model_path,
            inp.dtype,
            inp.quantization,
            inp.lm_head_dtype,
            inp.vision_int8dq,
            inp.published,
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
    return f"{name} + {inp.quantization}" if inp.quantization else name


def _candidates(inp: FitInputs) -> list[tuple[str, dict[str, Any]]]:
    """Cheaper settings to suggest, as (flags, changes to the inputs)."""
    out: list[tuple[str, dict[str, Any]]] = []
    half = torch.empty(0, dtype=inp.dtype).element_size() <= 2
    dtype_flag = "" if half else "--dtype bfloat16 "
    if not half:
        out.append(("--dtype bfloat16", {"dtype": torch.bfloat16, "quantization": None}))
    dtype = inp.dtype if half else torch.bfloat16
    current = Quantization.parse(inp.quantization)
    for spec in ("int8wo", "int4wo-128"):
        bits = Quantization.parse(spec).bits  # type: ignore[union-attr]
        if current is None or bits < current.bits:
            flags = f"{dtype_flag}--torchao-config {spec}"
            out.append((flags, {"dtype": dtype, "quantization": spec}))
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
    args: Any, model_path: str, config: Any, dtype: torch.dtype, kv_dtype: torch.dtype
) -> FitInputs:
    """The fit inputs of a launch from its ``EngineConfig`` and the dtypes it will run in."""
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
    return check_fits(fit_inputs(args, model_path, config, choice.dtype, kv_dtype))


# KV budget and the start-up report ---------------------------------------------------------------
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


@dataclass(frozen=True)
class MemoryReport:
    """What start-up allocated, in bytes (``/server_info``'s ``memory``)."""

    device: str
    dtype: str
    kv_dtype: str
    quantization: str | None
    weights_bytes: int
    weights_estimate_bytes: int | None
    lm_packed_copy_bytes: int  # in weights_bytes: packed copies for prompts (packed_linear)
    kv_pool_bytes: int
    kv_pool_tokens: int
    kv_bytes_per_token: int
    kv_budget_rule: str
    state_pool_bytes: int
    mm_embedding_cache_bytes: int
    host_total_bytes: int
    host_available_bytes: int

    @property
    def static_bytes(self) -> int:
        return self.weights_bytes + self.kv_pool_bytes + self.state_pool_bytes

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "static_bytes": self.static_bytes}

    def log(self) -> None:
        estimate = self.weights_estimate_bytes
        rows = [
            ("weights", self.weights_bytes, self._weights_note(estimate)),
            ("KV pool", self.kv_pool_bytes, self._kv_note()),
            ("linear-attention state", self.state_pool_bytes, ""),
            ("embedding cache", self.mm_embedding_cache_bytes, "budget, filled on demand"),
            ("static total", self.static_bytes, "weights + KV pool + state"),
        ]
        lines = [f"  {name:<24}{fmt_bytes(n):>12}  {note}".rstrip() for name, n, note in rows]
        head = (
            f"memory on {self.device}: host total {fmt_bytes(self.host_total_bytes)}, "
            f"{fmt_bytes(self.host_available_bytes)} available after start-up"
        )
        logger.info("%s\n%s", head, "\n".join(lines))

    def _weights_note(self, estimate: int | None) -> str:
        setting = self.dtype + (f" + {self.quantization}" if self.quantization else "")
        if self.lm_packed_copy_bytes:
            setting += f"; {fmt_bytes(self.lm_packed_copy_bytes)} of packed copies for prompts"
        if estimate is None:
            return setting
        return f"{setting}; estimated {fmt_bytes(estimate)} from the checkpoint"

    def _kv_note(self) -> str:
        return (
            f"{self.kv_pool_tokens} tokens x {self.kv_bytes_per_token} B, {self.kv_dtype} "
            f"(rule: {self.kv_budget_rule})"
        )


def runner_report(runner: Any, kv_bytes_per_token: int) -> MemoryReport:
    """The report of a ``ModelRunner`` whose pools are allocated."""
    args = runner.args
    state = runner.state_pool.nbytes if runner.state_pool is not None else 0
    host_total = host_memory_total()[0]
    return MemoryReport(
        device=runner.device,
        dtype=str(runner.dtype).removeprefix("torch."),
        kv_dtype=str(runner.kv_cache_dtype).removeprefix("torch."),
        quantization=args.torchao_config or None,
        weights_bytes=runner.weights_bytes,
        weights_estimate_bytes=runner.fit_plan.weights if runner.fit_plan else None,
        lm_packed_copy_bytes=runner.lm_packed_copy_bytes,
        kv_pool_bytes=runner.max_total_tokens * kv_bytes_per_token,
        kv_pool_tokens=runner.max_total_tokens,
        kv_bytes_per_token=kv_bytes_per_token,
        kv_budget_rule="max_total_tokens" if args.max_total_tokens else runner.kv_budget_rule,
        state_pool_bytes=state,
        mm_embedding_cache_bytes=args.mm_cache_bytes if runner.is_multimodal else 0,
        host_total_bytes=host_total,
        host_available_bytes=host_memory_available()[0],
    )
