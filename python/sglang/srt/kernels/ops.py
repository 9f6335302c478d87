"""Typed access to the native CPU kernels: one function per kernel that loads it (None where it
cannot be built, or ``SGLANG_DISABLE_CPU_KERNELS`` is set), the functions it exports with their
types, and the layout constants its callers share with it. Code outside ``kernels`` takes its
kernels from here, never by name.

Every kernel also exports ``isa()``: the instruction set it was compiled for
(``kernels.expected_isa`` says which this CPU should give).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, cast

from sglang.srt import kernels

if TYPE_CHECKING:
    from torch import Tensor

# Output rows (gemm_bf16) or columns (linear_quant, linear_int8dq) per panel of the GEMM's
# weight layout (gemm_tile.h): packers and readers of the panels use it.
PANEL = 64


class _Kernel(Protocol):
    def isa(self) -> str: ...


class DecodeAttention(_Kernel, Protocol):
    def decode_attention(
        self, q: Tensor, k_buf: Tensor, v_buf: Tensor, req_to_token: Tensor, rows: Tensor,
        seq_lens: Tensor, scale: float, window: int, softcap: float,
    ) -> Tensor: ...  # fmt: skip


class PrefillAttention(_Kernel, Protocol):
    def prefill_attention(
        self, out: Tensor, q: Tensor, k_buf: Tensor, v_buf: Tensor, req_to_token: Tensor,
        rows: Tensor, q_starts: Tensor, prefix_lens: Tensor, q_lens: Tensor, scale: float,
        window: int,
    ) -> None: ...  # fmt: skip

    def varlen_attention(
        self, out: Tensor, q: Tensor, k: Tensor, v: Tensor, cu_seqlens: Tensor, scale: float
    ) -> None: ...


class GemmBf16(_Kernel, Protocol):
    def supported(self) -> bool: ...
    def pack(self, weight: Tensor) -> Tensor: ...
    def linear(self, x: Tensor, packed: Tensor, bias: Tensor | None, n: int) -> Tensor: ...


class LinearBf16(_Kernel, Protocol):
    def linear_bf16(self, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor: ...
    def linear_f32(self, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor: ...
    def linear_mixed(self, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor: ...
    def widen_bf16(self, src: Tensor) -> Tensor: ...


class LinearQuant(_Kernel, Protocol):
    def supported(self) -> bool: ...
    def takes_float32(self) -> bool: ...
    def linear_int8(
        self, x: Tensor, q: Tensor, scale: Tensor, bias: Tensor | None, n: int
    ) -> Tensor: ...
    def linear_int4(
        self, x: Tensor, q: Tensor, scale: Tensor, min: Tensor, group: int, bias: Tensor | None,
        n: int,
    ) -> Tensor: ...  # fmt: skip
    def quantize_int8(self, w: Tensor) -> list[Tensor]: ...
    def quantize_int4(self, w: Tensor, group: int) -> list[Tensor]: ...


class LinearInt8Dynamic(_Kernel, Protocol):
    def linear(
        self, x: Tensor, codes: Tensor, offset: Tensor, scale: Tensor, bias: Tensor | None, n: int
    ) -> Tensor: ...
    def linear_int4(
        self, x: Tensor, codes: Tensor, scale: Tensor, min: Tensor, group: int,
        bias: Tensor | None, n: int,
    ) -> Tensor: ...  # fmt: skip
    def int4_isa(self) -> str: ...
    def peak_ops(self, seconds: float) -> float: ...


class QuickGelu(_Kernel, Protocol):
    def quick_gelu(self, x: Tensor) -> Tensor: ...


class SiluAndMul(_Kernel, Protocol):
    def silu_and_mul(self, gate: Tensor, up: Tensor) -> Tensor: ...


class RmsNorm(_Kernel, Protocol):
    def rms_norm(self, x: Tensor, weight: Tensor, eps: float) -> Tensor: ...
    def rms_norm_offset(self, x: Tensor, weight: Tensor, eps: float) -> Tensor: ...


class Rotary(_Kernel, Protocol):
    def rotary_pair(
        self, q: Tensor, k: Tensor, cos: Tensor, sin: Tensor
    ) -> tuple[Tensor, Tensor]: ...


def decode_attention() -> DecodeAttention | None:
    return cast("DecodeAttention | None", kernels.load("decode_attention"))


def prefill_attention() -> PrefillAttention | None:
    return cast("PrefillAttention | None", kernels.load("prefill_attention"))


def gemm_bf16() -> GemmBf16 | None:
    return cast("GemmBf16 | None", kernels.load("gemm_bf16"))


def native_gemm() -> GemmBf16 | None:
    """The native bfloat16 GEMM where it is the faster product: AVX512-BF16 without AMX (with
    AMX oneDNN's tiles are faster)."""
    flags = kernels.cpu_flags()  # read through the package: tests stand in other CPUs' flags
    if "avx512_bf16" not in flags or "amx_bf16" in flags:
        return None
    kernel = gemm_bf16()
    return kernel if kernel is not None and kernel.supported() else None


def linear_bf16() -> LinearBf16 | None:
    return cast("LinearBf16 | None", kernels.load("linear_bf16"))


def linear_quant() -> LinearQuant | None:
    return cast("LinearQuant | None", kernels.load("linear_quant"))


def linear_int8_dynamic() -> LinearInt8Dynamic | None:
    return cast("LinearInt8Dynamic | None", kernels.load("linear_int8dq"))


def quick_gelu() -> QuickGelu | None:
    return cast("QuickGelu | None", kernels.load("quick_gelu"))


def silu_and_mul() -> SiluAndMul | None:
    return cast("SiluAndMul | None", kernels.load("silu_and_mul"))


def rms_norm() -> RmsNorm | None:
    return cast("RmsNorm | None", kernels.load("rms_norm"))


def rotary() -> Rotary | None:
    """Llama-style rotary embeddings (``apply_rotary_pos_emb``)."""
    return cast("Rotary | None", kernels.load("rotary"))


def vision_rotary() -> Rotary | None:
    """The vision towers' rotary embeddings (``apply_rotary_pos_emb_vision``)."""
    return cast("Rotary | None", kernels.load("vision_rotary"))
