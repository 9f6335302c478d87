"""Memory accounting: what the weights, KV pool, linear-attention state pool and embedding cache
take (``estimate``), whether a model fits before its weights load and how large the KV pool may
be (``fit``), and what start-up allocated (``report``).

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

from sglang.srt.model_executor.memory.estimate import (
    Quantization,
    estimate_weight_bytes,
    fmt_bytes,
    kv_bytes_per_token,
    min_kv_tokens,
    safetensors_headers,
    tensor_bytes_as,
)
from sglang.srt.model_executor.memory.fit import (
    CPU_KV_BUDGET_BYTES,
    RUNTIME_RESERVE_BYTES,
    FitInputs,
    FitPlan,
    InsufficientMemoryError,
    check_fits,
    check_launch,
    cpu_kv_budget,
    fit_inputs,
    refusal,
)
from sglang.srt.model_executor.memory.report import (
    MemoryReport,
    runner_report,
)

__all__ = [
    "CPU_KV_BUDGET_BYTES",
    "FitInputs",
    "FitPlan",
    "InsufficientMemoryError",
    "MemoryReport",
    "Quantization",
    "RUNTIME_RESERVE_BYTES",
    "check_fits",
    "check_launch",
    "cpu_kv_budget",
    "estimate_weight_bytes",
    "fit_inputs",
    "fmt_bytes",
    "kv_bytes_per_token",
    "min_kv_tokens",
    "refusal",
    "runner_report",
    "safetensors_headers",
    "tensor_bytes_as",
]
