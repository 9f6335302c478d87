"""Quantization of the language model (SGLang's ``--torchao-config``: weight-only int8wo /
int4wo-<group>; int8dq, int8 activations times int8 weights; and 8da4w-<group>, int8
activations times int4 weights, torchao's Int8DynamicActivationInt4Weight) and the check on
``--quantization`` (checkpoints published quantized load through ``prequantized.py``).

On a CPU the linears become ``QuantizedLinear`` layers served by the int methods of
``layers/quantization/quantized_linear.py`` (the native kernel's own int8 / int4 layouts:
decode reads the quantized bytes only); on CUDA, torchao's tensor types
(for the language model's linears only).

What is quantized on a CPU, with the error each adds to HF's prompt logprobs, as a multiple of
HF's own bfloat16-vs-float32 difference (max over the prompt; six tiny random families):

- every ``nn.Linear`` of the language model (the adapter's ``language_model``), int8 per
  output channel or int4 per group, except int4 layers whose shapes the kernel cannot take
  (``int4_skip_reason``, which stay in bfloat16);
- an untied LM head, in int8 (0.28-0.63x; in int4 it would be 2.4-11x, so it stays int8 with
  int4 too), and then the token embedding table, in int8 per row (0.6-1.6x); a head tied to a
  plain ``nn.Embedding`` makes one int8 table that both read;
- with int4, the vision tower's and projector's linears, in int8 (0.55-1.25x): an image's rows
  run 1.00-1.08x the bfloat16 time there, and the 7B-shaped checkpoint drops to ~0.31 of its
  bfloat16 bytes (0.35 with the tower in bfloat16).

The model runs in bfloat16 when quantized (with float32 activations under ``--dtype auto`` on a
CPU without native bfloat16: ``dtypes.resolve_launch_dtypes``).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from typing import Any

from torch import nn
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from sglang.srt import kernels
from sglang.srt.layers import page_release
from sglang.srt.layers.quantization import packed_linear, quant_layouts, quantized_embedding
from sglang.srt.layers.quantization.base import serve_with
from sglang.srt.layers.quantization.quantized_linear import quantize, quantized_method
from sglang.srt.model_executor.host_memory import module_bytes

logger = logging.getLogger(__name__)

INT4_GROUP_SIZES = (32, 64, 128, 256)
SUPPORTED_TORCHAO = "int8wo, int8dq, int4wo-<group>, 8da4w-<group> (group 32, 64, 128 or 256)"
# SGLang's other --torchao-config values: recognised, so that the error says they exist.
SGLANG_ONLY_TORCHAO = re.compile(r"fp8wo|fp8dq-per_(tensor|row)|gemlite-[\w-]+")
# SGLang's --quantization methods (prequantized.METHODS and ALIASES are implemented here).
SGLANG_QUANTIZATION_METHODS = (
    "awq",
    "awq_marlin",
    "bitsandbytes",
    "compressed-tensors",
    "fp8",
    "gguf",
    "gptq",
    "gptq_marlin",
    "marlin",
    "modelopt",
    "modelopt_fp4",
    "moe_wna16",
    "mxfp4",
    "qoq",
    "w4afp8",
    "w8a8_fp8",
    "w8a8_int8",
)


@dataclass(frozen=True)
class TorchaoSpec:
    name: str  # "int8wo", "int8dq", "int4wo-<group>" or "8da4w-<group>"
    group_size: int | None = None  # int4 only
    dynamic: bool = False  # int8dq, 8da4w: activations quantized to int8 per row at run time


@dataclass
class QuantizationReport:
    config: str
    quantized_layers: int = 0
    skipped_layers: list[str] = field(default_factory=list)
    weight_bytes_before: int = 0  # language model, all its parameters
    weight_bytes_after: int = 0
    lm_head: str = "bfloat16"
    embeddings: str = "bfloat16"
    vision_layers: int = 0  # int8: with int4, or int8dq with --vision-int8dq
    vision_int8dq: bool = False
    activations: str = "bfloat16"  # the language model's quantized linears' inputs

    def as_dict(self) -> dict[str, Any]:
        return {
            "method": "torchao",
            "torchao_config": self.config,
            "quantized_layers": self.quantized_layers,
            "skipped_layers": len(self.skipped_layers),
            "language_model_weight_bytes_before": self.weight_bytes_before,
            "language_model_weight_bytes_after": self.weight_bytes_after,
            "lm_head": self.lm_head,
            "embeddings": self.embeddings,
            "vision_layers_int8": self.vision_layers,
            "vision_int8dq": self.vision_int8dq,
            "activations": self.activations,
        }


def parse_torchao_config(value: str) -> TorchaoSpec | None:
    """``""`` -> None; a supported value -> its spec; anything else -> ValueError naming the
    supported values."""
    if not value:
        return None
    if value in ("int8wo", "int8dq"):
        return TorchaoSpec(value, dynamic=value == "int8dq")
    match = re.fullmatch(r"(int4wo|8da4w)-(\d+)", value)
    if match and int(match[2]) in INT4_GROUP_SIZES:
        return TorchaoSpec(value, int(match[2]), dynamic=match[1] == "8da4w")
    known = "an SGLang value not implemented here" if SGLANG_ONLY_TORCHAO.fullmatch(value) else ""
    raise ValueError(
        f"--torchao-config {value!r} is {known or 'not a known value'}; "
        f"supported: {SUPPORTED_TORCHAO}"
    )


def dynamic_activations(torchao_config: str) -> bool:
    """Whether ``torchao_config`` (a valid value or "") asks for activations quantized at run
    time (int8dq, 8da4w-<group>)."""
    spec = parse_torchao_config(torchao_config)
    return spec is not None and spec.dynamic


def int8_activations(spec: TorchaoSpec, device: str = "cpu") -> bool:
    """Whether the language model's quantized linears take int8 activations: with int8dq and
    8da4w always; with int4wo on a CPU without AVX512-BF16 too. There the int4 weight-only
    kernel has no bfloat16 products and computes in float32 FMAs: a 7B-shaped decode step took
    186 ms on a Zen 3 (AVX2), where 8da4w took 98.9 and llama.cpp's Q4_0 116. So on such CPUs
    int4wo's weights (its own codes, scales and mins) are served as llama.cpp serves Q4_0, times
    int8 activations quantized per row (Q4_0 x Q8_0)."""
    if spec.dynamic:
        return True
    weight_only_int4 = spec.group_size is not None and device == "cpu"
    return weight_only_int4 and "avx512_bf16" not in kernels.cpu_flags()


def check_torchao_dtype(torchao_config: str, dtype: str) -> None:
    if torchao_config and dtype not in ("auto", "bfloat16"):
        raise ValueError(
            f"--torchao-config {torchao_config} runs the model in bfloat16 (torchao's int4 CPU "
            f"kernel is ~50x slower in float32); use --dtype bfloat16 or auto, not {dtype}"
        )


def check_quantization_flag(method: str | None) -> None:
    """``--quantization`` names the format of a checkpoint published quantized
    (``layers/quantization/checkpoint_formats.py``; checked against the checkpoint at load)."""
    from sglang.srt.layers.quantization.checkpoint_formats import ALIASES, METHODS

    if method is None or method in METHODS or method in ALIASES:
        return
    known = "an SGLang method" if method in SGLANG_QUANTIZATION_METHODS else "not a known method"
    raise ValueError(
        f"--quantization {method!r} is {known} not implemented here; supported: "
        f"{', '.join([*METHODS, *ALIASES])} (checkpoints published in those formats), or "
        f"--torchao-config ({SUPPORTED_TORCHAO}) on an unquantized checkpoint"
    )


LM_HEAD_DTYPES = ("int8", "int4", "bfloat16")


def check_lm_head_dtype(head_dtype: str, torchao_config: str) -> None:
    if head_dtype not in LM_HEAD_DTYPES:
        raise ValueError(f"cpu_lm_head_dtype must be one of {', '.join(LM_HEAD_DTYPES)}")
    spec = parse_torchao_config(torchao_config)
    if head_dtype == "int4" and (spec is None or spec.group_size is None):
        raise ValueError(
            "--cpu-lm-head-dtype int4 needs --torchao-config int4wo-<group> or 8da4w-<group>"
        )


def int4_skip_reason(layer: nn.Linear, group_size: int, device: str) -> str | None:
    if device == "cpu":
        return quant_layouts.int4_skip_reason(layer.in_features, group_size)
    if layer.in_features % group_size:
        return f"in_features {layer.in_features} is not a multiple of the group size {group_size}"
    return None


def apply_torchao_config(
    language_model: nn.Module, torchao_config: str
) -> QuantizationReport | None:
    """Quantize the language model's linear layers in place; None when no config is set."""
    if not torchao_config:
        return None
    device = next(language_model.parameters()).device.type
    spec = parse_torchao_config(torchao_config)
    assert spec is not None
    report = QuantizationReport(torchao_config, weight_bytes_before=module_bytes(language_model))
    targets = set(_target_layers(language_model, spec, device, report))
    dynamic = int8_activations(spec, device)
    if device == "cpu":  # the native kernel's layouts (layers/quantization/quantized_linear.py)
        bits = 8 if spec.group_size is None else 4
        if dynamic and not spec.dynamic:
            logger.info(
                "torchao %s: this CPU has no AVX512-BF16, so the int4 weights take int8 "
                "activations (as llama.cpp's Q4_0 x Q8_0), faster there than weight-only",
                spec.name,
            )
        serve_with(language_model, targets, quantized_method(bits, spec.group_size, dynamic))
    else:
        quantize_, ao_config = _torchao(spec, device)
        quantize_(language_model, ao_config, filter_fn=lambda module, _fqn: module in targets)
    report.activations = "int8" if dynamic else "bfloat16"
    report.quantized_layers = len(targets)
    report.weight_bytes_after = module_bytes(language_model)
    logger.info(
        "torchao %s: %d linear layers of the language model quantized, %d skipped; "
        "language-model weights %.1f MB -> %.1f MB",
        torchao_config,
        report.quantized_layers,
        len(report.skipped_layers),
        report.weight_bytes_before / 2**20,
        report.weight_bytes_after / 2**20,
    )
    return report


def quantize_head_and_embeddings(
    model: nn.Module,
    language_model: nn.Module,
    report: QuantizationReport,
    head_dtype: str = "int8",
) -> None:
    """On a CPU, the LM head in int8 (per output channel; ``head_dtype``: int4 in the groups of
    the int4 config, or bfloat16): a decode step reads it whole, and on a 7B-shaped model it is
    as many bytes as seven int4 decoder layers; and the token embedding table in int8 per row (a
    lookup reads a row; on a 7B-shaped model the table is 1.1 GB in bfloat16).

    A head tied to the token embeddings (the 2B / 3B models: there the head is the largest
    matrix a decode step reads) becomes one int8 table for both where the embedding is a plain
    ``nn.Embedding``: per output channel of the head is per row of the table, so the head's
    codes are the ones ``quantize_embedding`` would give, and lookups gather them from its
    panels. It stays int8 with ``head_dtype`` int4 (a lookup would unpack whole groups), and
    the pair stays as it is with bfloat16 or a subclassed embedding (Gemma's scaled one).

    With int8dq and 8da4w the head (int8, or int4 in 8da4w's groups) takes int8 activations
    too, as the decoder's linears do (and as llama.cpp's Q8_0 / Q4_0 heads do): on a CPU
    without VNNI its integer product reads the codes at the copy bandwidth, the float one at
    about half of it."""
    head, embed = model.get_output_embeddings(), model.get_input_embeddings()
    spec = parse_torchao_config(report.config)
    assert spec is not None
    dynamic = report.activations == "int8"  # as the decoder's linears
    usable = isinstance(head, nn.Linear) and head.weight.device.type == "cpu"
    tied = embed is not None and getattr(head, "weight", None) is getattr(embed, "weight", None)
    quantize_head = usable and head_dtype != "bfloat16"
    if tied:
        if quantize_head and packed_linear.lookups_can_move_to(embed, head):
            shared = quantize(head, 8, None, dynamic)
            model.set_output_embeddings(shared)
            quantized_embedding.serve_lookups_from_head(embed, shared)
            report.lm_head, report.embeddings = "int8", "int8 (the head's)"
    else:
        if quantize_head:
            group = spec.group_size
            if head_dtype == "int4" and group and not int4_skip_reason(head, group, "cpu"):
                model.set_output_embeddings(quantize(head, 4, group, dynamic))
                report.lm_head = f"int4-{group}"
            else:
                model.set_output_embeddings(quantize(head, 8, None, dynamic))
                report.lm_head = "int8"
        if embed is not None and quantized_embedding.quantize_embedding(embed):
            report.embeddings = "int8"
    report.weight_bytes_after = module_bytes(language_model)


def quantize_vision_tower(
    model: nn.Module, language_model: nn.Module, report: QuantizationReport, int8dq: bool = False
) -> None:
    """On a CPU, every plain ``nn.Linear`` outside the language model and its head (the vision
    tower and projector):

    - with int4 (``int4wo-<group>``, ``8da4w-<group>``), in int8 per output channel: an
      image's rows run on the
      same GEMM tile over the codes converted once per panel, at 1.00-1.08x the bfloat16 time
      on the 7B tower's shapes, and the whole int4 checkpoint drops to 0.32 of its bfloat16
      bytes (measured on the 7B shape);
    - with ``int8dq`` or ``8da4w`` (the language model's) and ``int8dq`` here
      (``--vision-int8dq``), int8dq: int8 activations times int8 weights;
    - otherwise (int8wo, int8dq alone) the tower stays bfloat16."""
    spec = parse_torchao_config(report.config)
    dynamic = spec is not None and spec.dynamic and int8dq
    if spec is None or (spec.group_size is None and not dynamic):
        return
    in_lm = {id(m) for m in language_model.modules()}
    head = model.get_output_embeddings()
    tower = {
        m
        for m in model.modules()
        if type(m) is nn.Linear
        and id(m) not in in_lm
        and m is not head
        and m.weight.device.type == "cpu"
    }
    # Towers' code reads a linear's weight dtype and device (Gemma 4's patch embedder casts its
    # input to them): the layers keep a one-element stand-in of the weight's shape.
    method = quantized_method(8, None, dynamic, stand_in=True)
    report.vision_layers = serve_with(model, tower, method)
    report.vision_int8dq = dynamic


def copy_out_of_checkpoint(model: nn.Module) -> int:
    """Give the model's dense tensors memory of their own; returns the bytes copied.

    A checkpoint loads memory-mapped, so its dense tensors are views of the safetensors files.
    After quantization the embeddings, LM head and vision tower still are, which keeps every
    file mapped: the bfloat16 pages the quantizer read stay resident and counted in the
    process (on a 7B model 13-15 GB of reclaimable file pages on top of the real footprint).
    Copying the dense tensors lets the mappings go. The same holds in bfloat16 once the big
    matrices are packed (``packed_linear``): what is left on the mappings is small. A tensor
    on a mapping is copied a slice at a time, each slice's pages released once copied. Weights
    whose storage a packed layout released (an expanded scalar) are left as they are, and so
    are tensors that own memory already (cast at load, or made by a quantizer): a copy would
    only double them for a moment (1 GiB for a 7B's embeddings)."""
    copied = 0
    for tensor in [*model.parameters(), *model.buffers()]:
        if is_traceable_wrapper_subclass(tensor) or tensor.device.type != "cpu":
            continue
        size = tensor.numel() * tensor.element_size()
        storage = tensor.untyped_storage().nbytes()
        if storage < size:  # released by packed_linear
            continue
        if page_release.on_checkpoint_mapping(tensor):
            tensor.data = page_release.cast_releasing(tensor.data, tensor.dtype)
        elif storage > size:  # a view that keeps a larger block alive
            tensor.data = tensor.data.clone()
        else:
            continue
        copied += size
    return copied


def _target_layers(
    language_model: nn.Module, spec: TorchaoSpec, device: str, report: QuantizationReport
) -> list[nn.Linear]:
    targets = []
    skipped: dict[str, list[str]] = {}  # reason -> layer names
    for name, module in language_model.named_modules():
        if not isinstance(module, nn.Linear):
            continue
        reason = (
            None if spec.group_size is None else int4_skip_reason(module, spec.group_size, device)
        )
        if reason is None:
            targets.append(module)
        else:
            skipped.setdefault(reason, []).append(name)
            report.skipped_layers.append(name)
    for reason, names in skipped.items():
        logger.info(
            "torchao %s: %d layers stay unquantized (%s), e.g. %s",
            spec.name,
            len(names),
            reason,
            names[0],
        )
    return targets


def _torchao(spec: TorchaoSpec, device: str) -> tuple[Any, Any]:
    """torchao's ``quantize_`` and the config for ``spec`` (torchao is imported here only)."""
    from torchao.quantization import Int4WeightOnlyConfig, Int8WeightOnlyConfig, quantize_

    if spec.dynamic and spec.group_size is not None:  # 8da4w
        import torch
        from torchao.quantization import Int8DynamicActivationIntxWeightConfig, PerGroup

        return quantize_, Int8DynamicActivationIntxWeightConfig(
            weight_dtype=torch.int4, weight_granularity=PerGroup(spec.group_size)
        )
    if spec.dynamic:
        from torchao.quantization import Int8DynamicActivationInt8WeightConfig

        return quantize_, Int8DynamicActivationInt8WeightConfig(set_inductor_config=False)
    if spec.group_size is None:
        return quantize_, Int8WeightOnlyConfig(set_inductor_config=False)
    if device == "cpu":
        # torchao 0.18 keeps its CPU int4 layout (Int4OpaqueTensor, which calls
        # ``_weight_int4pack_mm_for_cpu``) in the prototype namespace; the stable config's
        # formats are for CUDA (tile_packed_to_4d), XPU/NPU (plain_int32) or need mslk.
        from torchao.prototype.quantization.int4 import PrototypeInt4WeightOnlyConfig

        return quantize_, PrototypeInt4WeightOnlyConfig(
            group_size=spec.group_size, set_inductor_config=False
        )
    return quantize_, Int4WeightOnlyConfig(
        group_size=spec.group_size,
        int4_packing_format="tile_packed_to_4d",
        set_inductor_config=False,
    )
