"""What the model runner is built from: the first link of the launch config chain
(``ServerArgs`` adds the scheduler's and the HTTP server's fields). Frozen; each field is a CLI
flag (``ServerArgs.add_cli_args``); validated where it is made."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from sglang.srt.layers.attention import attention_backend_names
from sglang.srt.layers.pooling_config import POOLING_METHODS, is_pooling_checkpoint
from sglang.srt.mem_cache.embedding_store import check_store_url
from sglang.srt.model_executor import quantization
from sglang.srt.model_executor.dtypes import DTYPE_NAMES, KV_CACHE_DTYPES

DEFAULT_MM_CACHE_MB = 100


@dataclass(frozen=True)
class EngineConfig:
    # Model
    model_path: str | None = field(
        default=None, metadata={"help": "Local HF model folder (default: the embedded tiny model)."}
    )
    dtype: str = field(
        default="auto",
        metadata={
            "help": "auto: half precision, as SGLang and vLLM pick it (a float32 checkpoint "
            "too): on a CPU bfloat16 where it has AMX or AVX512-BF16, else float32. float32 is "
            "exact (greedy output equals HF's); bfloat16, float16 (bfloat16 on a CPU)."
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
    context_length: int | None = field(
        default=None,
        metadata={
            "help": "Longest prompt + output in tokens "
            "(default: the model's max_position_embeddings)."
        },
    )
    trust_remote_code: bool = field(
        default=False,
        metadata={"help": "Allow a model folder's own Python code (auto_map) to run."},
    )
    torchao_config: str = field(
        default="",
        metadata={
            "help": "Quantization of the language model's linear layers (torchao's names): "
            "int8wo or int4wo-<group> (32, 64, 128; 256 on CUDA), weight-only; int8dq, int8 "
            "weights times activations quantized to int8 per row at run time; 8da4w-<group>, "
            "int4 weights times int8 activations. The model runs in bfloat16."
        },
    )
    vision_int8dq: bool = field(
        default=False,
        metadata={
            "help": "With --torchao-config int8dq or 8da4w-<group> on a CPU, the vision "
            "tower's and projector's linears run int8dq too (int8 activations times int8 "
            "weights)."
        },
    )
    quantization: str | None = field(
        default=None,
        metadata={"help": "SGLang's quantization methods are not implemented: leave unset."},
    )

    is_embedding: bool = field(
        default=False,
        metadata={
            "help": "Serve pooled hidden states (/v1/embeddings, /v1/score, /v1/rerank); on "
            "without the flag for a checkpoint with a sentence-transformers pooling config or "
            "a reranker head."
        },
    )
    pooling_method: str | None = field(
        default=None,
        metadata={
            "help": "Pooling of an embedding model: last, mean or cls (default: the "
            "checkpoint's 1_Pooling/config.json, else last)."
        },
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
    max_running_requests: int | None = field(
        default=None,
        metadata={"help": "Requests decoding at once (default: from the KV pool size, 8 to 256)."},
    )
    chunked_prefill_size: int | None = field(
        default=None, metadata={"help": "Tokens per prefill chunk; -1 disables chunking."}
    )
    disable_radix_cache: bool = field(
        default=False, metadata={"help": "Turn off the prefix (radix) cache of KV entries."}
    )
    cpu_lm_head_dtype: str = field(
        default="int8",
        metadata={
            "help": "With --torchao-config on a CPU, the untied LM head: int8 (per output "
            "channel), int4 (with int4wo-<group> or 8da4w-<group>: the same groups, as "
            "llama.cpp's --pure Q4_0 head; moves logprobs several times more than int8) or "
            "bfloat16."
        },
    )
    cpu_packed_lm_weights: str = field(
        default="auto",
        metadata={
            "help": "bfloat16 on a CPU, the language model's linear weights: auto (one copy each, "
            "packed for the native GEMM where the CPU has AVX512-BF16 without AMX, which serves "
            "prompts and decode steps; plain elsewhere), on (auto, plus a oneDNN-packed copy "
            "beside each plain weight for prompt chunks: ~10%% faster prefill for the weights' "
            "bytes twice) or off (plain weights only)."
        },
    )
    cpu_bf16_weights: str = field(
        default="auto",
        metadata={
            "help": "float32 on a CPU, the linear and embedding weights: auto (kept in bfloat16 "
            "and widened as they are read where a bfloat16 checkpoint runs in float32 under "
            "--dtype auto, on CPUs without native bfloat16: half the weights' memory, the same "
            "float32 products), on (so for any checkpoint served in float32, rounding wider "
            "weights to bfloat16) or off (float32 weights)."
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
            + " (default: cpu_native, the native CPU kernels, on a CPU; torch_native, torch's"
            " operators, elsewhere)."
        },
    )
    mm_attention_backend: str = field(
        default="sdpa",
        metadata={"help": "Vision tower attention: sdpa (the only one implemented)."},
    )
    enable_torch_compile: bool = field(
        default=False,
        metadata={"help": "Compile the Qwen-VL vision blocks (minutes of start-up per shape)."},
    )

    # Multimodal embedding cache
    mm_cache_mode: str = field(
        default="per-image", metadata={"help": "per-image, combined (legacy) or off."}
    )
    mm_embedding_cache_mb: int | None = field(
        default=None, metadata={"help": "Embedding cache budget (env SGLANG_VLM_CACHE_SIZE_MB)."}
    )
    mm_encoder_token_budget: int | None = field(
        default=None,
        metadata={
            "help": "Most vision tokens one encoder call takes "
            "(default: the prefill chunk size, at least 1024)."
        },
    )
    mm_video_cache: str = field(
        default="per-group",
        metadata={
            "help": "per-group (one cache entry per frame group where the vision tower allows "
            "it, encoded when a chunk reaches it) or whole (one entry per video)."
        },
    )

    # Fleet: the shared embedding store
    enable_mm_global_cache: bool = field(
        default=False,
        metadata={
            "help": "Share per-image embeddings with every worker through the store at "
            "--mm-global-cache-url: an image is encoded once across a fleet and across restarts."
        },
    )
    mm_global_cache_url: str = field(
        default="redis://127.0.0.1:6379/0",
        metadata={
            "help": "The shared embedding store (redis://host:port/db). Bound its size there: "
            "redis-server --maxmemory 2gb --maxmemory-policy allkeys-lru."
        },
    )
    mm_global_cache_ttl: float = field(
        default=86400.0,
        metadata={"help": "Seconds a shared embedding lives in the store (0: until evicted)."},
    )
    mm_global_cache_timeout: float = field(
        default=1.0,
        metadata={
            "help": "Seconds one store operation may take; a failed one leaves the store "
            "alone for 5 s (images are encoded locally meanwhile)."
        },
    )
    mm_global_cache_namespace: str = field(
        default="",
        metadata={
            "help": "Added to the store's key fingerprint (checkpoint, processor, dtype), "
            "e.g. to keep two deployments of one checkpoint apart."
        },
    )

    # Fleet: encoder disaggregation
    encoder_only: bool = field(
        default=False,
        metadata={
            "help": "Serve POST /encode only: the vision tower and processor, no language model "
            "(for --language-only workers' --encoder-urls)."
        },
    )
    language_only: bool = field(
        default=False,
        metadata={
            "help": "Send images that miss the caches to --encoder-urls (the local tower stays "
            "loaded: it encodes what an encoder does not return in time)."
        },
    )
    encoder_urls: list[str] | None = field(
        default=None,
        metadata={
            "help": "Encoder-only workers (http://host:port ...); a batch is split over them."
        },
    )
    encoder_timeout: float = field(
        default=30.0,
        metadata={"help": "Seconds to wait for the encoder workers before encoding locally."},
    )

    def __post_init__(self) -> None:
        if self.encoder_only and (self.language_only or self.encoder_urls):
            raise ValueError("--encoder-only excludes --language-only and --encoder-urls")
        if self.language_only != bool(self.encoder_urls):
            raise ValueError("--language-only and --encoder-urls go together")
        for url in self.encoder_urls or ():
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"encoder URL {url!r} must be http:// or https://")
        if self.pooling_method not in (None, *POOLING_METHODS):
            raise ValueError(f"pooling_method must be one of {POOLING_METHODS}")
        if self.encoder_timeout <= 0:
            raise ValueError("encoder_timeout must be positive")
        if self.enable_mm_global_cache and self.mm_cache_mode != "per-image":
            raise ValueError("--enable-mm-global-cache shares per-image entries (mm_cache_mode)")
        if self.mm_global_cache_ttl < 0 or self.mm_global_cache_timeout <= 0:
            raise ValueError("mm_global_cache_ttl must be >= 0 and its timeout positive")
        check_store_url(self.mm_global_cache_url)
        if self.mm_cache_mode not in ("per-image", "combined", "off"):
            raise ValueError(
                f"mm_cache_mode must be per-image, combined or off, got {self.mm_cache_mode!r}"
            )
        if self.chunked_prefill_size is not None and self.chunked_prefill_size == 0:
            raise ValueError("chunked_prefill_size must be positive or -1")
        if self.attention_backend not in (None, *attention_backend_names()):
            raise ValueError(
                f"unknown attention backend {self.attention_backend!r}; "
                f"choose from {attention_backend_names()}"
            )
        if self.mm_attention_backend != "sdpa":
            raise ValueError("the vision tower runs on sdpa (--mm-attention-backend sdpa)")
        if self.dtype != "auto" and self.dtype not in DTYPE_NAMES:
            raise ValueError(f"dtype must be auto or one of {sorted(DTYPE_NAMES)}")
        if self.kv_cache_dtype != "auto" and self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"kv_cache_dtype must be auto or one of {sorted(KV_CACHE_DTYPES)}")
        if self.mamba_ssm_dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError("mamba_ssm_dtype must be float32, bfloat16 or float16")
        quantization.check_lm_head_dtype(self.cpu_lm_head_dtype, self.torchao_config)
        if self.cpu_packed_lm_weights not in ("auto", "on", "off"):
            raise ValueError("cpu_packed_lm_weights must be auto, on or off")
        if self.cpu_bf16_weights not in ("auto", "on", "off"):
            raise ValueError("cpu_bf16_weights must be auto, on or off")
        if self.mm_video_cache not in ("per-group", "whole"):
            raise ValueError("mm_video_cache must be per-group or whole")
        quantization.check_quantization_flag(self.quantization)
        quantization.parse_torchao_config(self.torchao_config)
        quantization.check_torchao_dtype(self.torchao_config, self.dtype)
        if self.vision_int8dq and not quantization.dynamic_activations(self.torchao_config):
            raise ValueError("--vision-int8dq goes with --torchao-config int8dq or 8da4w-<group>")

    @property
    def serves_pooling(self) -> bool:
        """--is-embedding, or a checkpoint that declares pooling."""
        return self.is_embedding or is_pooling_checkpoint(self.model_path)

    @property
    def resolved_device(self) -> str:
        if self.device is not None:
            return self.device
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"

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
