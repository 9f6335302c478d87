"""Server arguments: the model runner's ``EngineConfig`` plus the scheduler's and the HTTP
server's fields, one frozen dataclass; the CLI is derived from the fields."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from dataclasses import dataclass, field, fields
from typing import Any, get_type_hints

from sglang.srt.function_call import get_tool_call_parser
from sglang.srt.mem_cache.embedding_store import check_store_url
from sglang.srt.model_executor.engine_config import EngineConfig
from sglang.srt.multimodal.media_fetch import FetchPolicy


@dataclass(frozen=True)
class ServerArgs(EngineConfig):
    # Model
    served_model_name: str | None = field(
        default=None,
        metadata={"help": "Model name in API responses and /v1/models (default: the model path)."},
    )
    chat_template: str | None = field(
        default=None,
        metadata={
            "help": "A Jinja chat template, inline or a .jinja file (default: the model's own). "
            "One of SGLang's template names (e.g. chatml-llava) keeps the model's own, with a "
            "warning."
        },
    )
    enable_multimodal: bool | None = field(
        default=None, metadata={"help": "Serve images (on by default for VLM folders)."}
    )

    tp_size: int = field(
        default=1,
        metadata={
            "help": "Tensor-parallel size; only 1 (one process serves the model).",
            "aliases": ("--tensor-parallel-size", "--tp"),
        },
    )

    # Memory and scheduling
    max_prefill_tokens: int = field(
        default=16384, metadata={"help": "Most prompt tokens one prefill batch takes."}
    )
    schedule_policy: str = field(
        default="fcfs", metadata={"help": "Waiting-queue order: fcfs (the only one implemented)."}
    )
    enable_mixed_chunk: bool = field(
        default=False,
        metadata={
            "help": "Running requests take their decode step inside a batch that runs a prompt "
            "chunk instead of waiting for it (not for linear-attention models)."
        },
    )
    # Hierarchical cache: prefix KV pages in a store every worker reaches
    enable_hierarchical_cache: bool = field(
        default=False,
        metadata={
            "help": "Keep prefix KV pages in --hicache-storage-backend too, so a conversation "
            "that moves to another worker or outlives a restart prefills only its new tokens.",
            "aliases": ("--enable-hicache",),
        },
    )
    hicache_storage_backend: str | None = field(
        default=None,
        metadata={
            "help": "file (a directory every worker reaches: SGLANG_HICACHE_FILE_BACKEND_"
            "STORAGE_DIR, else file_storage_path in the extra config, else /tmp/hicache) or "
            "redis (url in the extra config, else --mm-global-cache-url)."
        },
    )
    hicache_write_policy: str = field(
        default="write_through",
        metadata={
            "help": "write_through: a request's full pages are written when it ends; "
            "write_back: when the radix cache evicts them; write_through_selective: only "
            "pages a request found cached (reused at least once)."
        },
    )
    hicache_storage_prefetch_policy: str = field(
        default="timeout",
        metadata={
            "help": "When a waiting request stops waiting for its pages: best_effort (at its "
            "turn, with what has arrived), wait_complete, timeout (prefetch_timeout_base + "
            "prefetch_timeout_per_ki_token per 1024 tokens, seconds)."
        },
    )
    hicache_storage_backend_extra_config: str | None = field(
        default=None,
        metadata={
            "help": "JSON: url, file_storage_path, prefetch_threshold (tokens, default 0; "
            "fewer missing are computed), prefetch_timeout_base, prefetch_timeout_per_ki_token, "
            "write_mb_per_s (the writer's bandwidth), max_pending_write_mb, ttl_s."
        },
    )
    page_size: int | None = field(
        default=None,
        metadata={"help": "Tokens in a stored KV page (default 64; the radix cache is per token)."},
    )
    random_seed: int | None = field(
        default=None,
        metadata={
            "help": "Seed torch's generator at start-up (sampling with a per-request seed is "
            "reproducible regardless)."
        },
    )
    watchdog_timeout: float = field(
        default=300.0,
        metadata={
            "help": "Exit (so a supervisor restarts the server) when one scheduler step "
            "runs longer than this many seconds."
        },
    )

    gc_warning_threshold_secs: float = field(
        default=0.0,
        metadata={
            "help": "Log a warning for every garbage collection of the server's compute process "
            "that takes longer than this many seconds (0: off)."
        },
    )

    # Threads
    decode_threads: int = field(
        default=0,
        metadata={
            "help": "CPU threads for decode steps (0: one thread when the language model's "
            "hidden size is below 768, else all; prompt chunks always use all)."
        },
    )

    # Chat
    reasoning_parser: str | None = field(
        default=None, metadata={"help": "qwen3: split <think>...</think> into reasoning_content."}
    )

    # Multimodal limits
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
    host: str = field(default="127.0.0.1", metadata={"help": "Address the HTTP server listens on."})
    port: int = field(default=30000, metadata={"help": "Port the HTTP server listens on."})
    api_key: str | None = field(
        default=None,
        metadata={
            "help": "Require 'Authorization: Bearer KEY' on every API route (not on /health, "
            "/metrics or the chat page itself)."
        },
    )
    enable_metrics: bool = field(
        default=False, metadata={"help": "Serve Prometheus metrics at /metrics."}
    )
    enable_custom_logit_processor: bool = field(
        default=False,
        metadata={
            "help": "Accept requests' custom_logit_processor (a pickled class the scheduler "
            "runs: only for clients you trust)."
        },
    )
    enable_cache_report: bool = field(
        default=False,
        metadata={
            "help": "Report prompt tokens served from the prefix cache in "
            "usage.prompt_tokens_details.cached_tokens."
        },
    )
    log_level: str = field(
        default="info", metadata={"help": "Logging level: debug, info, warning, error."}
    )
    allowed_local_media_path: str | None = field(
        default=None,
        metadata={
            "help": "Folder under which local image and video paths (file:// or plain) may be "
            "read; none by default."
        },
    )
    media_url_max_file_size_mb: int = field(
        default=20, metadata={"help": "Largest image or video download in MB."}
    )
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
    disable_chat_page: bool = field(
        default=False, metadata={"help": "Do not serve the chat page at /."}
    )
    max_request_body_mb: int = field(
        default=64, metadata={"help": "Larger request bodies are answered 413 before parsing."}
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.max_prefill_tokens <= 0:
            raise ValueError("max_prefill_tokens must be positive")
        if self.tp_size != 1:
            raise ValueError(f"only --tp-size 1 is served (one process), not {self.tp_size}")
        if self.schedule_policy != "fcfs":
            raise ValueError(
                f"only the fcfs schedule policy is implemented, not {self.schedule_policy!r}"
            )
        if self.reasoning_parser not in (None, "qwen3"):
            raise ValueError(f"unknown reasoning parser {self.reasoning_parser!r} (qwen3)")
        if self.tool_call_parser is not None:
            get_tool_call_parser(self.tool_call_parser)
        if self.watchdog_timeout <= 0:
            raise ValueError("watchdog_timeout must be positive")
        if self.gc_warning_threshold_secs < 0:
            raise ValueError("gc_warning_threshold_secs must be 0 (off) or positive")
        if self.decode_threads < 0:
            raise ValueError("decode_threads must be 0 (auto) or positive")
        if self.max_request_body_mb <= 0:
            raise ValueError("max_request_body_mb must be positive")
        if self.limit_mm_data_per_request is not None:
            self.mm_limit("image")  # validates the JSON
        _ = self.hicache  # validates the hierarchical cache's flags

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
    def hicache(self) -> HiCacheSettings | None:
        """The hierarchical cache's settings (None: off); raises ValueError on bad flags."""
        if not self.enable_hierarchical_cache:
            if self.hicache_storage_backend is not None:
                raise ValueError("--hicache-storage-backend needs --enable-hierarchical-cache")
            return None
        return HiCacheSettings.from_args(self)

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

    def replace(self, **changes: Any) -> ServerArgs:
        return dataclasses.replace(self, **changes)

    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser) -> None:
        hints = get_type_hints(ServerArgs)
        for f in fields(ServerArgs):
            flags = ["--" + f.name.replace("_", "-"), *f.metadata.get("aliases", ())]
            help_text = f.metadata.get("help", "")
            hint = hints[f.name]
            if hint is bool or hint == bool | None:
                parser.add_argument(
                    *flags, dest=f.name, action="store_true", default=f.default, help=help_text
                )
                continue
            if hint == list[str] | None:
                parser.add_argument(
                    *flags, dest=f.name, nargs="+", default=f.default, help=help_text
                )
                continue
            base = _base_type(hint)
            parser.add_argument(*flags, dest=f.name, type=base, default=f.default, help=help_text)

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> ServerArgs:
        return cls(**{f.name: getattr(args, f.name) for f in fields(cls)})


HICACHE_BACKENDS = ("file", "redis")
HICACHE_WRITE_POLICIES = ("write_through", "write_back", "write_through_selective")
HICACHE_PREFETCH_POLICIES = ("best_effort", "wait_complete", "timeout")
DEFAULT_HICACHE_PAGE_SIZE = 64


@dataclass(frozen=True)
class HiCacheSettings:
    """The hierarchical cache's flags and extra config, validated."""

    backend: str
    location: str  # a directory (file) or a URL (redis)
    page_size: int
    write_policy: str
    prefetch_policy: str
    prefetch_threshold: int = 0  # SGLang's GPU default is 256; on a CPU a page computes slowly
    prefetch_timeout_base: float = 1.0
    prefetch_timeout_per_ki_token: float = 0.25
    write_mb_per_s: float = 1024.0
    max_pending_write_mb: float = 512.0
    ttl_s: float | None = None

    @classmethod
    def from_args(cls, args: ServerArgs) -> HiCacheSettings:
        backend = args.hicache_storage_backend
        if backend not in HICACHE_BACKENDS:
            raise ValueError(
                "--enable-hierarchical-cache keeps pages in a storage backend here (the KV pool "
                f"is host memory already): --hicache-storage-backend {'|'.join(HICACHE_BACKENDS)}"
                f", not {backend!r}"
            )
        if args.hicache_write_policy not in HICACHE_WRITE_POLICIES:
            raise ValueError(f"hicache_write_policy must be one of {HICACHE_WRITE_POLICIES}")
        if args.hicache_storage_prefetch_policy not in HICACHE_PREFETCH_POLICIES:
            raise ValueError(
                f"hicache_storage_prefetch_policy must be one of {HICACHE_PREFETCH_POLICIES}"
            )
        if args.disable_radix_cache:
            raise ValueError("--enable-hierarchical-cache stores the radix cache's pages")
        extra = _json_object(args.hicache_storage_backend_extra_config)
        known = {f.name for f in fields(cls)} - {"backend", "location", "page_size"}
        unknown = set(extra) - known - {"url", "file_storage_path"}
        if unknown:
            raise ValueError(f"unknown hicache extra config keys {sorted(unknown)}")
        if backend == "file":
            location = (
                os.environ.get("SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR")
                or extra.get("file_storage_path")
                or "/tmp/hicache"
            )
        else:
            location = extra.get("url") or args.mm_global_cache_url
            check_store_url(location)
        page_size = args.page_size or DEFAULT_HICACHE_PAGE_SIZE
        settings = cls(
            backend,
            str(location),
            page_size,
            args.hicache_write_policy,
            args.hicache_storage_prefetch_policy,
            **{k: v for k, v in extra.items() if k in known},
        )
        numbers = (settings.prefetch_timeout_base, settings.prefetch_timeout_per_ki_token)
        if page_size <= 0 or settings.prefetch_threshold < 0 or min(numbers) < 0:
            raise ValueError("page_size must be positive, the prefetch settings >= 0")
        if settings.write_mb_per_s <= 0 or settings.max_pending_write_mb <= 0:
            raise ValueError("write_mb_per_s and max_pending_write_mb must be positive")
        return settings


def _json_object(text: str | None) -> dict[str, Any]:
    if not text:
        return {}
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"hicache_storage_backend_extra_config is not JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise ValueError("hicache_storage_backend_extra_config must be a JSON object")
    return value


def _base_type(hint: Any) -> type:
    for candidate in (int, float, str):
        if hint is candidate or hint == candidate | None:
            return candidate
    raise TypeError(f"unsupported server-arg type {hint}")
