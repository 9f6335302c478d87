"""What makes two workers' image embeddings interchangeable: the fingerprint that prefixes every
key of the shared embedding store.

It covers the checkpoint (its config and, per weight file, the name, the size, the safetensors
header and sampled bytes of the data: a fine-tune of the same shape differs there), the
preprocessing (the image processor's settings and kwargs, the video sampling settings, how videos
are cached), the embeddings' dtype, the vision tower's quantization, and an optional namespace
the operator sets. The item key then adds the image content and its prompt context.
"""

from __future__ import annotations

import dataclasses
import glob
import hashlib
import json
import logging
import os
import struct
from typing import TYPE_CHECKING, Any

import torch

from sglang.srt.mem_cache.embedding_store import EmbeddingStore, open_embedding_store

if TYPE_CHECKING:
    from sglang.srt.model_executor.engine_config import EngineConfig
    from sglang.srt.model_executor.quantization import QuantizationReport

logger = logging.getLogger(__name__)

FORMAT_VERSION = b"mm-fingerprint-1"
SAMPLE_BYTES = 1 << 16
WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.pt", "*.gguf")


def checkpoint_identity(model_path: str) -> bytes:
    """A digest of the checkpoint's config and weight files, reading about 200 KiB per file."""
    h = hashlib.blake2b(digest_size=16)
    for name in ("config.json", "preprocessor_config.json", "video_preprocessor_config.json"):
        path = os.path.join(model_path, name)
        if os.path.exists(path):
            with open(path, "rb") as f:
                h.update(name.encode() + b"\0" + f.read())
    files = sorted({p for pattern in WEIGHT_PATTERNS for p in glob.glob(f"{model_path}/{pattern}")})
    for path in files:
        size = os.path.getsize(path)
        h.update(os.path.basename(path).encode() + struct.pack("<Q", size))
        with open(path, "rb") as f:
            data_start = 0
            if path.endswith(".safetensors") and size >= 8:
                (header_len,) = struct.unpack("<Q", f.read(8))
                header_len = min(header_len, size - 8)
                h.update(f.read(header_len))
                data_start = 8 + header_len
            for offset in _sample_offsets(data_start, size):
                f.seek(offset)
                h.update(f.read(SAMPLE_BYTES))
    return h.digest()


def _sample_offsets(start: int, end: int) -> list[int]:
    """The start, middle and end of [start, end), each ``SAMPLE_BYTES`` long where it fits."""
    last = max(start, end - SAMPLE_BYTES)
    return sorted({start, start + (last - start) // 2, last})


def embedding_fingerprint(
    model_path: str,
    processor_settings: bytes,
    video_settings: object,
    video_cache: str,
    dtype: torch.dtype,
    tower_quantization: str,
    namespace: str = "",
) -> str:
    """The hex fingerprint (32 characters) of everything an embedding depends on but the item."""
    video = json.dumps(dataclasses.asdict(video_settings), sort_keys=True, default=str)
    h = hashlib.blake2b(FORMAT_VERSION, digest_size=16)
    for part in (
        checkpoint_identity(model_path),
        processor_settings,
        video.encode(),
        video_cache.encode(),
        str(dtype).encode(),
        tower_quantization.encode(),
        namespace.encode(),
    ):
        h.update(struct.pack("<Q", len(part)) + part)
    return h.hexdigest()


def worker_fingerprint(
    args: EngineConfig,
    model_path: str,
    preprocessor: Any,
    dtype: torch.dtype,
    quantization: QuantizationReport | None,
) -> str:
    """The fingerprint of a worker (language or encoder-only) built from ``args``."""
    tower = "none"
    if quantization and quantization.vision_layers:
        tower = "int8dq" if quantization.vision_int8dq else "int8"
    return embedding_fingerprint(
        model_path,
        preprocessor.settings_hash,
        preprocessor.video_settings,
        args.mm_video_cache,
        dtype,
        tower,
        args.mm_global_cache_namespace,
    )


def shared_store(args: EngineConfig, fingerprint: str) -> EmbeddingStore | None:
    """The fleet's embedding store under ``fingerprint``, with ``--enable-mm-global-cache``."""
    if not args.enable_mm_global_cache:
        return None
    url = args.mm_global_cache_url
    logger.info("shared embedding store %s, fingerprint %s", url, fingerprint)
    return open_embedding_store(
        url, fingerprint, args.mm_global_cache_ttl or None, args.mm_global_cache_timeout
    )


def kv_fingerprint(runner: Any, page_size: int, kv_format: str = "kv-fingerprint-1") -> str:
    """The fingerprint of a worker's prefix KV pages: its embeddings' fingerprint (checkpoint,
    preprocessing, dtype, the tower's quantization) plus the language model's quantization, the
    KV dtype, the pool layout and the page size. Two workers share pages only when all agree."""
    embeddings = worker_fingerprint(
        runner.args, runner.model_path, runner.embedder.preprocess, runner.dtype,
        runner.quantization,
    )  # fmt: skip
    parts = {
        "embeddings": embeddings,
        "weights": runner.weight_quantization(),
        "lm_head": runner.args.cpu_lm_head_dtype if runner.args.torchao_config else "",
        "kv_dtype": str(runner.kv_cache_dtype),
        "layers": runner.kv_pool.layer_shapes,
        "page_size": page_size,
    }
    h = hashlib.blake2b(kv_format.encode(), digest_size=16)
    h.update(json.dumps(parts, sort_keys=True, default=str).encode())
    return h.hexdigest()
