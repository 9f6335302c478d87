"""The native CPU attention backend (``cpu_native``, the default on a CPU): prefill on the native
prefill kernel (``kernels/csrc/prefill_attention.cpp``) for all requests without bidirectional
spans in one call, where it is built, the pool holds the queries' dtype, there is no
soft-capping and the head dim is a multiple of 16; decode on the native decode kernel, all
requests in one call (``kernels/csrc/decode_attention.cpp``), under the same dtype rule. What
the kernels do not take runs on ``torch_native``'s paths."""

from __future__ import annotations

import torch

from sglang.srt.kernels import ops
from sglang.srt.layers.attention.torch_native import TorchNativeAttnBackend
from sglang.srt.mem_cache.memory_pool import KVPool, ReqToTokenPool


class CpuNativeAttnBackend(TorchNativeAttnBackend):
    def __init__(self, kv_pool: KVPool, req_to_token_pool: ReqToTokenPool) -> None:
        super().__init__(kv_pool, req_to_token_pool)
        if kv_pool.device == "cpu":
            self.decode_kernel = ops.decode_attention()
            self.prefill_kernel = ops.prefill_attention()

    def _prefill_kernel_takes(
        self, q: torch.Tensor, k_buf: torch.Tensor, softcap: float | None
    ) -> bool:
        return (
            self.prefill_kernel is not None
            and not softcap
            and q.device.type == "cpu"
            and k_buf.dtype == q.dtype
            and q.shape[3] % 16 == 0
        )

    def _prefill(
        self,
        out: torch.Tensor,
        q: torch.Tensor,
        k_buf: torch.Tensor,
        v_buf: torch.Tensor,
        scaling: float,
        sliding_window: int | None,
        use_spans: bool,
    ) -> set[int]:
        """The requests without bidirectional spans in this layer, in one kernel call writing
        their rows of ``out`` (tokens, heads, dim); returns their indices."""
        chosen = tuple(i for i, r in enumerate(self._reqs) if not (use_spans and r.spans))
        if not chosen:
            return set()
        if chosen not in self._prefill_args:
            reqs = [self._reqs[i] for i in chosen]
            rows = [self._req_rows[i] for i in chosen]
            columns = (rows, [r.q_start for r in reqs], [r.prefix for r in reqs],
                       [r.q_len for r in reqs])  # fmt: skip
            self._prefill_args[chosen] = tuple(torch.tensor(c, dtype=torch.int64) for c in columns)
        tokens_first = q[0].transpose(0, 1)  # (tokens, heads, dim), rows must be contiguous
        if tokens_first.stride(2) != 1:
            tokens_first = tokens_first.contiguous()
        self.prefill_kernel.prefill_attention(
            out,
            tokens_first,
            k_buf,
            v_buf,
            self.req_to_token,
            *self._prefill_args[chosen],
            scaling,
            sliding_window or -1,
        )
        return set(chosen)

    def _decode(
        self,
        q: torch.Tensor,
        k_buf: torch.Tensor,
        v_buf: torch.Tensor,
        scaling: float,
        sliding_window: int | None,
        softcap: float | None,
    ) -> torch.Tensor:
        """One query per request (q: (1, heads, B, dim)) -> (1, B, heads, dim)."""
        out = self.decode_kernel.decode_attention(
            q[0].transpose(0, 1).contiguous(),
            k_buf,
            v_buf,
            self.req_to_token,
            self._decode_rows,
            self._decode_lens,
            scaling,
            sliding_window or -1,
            softcap or 0.0,
        )
        return out.unsqueeze(0)
