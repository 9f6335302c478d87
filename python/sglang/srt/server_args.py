"""Server arguments: one frozen dataclass; the CLI is derived from its fields."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from dataclasses import dataclass, field, fields
from typing import Any, get_type_hints

from sglang.srt.layers.attention import attention_backend_names
from sglang.srt.multimodal.media_fetch import FetchPolicy

DEFAULT_MM_CACHE_MB = 100


@dataclass(frozen=True)
class ServerArgs:
    # Model
    model_path: str | None = field(
        default=None, metadata={"help": "Local HF model folder (default: the embedded tiny model)."}
    )
    served_model_name: str | None = None
    chat_template: str | None = None
    dtype: str = field(
        default="auto",
        metadata={
            "help": "auto: the checkpoint's dtype; on a CPU a bfloat16/float16 checkpoint runs in "
            "bfloat16 where the CPU has AMX or AVX512-BF16, else float32. float32 is exact "
            "(greedy output equals HF's); bfloat16, float16 (bfloat16 on a CPU)."
        },
    )
    kv_cache_dtype: str = field(
        default="auto",
        metadata={
            "help": "KV cache storage: auto (the model dtype), bfloat16, float32, fp8_e4m3, "
            "fp8_e5m2 (fp8 is converted to the model dtype when attention reads it)."
        },
    )
    device: str | None = field(
        default=None, metadata={"help": "cpu or cuda (default: cuda if any)."}
    )
    context_length: int | None = None
    trust_remote_code: bool = False
    torchao_config: str = field(
        default="",
        metadata={
            "help": "Weight-only quantization of the language model's linear layers through "
            "torchao: int8wo or int4wo-<group> (32, 64, 128; 256 on CUDA). The model runs in "
            "bfloat16."
        },
    )
    quantization: str | None = field(
        default=None,
        metadata={"help": "SGLang's quantization methods are not implemented: leave unset."},
    )
    enable_multimodal: bool | None = field(
        default=None, metadata={"help": "Serve images (on by default for VLM folders)."}
    )

    # Memory and scheduling
    mem_fraction_static: float | None = field(
        default=None,
        metadata={
            "help": "Fraction of memory for weights + KV pool (+ linear-attention state): of the "
            "GPU's on CUDA (default 0.85), of the host's (cgroup limit, else MemTotal) on CPU "
            "(default: a KV pool of min(1 GiB, what is available))."
        },
    )
    max_total_tokens: int | None = field(
        default=None, metadata={"help": "KV cache size in tokens (overrides the memory fraction)."}
    )
    max_running_requests: int | None = None
    max_prefill_tokens: int = 16384
    chunked_prefill_size: int | None = field(
        default=None, metadata={"help": "Tokens per prefill chunk; -1 disables chunking."}
    )
    schedule_policy: str = "fcfs"
    enable_mixed_chunk: bool = field(
        default=False,
        metadata={
            "help": "Running requests take their decode step inside a batch that runs a prompt "
            "chunk instead of waiting for it (not for linear-attention models)."
        },
    )
    disable_radix_cache: bool = False
    random_seed: int | None = None
    watchdog_timeout: float = field(
        default=300.0,
        metadata={
            "help": "Exit (so a supervisor restarts the server) when one scheduler step "
            "runs longer than this many seconds."
        },
    )

    # Hybrid models (linear-attention layers, e.g. Qwen3.5)
    max_mamba_cache_size: int | None = field(
        default=None, metadata={"help": "Linear-attention state slots for running requests."}
    )
    mamba_ssm_dtype: str = field(
        default="float32", metadata={"help": "Recurrent-state dtype: float32 (as HF), bfloat16."}
    )
    state_snapshot_mb: float | None = field(
        default=None,
        metadata={"help": "Prefix-cache snapshots of linear-attention state, MB (default: 10%%)."},
    )

    # Attention
    attention_backend: str | None = field(
        default=None,
        metadata={
            "help": "Language-model attention backend: "
            + ", ".join(attention_backend_names())
            + " (default torch_native)."
        },
    )
    mm_attention_backend: str = "sdpa"
    enable_torch_compile: bool = field(
        default=False,
        metadata={"help": "Compile the Qwen-VL vision blocks (minutes of start-up per shape)."},
    )
    decode_threads: int = field(
        default=0,
        metadata={
            "help": "CPU threads for decode steps (0: one thread when the language model's "
            "hidden size is below 2048, else all; prompt chunks always use all)."
        },
    )

    # Chat
    reasoning_parser: str | None = field(
        default=None, metadata={"help": "qwen3: split <think>...</think> into reasoning_content."}
    )

    # Multimodal embedding cache
    mm_cache_mode: str = field(
        default="per-image", metadata={"help": "per-image, combined (legacy) or off."}
    )
    mm_embedding_cache_mb: int | None = field(
        default=None, metadata={"help": "Embedding cache budget (env SGLANG_VLM_CACHE_SIZE_MB)."}
    )
    mm_encoder_token_budget: int | None = None
    mm_video_cache: str = field(
        default="per-group",
        metadata={
            "help": "per-group (one cache entry per frame group where the vision tower allows "
            "it, encoded when a chunk reaches it) or whole (one entry per video)."
        },
    )
    limit_mm_data_per_request: str | None = field(
        default=None, metadata={"help": 'JSON, e.g. {"image": 8, "video": 1}.'}
    )

    # Structured outputs and tools
    tool_call_parser: str | None = field(
        default=None, metadata={"help": "Parse tool calls from outputs: qwen25."}
    )
    constrained_json_disable_any_whitespace: bool = field(
        default=False, metadata={"help": "JSON-constrained outputs use compact separators only."}
    )

    # HTTP server
    host: str = "127.0.0.1"
    port: int = 30000
    api_key: str | None = None
    enable_metrics: bool = False
    enable_cache_report: bool = False
    log_level: str = "info"
    allowed_local_media_path: str | None = None
    media_url_max_file_size_mb: int = 20
    media_url_timeout: float = field(
        default=10.0, metadata={"help": "Deadline in seconds for a whole image download."}
    )
    allow_private_media_urls: bool = field(
        default=False,
        metadata={
            "help": "Let image URLs reach loopback, link-local and private addresses "
            "(refused by default, after DNS resolution and on every redirect)."
        },
    )
    max_request_body_mb: int = field(
        default=64, metadata={"help": "Larger request bodies are answered 413 before parsing."}
    )

    def __post_init__(self) -> None:
        if self.mm_cache_mode not in ("per-image", "combined", "off"):
            raise ValueError(
                f"mm_cache_mode must be per-image, combined or off, got {self.mm_cache_mode!r}"
            )
        if self.chunked_prefill_size is not None and self.chunked_prefill_size == 0:
            raise ValueError("chunked_prefill_size must be positive or -1")
        if self.max_prefill_tokens <= 0:
            raise ValueError("max_prefill_tokens must be positive")
        if self.schedule_policy != "fcfs":
            raise ValueError(
                f"only the fcfs schedule policy is implemented, not {self.schedule_policy!r}"
            )
        if self.attention_backend not in (None, *attention_backend_names()):
            raise ValueError(
                f"unknown attention backend {self.attention_backend!r}; "
                f"choose from {attention_backend_names()}"
            )
        if self.mm_attention_backend != "sdpa":
            raise ValueError("the vision tower runs on sdpa (--mm-attention-backend sdpa)")
        from sglang.srt.model_executor.dtypes import DTYPE_NAMES, KV_CACHE_DTYPES

        if self.dtype != "auto" and self.dtype not in DTYPE_NAMES:
            raise ValueError(f"dtype must be auto or one of {sorted(DTYPE_NAMES)}")
        if self.kv_cache_dtype != "auto" and self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"kv_cache_dtype must be auto or one of {sorted(KV_CACHE_DTYPES)}")
        if self.mamba_ssm_dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError("mamba_ssm_dtype must be float32, bfloat16 or float16")
        if self.reasoning_parser not in (None, "qwen3"):
            raise ValueError(f"unknown reasoning parser {self.reasoning_parser!r} (qwen3)")
        if self.tool_call_parser is not None:
            from sglang.srt.function_call import get_tool_call_parser

            get_tool_call_parser(self.tool_call_parser)
        if self.watchdog_timeout <= 0:
            raise ValueError("watchdog_timeout must be positive")
        if self.decode_threads < 0:
            raise ValueError("decode_threads must be 0 (auto) or positive")
        if self.max_request_body_mb <= 0:
            raise ValueError("max_request_body_mb must be positive")
        if self.limit_mm_data_per_request is not None:
            self.mm_limit("image")  # validates the JSON
        if self.mm_video_cache not in ("per-group", "whole"):
            raise ValueError("mm_video_cache must be per-group or whole")
        self._check_quantization()

    def _check_quantization(self) -> None:
        from sglang.srt.model_executor import quantization

        quantization.check_quantization_flag(self.quantization)
        device = self.resolved_device if self.torchao_config else None
        quantization.parse_torchao_config(self.torchao_config, device)
        quantization.check_torchao_dtype(self.torchao_config, self.dtype)

    @property
    def resolved_device(self) -> str:
        if self.device is not None:
            return self.device
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"

    @property
    def image_limit(self) -> int | None:
        return self.mm_limit("image")

    @property
    def video_limit(self) -> int | None:
        return self.mm_limit("video")

    def mm_limit(self, modality: str) -> int | None:
        """The most items of ``modality`` one request may carry (None: no limit)."""
        if self.limit_mm_data_per_request is None:
            return None
        try:
            limits = json.loads(self.limit_mm_data_per_request)
            return int(limits[modality]) if modality in limits else None
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise ValueError(
                f'limit_mm_data_per_request must be JSON like \'{{"image": 8, "video": 1}}\': {exc}'
            ) from exc

    @property
    def fetch_policy(self) -> FetchPolicy:
        return FetchPolicy(
            self.media_url_max_file_size_mb, self.media_url_timeout, self.allow_private_media_urls
        )

    @property
    def allowed_local_dir(self) -> str | None:
        """The folder local media paths must resolve under (None: no local paths)."""
        path = self.allowed_local_media_path
        return os.path.realpath(path) if path else None

    @property
    def mm_cache_bytes(self) -> int:
        """--mm-embedding-cache-mb, else env SGLANG_VLM_CACHE_SIZE_MB, else 100 MB on CPU and
        1% of device memory (at least 100 MB, at most 4 GB) on GPU."""
        mb = self.mm_embedding_cache_mb
        if mb is None and "SGLANG_VLM_CACHE_SIZE_MB" in os.environ:
            mb = int(os.environ["SGLANG_VLM_CACHE_SIZE_MB"])
        if mb is None:
            mb = DEFAULT_MM_CACHE_MB
            if self.resolved_device.startswith("cuda"):
                import torch

                total_mb = torch.cuda.get_device_properties(0).total_memory // 2**20
                mb = min(max(total_mb // 100, DEFAULT_MM_CACHE_MB), 4096)
        return mb * 1024 * 1024

    def replace(self, **changes: Any) -> ServerArgs:
        return dataclasses.replace(self, **changes)

    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser) -> None:
        hints = get_type_hints(ServerArgs)
        for f in fields(ServerArgs):
            flag = "--" + f.name.replace("_", "-")
            help_text = f.metadata.get("help", "")
            hint = hints[f.name]
            if hint is bool or hint == bool | None:
                parser.add_argument(flag, action="store_true", default=f.default, help=help_text)
                continue
            base = _base_type(hint)
            parser.add_argument(flag, type=base, default=f.default, help=help_text)

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> ServerArgs:
        return cls(**{f.name: getattr(args, f.name) for f in fields(cls)})


def _base_type(hint: Any) -> type:
    for candidate in (int, float, str):
        if hint is candidate or hint == candidate | None:
            return candidate
    raise TypeError(f"unsupported server-arg type {hint}")
