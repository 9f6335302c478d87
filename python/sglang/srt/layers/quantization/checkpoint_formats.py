"""The formats quantized checkpoints are published in, as far as the engine loads them: AWQ
(int4, GEMM packing, zero points), GPTQ (int4, ``desc_act`` false, v1 or v2 zero points) and
compressed-tensors (W4A16 ``pack-quantized``, symmetric, per group or channel; W8A16 and W8A8
``int-quantized``, per channel, W8A8 with dynamic per-token int8 activations, which is int8dq).

``read_format`` reads config.json's ``quantization_config`` (refusing what is not supported,
with the reason). Each format is a linear method that loads into a native layout
(``FormatLoader``): its ``create_weights`` gives a ``CheckpointLinear`` holding one linear's
tensors as the format stores them, its ``process_weights_after_loading`` converts them into
the layout's ``QuantizedLinear`` without dequantizing: int4's ``W = scale (q - zero)`` becomes
the layout's ``scale q + min`` with float32 scale and ``min = -scale zero`` (float16 scales and
4-bit zeros multiply exactly in float32); the layout's method serves it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from sglang.srt.layers.page_release import release_file_pages
from sglang.srt.layers.quantization.base import LinearMethod, stand_in
from sglang.srt.layers.quantization.quantized_linear import (
    Int4WeightOnly,
    Int8Dynamic,
    Int8WeightOnly,
    QuantizedLinear,
)

METHODS = ("awq", "gptq", "compressed-tensors")
# SGLang's --quantization names for the same formats.
ALIASES = {"awq_marlin": "awq", "gptq_marlin": "gptq", "w8a8_int8": "compressed-tensors"}
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # AWQ's GEMM packing: nibble i holds column AWQ_ORDER[i]


class UnsupportedQuantizedCheckpoint(ValueError):
    """A quantized checkpoint this engine cannot load; the message is one line for the user."""


@dataclass(frozen=True)
class PrequantizedFormat:
    method: str  # "awq", "gptq" or "compressed-tensors"
    layout: str  # "awq", "gptq", "ct-pack" (int4 in int32 words) or "ct-int8"
    bits: int
    group: int | None  # inputs per scale; None: one per output channel
    gptq_zero_offset: int = 0  # GPTQ v1 stores each zero point less one
    dynamic: bool = False  # W8A8: int8 activations per token

    @property
    def label(self) -> str:
        group = f"-g{self.group}" if self.group else ""
        kind = "w8a8" if self.dynamic else f"int{self.bits}"
        return f"{self.method} {kind}{group}"

    @property
    def marker(self) -> str:
        """The tensor name that marks a quantized linear in the checkpoint."""
        return {"awq": "qweight", "gptq": "qweight", "ct-pack": "weight_packed"}.get(
            self.layout, "weight_scale"
        )


def refuse(method: str, reason: str) -> UnsupportedQuantizedCheckpoint:
    return UnsupportedQuantizedCheckpoint(
        f"cannot load this {method} checkpoint: {reason}; supported: AWQ int4 (GEMM, zero "
        "points), GPTQ int4 (desc_act false), compressed-tensors W4A16 pack-quantized "
        "(symmetric), W8A16 / W8A8 int-quantized (per channel; W8A8 dynamic per token)"
    )


def quantization_config(config: Any) -> dict | None:
    """The checkpoint's ``quantization_config`` as a dict (top level or the text config's)."""
    for holder in (config, config.get_text_config()):
        quant = getattr(holder, "quantization_config", None)
        if quant is not None:
            return quant if isinstance(quant, dict) else quant.to_dict()
    return None


def read_format(config: Any) -> PrequantizedFormat | None:
    """The checkpoint's quantized format, None for an unquantized checkpoint; a format or
    option not supported raises ``UnsupportedQuantizedCheckpoint``."""
    quant = quantization_config(config)
    if quant is None:
        return None
    method = str(quant.get("quant_method") or "unknown")
    if method == "awq":
        return _awq(quant)
    if method == "gptq":
        return _gptq(quant)
    if method == "compressed-tensors":
        return _compressed_tensors(quant)
    raise refuse(method, "its quant_method is not one this engine loads")


def _group(method: str, value: Any) -> int | None:
    group = int(value if value is not None else -1)
    if group == -1:
        return None
    if group <= 0 or group % 2:
        raise refuse(method, f"group size {group}")
    return group


def _awq(quant: dict) -> PrequantizedFormat:
    bits = quant.get("bits", quant.get("w_bit"))
    if bits != 4:
        raise refuse("awq", f"{bits}-bit weights")
    version = str(quant.get("version") or "gemm").lower()
    if version != "gemm":
        raise refuse("awq", f"version {version!r} packs weights differently from GEMM's")
    if not quant.get("zero_point", True):
        raise refuse("awq", "zero_point false")
    return PrequantizedFormat("awq", "awq", 4, _group("awq", quant.get("group_size", 128)))


def _gptq(quant: dict) -> PrequantizedFormat:
    if quant.get("bits") != 4:
        raise refuse("gptq", f"{quant.get('bits')}-bit weights")
    if quant.get("desc_act"):
        raise refuse("gptq", "desc_act true (act-order reorders the inputs of each group)")
    version = str(quant.get("checkpoint_format") or quant.get("format") or "gptq")
    if version not in ("gptq", "gptq_v2"):
        raise refuse("gptq", f"checkpoint_format {version!r}")
    offset = 1 if version == "gptq" else 0
    group = _group("gptq", quant.get("group_size"))
    return PrequantizedFormat("gptq", "gptq", 4, group, gptq_zero_offset=offset)


def _compressed_tensors(quant: dict) -> PrequantizedFormat:
    method = "compressed-tensors"
    groups = quant.get("config_groups") or {}
    if len(groups) != 1:
        raise refuse(method, f"{len(groups)} quantization schemes (config_groups)")
    (scheme,) = groups.values()
    weights, inputs = scheme.get("weights") or {}, scheme.get("input_activations")
    fmt = scheme.get("format") or quant.get("format")
    if "Linear" not in (scheme.get("targets") or []):
        raise refuse(method, "its scheme does not target Linear layers")
    if weights.get("type") != "int" or not weights.get("symmetric", True):
        kind = "asymmetric" if weights.get("type") == "int" else weights.get("type")
        raise refuse(method, f"{kind} weights")
    strategy, bits = weights.get("strategy"), weights.get("num_bits")
    if strategy not in ("group", "channel"):
        raise refuse(method, f"weight strategy {strategy!r}")
    group = _group(method, weights.get("group_size")) if strategy == "group" else None
    dynamic = inputs is not None
    if dynamic and not (
        inputs.get("type") == "int"
        and inputs.get("num_bits") == 8
        and inputs.get("dynamic") is True
        and inputs.get("strategy") == "token"
        and inputs.get("symmetric", True)
    ):
        raise refuse(method, "activations other than dynamic symmetric int8 per token")
    if fmt == "pack-quantized" and bits == 4 and not dynamic:
        return PrequantizedFormat(method, "ct-pack", 4, group)
    if fmt == "int-quantized" and bits == 8 and group is None:
        return PrequantizedFormat(method, "ct-int8", 8, None, dynamic=dynamic)
    raise refuse(method, f"format {fmt!r} with {bits}-bit {strategy} weights")


def check_method_flag(flag: str | None, fmt: PrequantizedFormat | None) -> None:
    """``--quantization``: unset, or the checkpoint's own method (SGLang's aliases too)."""
    if flag is None:
        return
    method = ALIASES.get(flag, flag)
    if fmt is None:
        raise UnsupportedQuantizedCheckpoint(
            f"--quantization {flag}: the checkpoint is not quantized (config.json has no "
            "quantization_config); to quantize at start-up use --torchao-config"
        )
    if method != fmt.method:
        raise UnsupportedQuantizedCheckpoint(
            f"--quantization {flag}: the checkpoint is quantized with {fmt.method}"
        )


class FormatLoader(LinearMethod):
    """A published format as a loader into a native layout: ct-int8 into int8 (``Int8Dynamic``
    for W8A8), the int4 formats into ``Int4WeightOnly`` with the format's group (one per row
    for per-channel scales)."""

    def __init__(self, fmt: PrequantizedFormat) -> None:
        self.format = fmt

    def create_weights(self, layer: nn.Linear, has_g_idx: bool = False) -> CheckpointLinear:
        """Buffers of the format's names, shapes and dtypes (on the meta device, for the
        loader to fill) in place of ``layer``."""
        fmt, out, cols = self.format, layer.out_features, layer.in_features
        if fmt.layout != "ct-int8" and (out % 8 or cols % 8):
            raise refuse(fmt.method, f"a {cols} x {out} linear (not whole 32-bit words)")
        group = fmt.group or cols
        if cols % group:
            raise refuse(fmt.method, f"in_features {cols} not a multiple of the group {group}")
        buffers = _format_tensors(fmt.layout, out, cols, cols // group)
        if fmt.layout == "gptq" and has_g_idx:
            buffers["g_idx"] = torch.empty(cols, dtype=torch.int32, device="meta")
        return CheckpointLinear(layer, self, buffers)

    def process_weights_after_loading(self, layer: nn.Module) -> QuantizedLinear:
        fmt = self.format
        bias = None if layer.bias is None else layer.bias.detach().to(torch.bfloat16)
        if fmt.layout == "ct-int8":
            scale = layer.weight_scale.float().reshape(layer.out_features)
            method = Int8Dynamic() if fmt.dynamic else Int8WeightOnly()
            return method.from_codes(layer.weight, scale, bias)
        codes, scale, zero = layer.codes_scales_zeros()
        method = Int4WeightOnly(fmt.group or layer.in_features)
        return method.from_codes(codes, scale, bias, -scale * zero)

    def apply(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("a checkpoint's linear serves once converted to its layout")

    def name(self, layer: nn.Module) -> str:
        return self.format.label


def _format_tensors(layout: str, out: int, cols: int, groups: int) -> dict[str, torch.Tensor]:
    meta = {"device": "meta"}
    # float32, stated: the model is built under its own default dtype
    scales = {"device": "meta", "dtype": torch.float32}
    if layout == "awq":
        return {
            "qweight": torch.empty(cols, out // 8, dtype=torch.int32, **meta),
            "qzeros": torch.empty(groups, out // 8, dtype=torch.int32, **meta),
            "scales": torch.empty(groups, out, **scales),
        }
    if layout == "gptq":
        return {
            "qweight": torch.empty(cols // 8, out, dtype=torch.int32, **meta),
            "qzeros": torch.empty(groups, out // 8, dtype=torch.int32, **meta),
            "scales": torch.empty(groups, out, **scales),
        }
    if layout == "ct-pack":
        return {
            "weight_packed": torch.empty(out, cols // 8, dtype=torch.int32, **meta),
            "weight_scale": torch.empty(out, groups, **scales),
            "weight_shape": torch.empty(2, dtype=torch.int64, **meta),
        }
    return {  # ct-int8
        "weight": torch.empty(out, cols, dtype=torch.int8, **meta),
        "weight_scale": torch.empty(out, 1, **scales),
    }


class CheckpointLinear(nn.Module):
    """A linear's tensors as the format stores them, filled by transformers' loader. Once the
    last of them (and the bias) arrives, the layer converts itself (``converted``, a
    ``QuantizedLinear`` kept outside the module tree, which the loader's bookkeeping never
    sees) and lets go of the format's tensors: their checkpoint pages leave the process's
    resident set at once instead of when the loader unmaps the file, so the load peaks at about
    the quantized size."""

    def __init__(
        self, linear: nn.Linear, loader: FormatLoader, buffers: dict[str, torch.Tensor]
    ) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.loader = loader
        self.formats_tensors: tuple[str, ...] = ()
        self.converted: QuantizedLinear | None = None
        for name, tensor in buffers.items():
            self.register_buffer(name, tensor)
        self.bias = linear.bias
        self.formats_tensors = tuple(buffers)

    @property
    def format(self) -> PrequantizedFormat:
        return self.loader.format

    def __setattr__(self, name: str, value: Any) -> None:
        super().__setattr__(name, value)
        if name in getattr(self, "formats_tensors", ()) or name == "bias":
            self._convert_when_loaded()

    def _convert_when_loaded(self) -> None:
        tensors = [self._buffers[n] for n in self.formats_tensors]
        if not tensors or self.converted is not None or any(t.is_meta for t in tensors):
            return
        if self.bias is not None and self.bias.is_meta:
            return
        object.__setattr__(self, "converted", self.loader.process_weights_after_loading(self))
        for name, tensor in zip(self.formats_tensors, tensors):
            self._buffers[name] = stand_in(tensor)
            release_file_pages(tensor)

    def codes_scales_zeros(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """int4 formats: codes (out, in) uint8 in 0..15, scale float32 and zero float32 (out,
        groups) with W = scale (q - zero)."""
        fmt = self.format
        if fmt.layout == "awq":
            codes = unpack_awq(self.qweight).T
            zeros = unpack_awq(self.qzeros).T
            return codes, self.scales.float().T, zeros.float()
        if fmt.layout == "gptq":
            self._check_g_idx()
            codes = unpack_rows(self.qweight).T
            zeros = unpack_columns(self.qzeros).T.float() + fmt.gptq_zero_offset
            return codes, self.scales.float().T, zeros
        shape = tuple(int(v) for v in self.weight_shape)
        if shape != (self.out_features, self.in_features):
            raise refuse(
                fmt.method,
                f"weight_shape {shape} of a {self.out_features} x {self.in_features} linear",
            )
        codes = unpack_columns(self.weight_packed)  # (out, in), stored q + 8
        scale = self.weight_scale.float()
        return codes, scale, torch.full_like(scale, 8.0)

    def _check_g_idx(self) -> None:
        if not hasattr(self, "g_idx"):
            return
        group = self.format.group or self.in_features
        want = torch.arange(self.in_features, dtype=torch.int32) // group
        if not torch.equal(self.g_idx.to(torch.int32), want):
            raise refuse("gptq", "a g_idx other than input // group (act-order)")


def _nibbles(words: torch.Tensor) -> torch.Tensor:
    """int32 (..., m) -> uint8 (..., m, 8): nibble i of each word (bits 4 i .. 4 i + 3), read
    byte by byte (little-endian: byte b holds nibbles 2 b and 2 b + 1)."""
    data = words.contiguous().view(torch.uint8).reshape(*words.shape, 4)
    return torch.stack((data & 0xF, data >> 4), dim=-1).reshape(*words.shape, 8)


def unpack_columns(words: torch.Tensor) -> torch.Tensor:
    """int32 (rows, n / 8) -> uint8 (rows, n): nibble i of word w is column 8 w + i."""
    return _nibbles(words).reshape(words.shape[0], -1)


def unpack_rows(words: torch.Tensor) -> torch.Tensor:
    """int32 (n / 8, cols) -> uint8 (n, cols): nibble i of row r's word is row 8 r + i."""
    rows, cols = words.shape
    return _nibbles(words).permute(0, 2, 1).reshape(8 * rows, cols)


def unpack_awq(words: torch.Tensor) -> torch.Tensor:
    """AWQ's int32 (rows, n / 8) -> uint8 (rows, n): nibble i of word w is column
    8 w + AWQ_ORDER[i]."""
    nibble_of_column = sorted(range(8), key=lambda i: AWQ_ORDER[i])
    return _nibbles(words)[..., nibble_of_column].reshape(words.shape[0], -1)
