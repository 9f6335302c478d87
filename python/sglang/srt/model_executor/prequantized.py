"""Checkpoints published quantized (``layers/quantization/checkpoint_formats.py``), loaded
straight into the native int4 / int8 layouts through transformers' ``from_pretrained``, with a
quantizer of this module in place of the format's own (which needs CUDA packages): before any
weight loads, each linear whose quantized tensors the checkpoint holds (its key names, renamed
as transformers renames them for the family) is replaced by what its format's method creates
(``FormatLoader.create_weights``: a ``CheckpointLinear`` with buffers of the format's names,
shapes and dtypes); transformers fills them like any weight; then each becomes a
``QuantizedLinear``. Nothing is dequantized on the way: the load peaks at about the
checkpoint's size. Everything the checkpoint stores unquantized (embeddings, head, vision tower,
norms) loads as usual, in bfloat16.
"""

from __future__ import annotations

import logging
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from torch import nn

from sglang.srt.layers.page_release import cast_releasing
from sglang.srt.layers.quantization.checkpoint_formats import (
    CheckpointLinear,
    FormatLoader,
    PrequantizedFormat,
    refuse,
)
from sglang.srt.model_executor.memory import safetensors_headers

logger = logging.getLogger(__name__)

QUANT_METHOD = "sglang-prequantized"  # the transformers quantizer registered here


def checkpoint_keys(model_path: str | Path) -> list[str]:
    """Every tensor name in the folder's safetensors files (headers only)."""
    return list(safetensors_headers(model_path) or {})


def _renamed_modules(model: nn.Module, prefixes: list[str]) -> dict[str, str]:
    """Checkpoint module names -> the model's, as transformers renames them for ``model`` (the
    family's mappings; the name of each module's ``weight`` is renamed, which the model has)."""
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import WeightConverter, WeightRenaming, rename_source_key

    transforms = get_model_conversion_mapping(model)
    renamings = [t for t in transforms if isinstance(t, WeightRenaming)]
    converters = [t for t in transforms if isinstance(t, WeightConverter)]
    state = model.state_dict()
    prefix = getattr(model, "base_model_prefix", None)
    out = {}
    for name in prefixes:
        key = name + ".weight"
        renamed, _ = rename_source_key(key, renamings, converters, prefix, state)
        renamed = key if renamed not in state and key in state else renamed
        out[name] = renamed.removesuffix(".weight")
    return out


def _quantizer_classes() -> None:
    """Register this module's config and quantizer with transformers (once)."""
    from transformers.quantizers.auto import (
        AUTO_QUANTIZATION_CONFIG_MAPPING,
        AUTO_QUANTIZER_MAPPING,
    )
    from transformers.quantizers.base import HfQuantizer
    from transformers.utils.quantization_config import QuantizationConfigMixin

    if QUANT_METHOD in AUTO_QUANTIZER_MAPPING:
        return

    class PrequantizedConfig(QuantizationConfigMixin):
        def __init__(
            self, format: dict, checkpoint: str, tower_only: bool = False, **_: Any
        ) -> None:
            self.quant_method = QUANT_METHOD
            self.format, self.checkpoint, self.tower_only = format, checkpoint, tower_only

        def to_dict(self) -> dict:
            return {
                "quant_method": QUANT_METHOD,
                "format": self.format,
                "checkpoint": self.checkpoint,
                "tower_only": self.tower_only,
            }

    class PrequantizedQuantizer(HfQuantizer):
        requires_calibration = True

        def _process_model_before_weight_loading(self, model: nn.Module, **_: Any) -> None:
            config = self.quantization_config
            fmt = PrequantizedFormat(**config.format)
            self.replaced = install_checkpoint_linears(
                model, fmt, config.checkpoint, config.tower_only
            )
            self.declared = {k: t.dtype for k, t in model.state_dict(keep_vars=True).items()}

        def get_new_dtype(self, converter: Any, param: Any, dtype: Any) -> None:
            return None  # loaded as stored, then cast tensor by tensor (cast_as_declared)

        def _process_model_after_weight_loading(self, model: nn.Module, **_: Any) -> None:
            convert_checkpoint_linears(model)
            cast_as_declared(model, self.declared)

        def is_serializable(self, safe_serialization: Any = None) -> bool:
            return False

        @property
        def is_trainable(self) -> bool:
            return False

    AUTO_QUANTIZATION_CONFIG_MAPPING[QUANT_METHOD] = PrequantizedConfig
    AUTO_QUANTIZER_MAPPING[QUANT_METHOD] = PrequantizedQuantizer


def install_checkpoint_linears(
    model: nn.Module, fmt: PrequantizedFormat, path: str, tower_only: bool = False
) -> int:
    """Swap every ``nn.Linear`` whose quantized tensors the checkpoint holds for a
    ``CheckpointLinear``; returns how many. A quantized tensor with no linear to take it (a
    fused or renamed layer) is refused, except in a ``tower_only`` model (an encoder-only
    worker's), which builds no decoder layers for the checkpoint's quantized ones."""
    keys = checkpoint_keys(path)
    suffix = "." + fmt.marker
    marked = [k for k in keys if k.endswith(suffix)]
    if fmt.layout == "ct-int8":  # weight_scale also marks the scheme's other tensors' layers
        stored = set(keys)
        marked = [k for k in marked if k.removesuffix(suffix) + ".weight" in stored]
    quantized = [k.removesuffix(suffix) for k in marked]
    with_g_idx = [k.removesuffix(".g_idx") for k in keys if k.endswith(".g_idx")]
    renamed = _renamed_modules(model, quantized + with_g_idx)  # one pass over the mappings
    targets = {renamed[k] for k in quantized}
    g_idx = {renamed[k] for k in with_g_idx}
    modules = dict(model.named_modules())
    if tower_only:
        targets = {t for t in targets if t in modules}
    missing = sorted(t for t in targets if not isinstance(modules.get(t), nn.Linear))
    if missing:
        raise refuse(
            fmt.method, f"quantized tensors with no linear layer to take them ({missing[0]})"
        )
    loader = FormatLoader(fmt)
    for name in targets:
        parent_name, _, child = name.rpartition(".")
        parent = modules[parent_name] if parent_name else model
        setattr(parent, child, loader.create_weights(modules[name], name in g_idx))
    logger.info("%s: %d linear layers load quantized", fmt.label, len(targets))
    return len(targets)


def convert_checkpoint_linears(model: nn.Module) -> int:
    """Each ``CheckpointLinear`` replaced by its ``QuantizedLinear`` (converted as its tensors
    arrived)."""
    count = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, CheckpointLinear):
                child._convert_when_loaded()
                if child.converted is None:
                    raise refuse(child.format.method, f"{name}: its tensors did not all load")
                setattr(parent, name, child.converted)
                count += 1
    return count


def cast_as_declared(model: nn.Module, declared: dict[str, torch.dtype]) -> int:
    """Give each floating tensor the dtype the model declared for it (the checkpoint's float16
    embeddings, head and tower to bfloat16), one at a time and a slice at a time, each slice's
    checkpoint pages released as soon as it is copied: the load never holds a second copy of
    more than one slice. Returns how many were cast."""
    count = 0
    for name, tensor in model.state_dict(keep_vars=True).items():
        want = declared.get(name)
        if want is None or not tensor.is_floating_point() or tensor.dtype == want:
            continue
        tensor.data = cast_releasing(tensor.data, want)
        count += 1
    return count


def prequantized_config(
    config: Any, fmt: PrequantizedFormat, model_path: str, tower_only: bool = False
) -> Any:
    """A copy of ``config`` whose quantization_config names this module's quantizer
    (``tower_only``: for a config whose language model has no layers)."""
    import copy

    _quantizer_classes()
    patched = copy.deepcopy(config)
    text = patched.get_text_config()
    if text is not patched and hasattr(text, "quantization_config"):
        del text.quantization_config
    patched.quantization_config = {
        "quant_method": QUANT_METHOD,
        "format": asdict(fmt),
        "checkpoint": str(model_path),
        "tower_only": tower_only,
    }
    return patched
