"""bfloat16 linears with their weights packed once, at load: the encoders' (held only packed)
and copies for the language model's prompt rows; oneDNN's products, or the native GEMM's.

On a CPU, torch's bfloat16 ``F.linear`` hands the (out, in) weight to oneDNN, which lays it out
in its blocked format for the product. Packing each weight once
(``torch.ops.mkldnn._reorder_linear_weight``) and calling the packed product gives the same
result (bit for bit on the towers' shapes; elsewhere within the output's rounding) and measured
5-12% faster on those shapes (1,564-4,784 rows x 1280 -> 1280-5120 and back, AMD EPYC, 2
threads, AVX512-BF16).

The packed copy replaces the weight's storage: the Parameter keeps its shape, dtype and device
(HF code reads them) over a one-element storage, so the weights are held once; each module's
``packed_weight_bytes`` tells the memory report what the packed copy holds. Only plain bfloat16
CPU weights of modules that are exactly ``nn.Linear`` are packed (quantized tensor subclasses,
float32 and Linear subclasses keep torch's product).

The language model's linears are packed the same way where the native GEMM takes them
(``install(..., native_only=True)``): one layout that prompt chunks and decode rows both read,
since the GEMM's tile of 1-7 rows streams a panel at memory bandwidth as well. The 2B-shaped
model's layer products (1536 -> 1536, 256, 8960 and 8960 -> 1536, AMD EPYC, 2 threads, copy
bandwidth 78 GB/s) took 0.90 ms at one row against 1.02 ms for ``decode_linear``'s kernel on
the plain weights, 1.30 against 2.31 ms at 8 rows and 1.80 against 3.73 ms at 16; and a token's
output is the same bits whether it is decoded or recomputed in a prompt chunk. Elsewhere (AMX,
no AVX512-BF16, odd input sizes, a weight another module shares) the language model keeps its
plain weights, read by ``decode_linear``; ``add_packed_copies`` gives them a oneDNN-packed copy
beside it for prompt rows, on request only (``cpu_packed_lm_weights="on"``): one 640x480
image's prompt (416 tokens) through the 2B-shaped language model took 390-399 ms instead of
426-450 ms (AMD EPYC, 2 threads, oneDNN), for the weights' bytes twice.

On CPUs with AVX512-BF16 and without AMX the packed weights are the native GEMM's
(``kernels/csrc/gemm_bf16.cpp``) instead of oneDNN's: a register tile of 7 rows x 64 columns
over the whole input dimension reaches 0.95 of ``vdpbf16ps``'s peak on one thread where
oneDNN's product reached 0.86-0.91; on two threads, in one process alternating with oneDNN's,
1.01-1.10x its rate on the 2B-shaped model's products (the towers' 1,564 rows x 1280 -> 3840 /
5120 and back 1.06-1.08x, the language model's 433 rows 1.01-1.05x). Each output is one
float32 sum over the inputs in a fixed order, rounded once (within the output's rounding of the
exact product, as oneDNN's), and the same whatever the other rows. The last panel of 64
columns is zero-padded (``packed_weight_bytes`` counts it). With AMX, oneDNN's tiles are faster
and stay.
"""

from __future__ import annotations

import types
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from sglang.srt.kernels import ops
from sglang.srt.layers import page_release
from sglang.srt.layers.quantization.base import LinearMethod, attach, attached, stand_in

PANEL_ROWS = ops.PANEL  # output rows per panel of the native GEMM's layout (gemm_bf16.cpp)


def available() -> bool:
    """Whether bfloat16 weights can be packed here: the native GEMM takes them, or oneDNN's
    bfloat16 product runs on this CPU (it refuses CPUs with neither AVX512-BW/VL/DQ nor
    AVX-NE-CONVERT, such as AVX2-only ones, which keep torch's ``F.linear``)."""
    if ops.native_gemm() is not None:
        return True
    mkldnn = torch.ops.mkldnn
    if not (torch.backends.mkldnn.is_available() and hasattr(mkldnn, "_reorder_linear_weight")):
        return False
    return bool(mkldnn._is_mkldnn_bf16_supported())


class PackedMethod(LinearMethod):
    """A bfloat16 weight held only packed (the native GEMM's panels where it takes the weight,
    else oneDNN's layout): every row count runs on the packed product."""

    names = {
        "bf16-packed-gemm": "held only in the native GEMM's panels (gemm_bf16.cpp): every row "
        "count",
        "bf16-packed-onednn": "held only oneDNN-packed: oneDNN's product for every row count",
    }

    def process_weights_after_loading(self, layer: nn.Module) -> nn.Module:
        _pack(layer, consume=True)
        layer.weight.data = stand_in(layer.weight)
        return attach(layer, self)

    def apply(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return product(layer, x)

    def name(self, layer: nn.Module) -> str:
        native = layer.__dict__.get("packed_gemm") is not None
        return "bf16-packed-gemm" if native else "bf16-packed-onednn"


PACKED = PackedMethod()


def install(modules: Iterable[nn.Module], native_only: bool = False) -> int:
    """Serve every eligible ``nn.Linear`` among ``modules`` with ``PACKED`` (in place); returns
    how many were packed. ``native_only``: only where the native GEMM takes the weight (the
    language model's single layout, which its decode rows read too; oneDNN's packed product is
    slow for them)."""
    if not available() or (native_only and ops.native_gemm() is None):
        return 0
    count = 0
    for module in modules:
        if _eligible(module) and not (native_only and module.weight.shape[1] % 2):
            PACKED.process_weights_after_loading(module)
            count += 1
    return count


def holds_only_packed(module: nn.Module) -> bool:
    """Whether ``install`` packed the module: its method is a ``PackedMethod`` and its checkpoint
    weight's storage is gone."""
    return isinstance(attached(module), PackedMethod)


def lookups_can_move_to(embedding: nn.Module, head: nn.Module) -> bool:
    """Whether ``embedding`` is a plain ``nn.Embedding`` sharing its table with ``head``, so that
    ``serve_lookups_from_head`` can serve it once the head is packed."""
    if type(embedding) is not nn.Embedding or embedding.max_norm is not None:
        return False
    return getattr(embedding, "weight", None) is getattr(head, "weight", None)


def serve_lookups_from_head(embedding: nn.Module, head: nn.Module) -> bool:
    """Where an ``nn.Embedding`` shares its table with a head that ``install`` packed for the
    native GEMM (a tied head), route the embedding's lookups to the head's panels: row r of
    the table is column r of panel r // 64, so the pair holds the table once. Returns whether
    it did."""
    if not lookups_can_move_to(embedding, head):
        return False
    if not (holds_only_packed(head) and head.__dict__.get("packed_gemm")):
        return False
    embedding.packed_table = head.packed_weight
    embedding.forward = types.MethodType(_lookup_in_panels, embedding)
    return True


def add_packed_copies(modules: Iterable[nn.Module]) -> int:
    """Give every eligible ``nn.Linear`` among ``modules`` a packed copy of its weight and keep
    the weight (and the module's forward) as they are; returns how many got one."""
    if not available():
        return 0
    count = 0
    for module in modules:
        if _eligible(module):
            _pack(module)
            count += 1
    return count


def packed_bytes(model: nn.Module) -> int:
    """Bytes of the packed weights under ``model`` (not in its parameters' storages)."""
    return sum(getattr(m, "packed_weight_bytes", 0) for m in model.modules())


def product(module: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """``module(x)`` on its packed weight (bfloat16 x of any leading shape)."""
    gemm = module.__dict__.get("packed_gemm")
    if gemm is None:
        weight = module.packed_weight
        return torch.ops.mkldnn._linear_pointwise(x, weight, module.bias, "none", [], "")
    flat = x.reshape(-1, x.shape[-1])
    flat = flat if flat.stride(-1) == 1 else flat.contiguous()
    out = gemm.linear(flat, module.packed_weight, module.bias, module.out_features)
    return out.reshape(*x.shape[:-1], module.out_features)


def _pack(module: nn.Linear, consume: bool = False) -> None:
    """The packed copy of the module's weight (the native GEMM's where it applies, else
    oneDNN's), and its bytes for the memory report. ``consume``: the caller drops the weight
    once packed, so its pages may go as the panels are made."""
    weight = module.weight.detach()
    gemm = None if weight.shape[1] % 2 else ops.native_gemm()
    if gemm is not None:
        module.packed_weight = pack_panels(gemm, weight, consume)
        module.packed_weight_bytes = module.packed_weight.numel() * weight.element_size()
    else:
        module.packed_weight = torch.ops.mkldnn._reorder_linear_weight(weight, None)
        module.packed_weight_bytes = _weight_bytes(module)
    module.packed_gemm = gemm


def pack_panels(
    gemm: Any, weight: torch.Tensor, consume: bool = False, slice_bytes: int = 64 << 20
) -> torch.Tensor:
    """``gemm.pack(weight)``. With ``consume``, made a slice of whole panels at a time, each
    slice's rows of the weight given back to the system once packed (its file pages, or its
    anonymous pages where the weight owns all of its storage): the weight and its panels are
    never both whole in memory (2 GiB at once for a 7B's head). For a weight nothing reads
    afterwards."""
    rows, cols = weight.shape
    step = PANEL_ROWS * max(1, slice_bytes // (PANEL_ROWS * cols * weight.element_size()))
    if not consume or rows <= step or not weight.is_contiguous():
        return gemm.pack(weight)
    owned = weight.untyped_storage().nbytes() == weight.numel() * weight.element_size()
    give_back = owned or page_release.on_checkpoint_mapping(weight)
    packed = torch.empty(-(-rows // PANEL_ROWS), cols // 2, PANEL_ROWS, 2, dtype=weight.dtype)
    for first in range(0, rows, step):
        piece = weight[first : first + step]
        panel = first // PANEL_ROWS
        packed[panel : panel + -(-piece.shape[0] // PANEL_ROWS)] = gemm.pack(piece)
        if give_back:
            page_release.drop_pages(piece)
    return packed


def _weight_bytes(module: nn.Linear) -> int:
    return module.weight.numel() * module.weight.element_size()


def _eligible(module: nn.Module) -> bool:
    # Exactly nn.Linear: subclasses (nn.MultiheadAttention's out_proj) have parents that read
    # their weight themselves.
    if type(module) is not nn.Linear or hasattr(module, "packed_weight"):
        return False
    weight = module.weight
    plain = type(weight.data) is torch.Tensor  # not a quantized tensor subclass
    return (
        plain
        and weight.dtype == torch.bfloat16
        and weight.device.type == "cpu"
        and weight.is_contiguous()
    )


def panel_rows(panels: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Rows ``ids`` (*ids.shape, in padded to pairs) of a weight in panels (panels, in / 2, 64,
    2; gemm_bf16.cpp's layout, and linear_quant's int8 codes): row r is column r of panel
    r // 64."""
    rows = panels[ids // panels.shape[2], :, ids % panels.shape[2], :]  # (*ids.shape, in / 2, 2)
    return rows.reshape(*ids.shape, -1)


def _lookup_in_panels(self: nn.Embedding, ids: torch.Tensor) -> torch.Tensor:
    return panel_rows(self.packed_table, ids)
