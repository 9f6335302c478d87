"""The model side of an encoder-only worker (``--encoder-only``): the vision tower and projector
of a checkpoint with no language-model layers and a one-row vocabulary, its processor, and the
embedder with its per-image cache. It loads no decoder weight: the config it loads the
checkpoint with has none, so the checkpoint's decoder tensors are never read."""

from __future__ import annotations

import copy
import io
import logging
from typing import Any

import torch
import transformers
from PIL import Image

from sglang.srt.core.mm_item import MultimodalItem
from sglang.srt.core.perf_counters import PerfCounters
from sglang.srt.layers.quantization.base import linear_methods
from sglang.srt.layers.quantization.checkpoint_formats import read_format
from sglang.srt.mem_cache.mm_embedding_cache import CachedEmbedding
from sglang.srt.model_executor.dtypes import dtype_name, resolve_launch_dtypes
from sglang.srt.model_executor.engine_config import EngineConfig
from sglang.srt.model_executor.host_memory import module_bytes
from sglang.srt.model_executor.mm_fingerprint import worker_fingerprint
from sglang.srt.model_executor.model_loader import (
    build_embedder,
    compile_if_asked,
    install_encoder_kernels,
    load_config,
    load_model,
)
from sglang.srt.model_executor.prequantized import prequantized_config
from sglang.srt.model_executor.quantization import (
    QuantizationReport,
    parse_torchao_config,
    quantize_vision_tower,
)
from sglang.srt.models.adapters import get_adapter
from sglang.srt.multimodal.hf_processor import load_hf_processor
from sglang.srt.multimodal.image_io import load_image
from sglang.srt.multimodal.processor import MultimodalProcessor

logger = logging.getLogger(__name__)


def tower_only_config(config: Any) -> Any:
    """``config`` with a language model of no layers and one vocabulary row."""
    config = copy.deepcopy(config)
    text = config.get_text_config()
    text.num_hidden_layers = 0
    if getattr(text, "layer_types", None) is not None:
        text.layer_types = []
    text.vocab_size = 1
    text.pad_token_id = None  # an embedding's padding row must lie inside its one row
    return config


class EncoderRunner:
    def __init__(self, args: EngineConfig, model_path: str) -> None:
        self.args = args
        self.model_path = model_path
        self.device = args.resolved_device
        self.config = load_config(args, model_path)
        if not hasattr(self.config, "vision_config"):
            raise ValueError("an encoder-only worker serves a model with a vision tower")
        choice = resolve_launch_dtypes(args, self.config)[0]
        self.dtype = choice.dtype
        self.perf = PerfCounters()
        tower_config = tower_only_config(self.config)
        published = read_format(self.config)
        if published is not None:  # its tower's quantized linears (if any) load as published
            tower_config = prequantized_config(tower_config, published, model_path, tower_only=True)
        verbosity = transformers.logging.get_verbosity()
        transformers.logging.set_verbosity_error()  # the decoder's tensors are left unread
        try:
            self.model = load_model(
                model_path,
                self.config,
                self.dtype,
                args,
                self.perf,
                weight_dtype=choice.weight_dtype,
                load_config=tower_config,
                ignore_mismatched_sizes=True,
            )
        finally:
            transformers.logging.set_verbosity(verbosity)
        self.adapter = get_adapter(self.model, self.config)
        self.quantization = None
        spec = parse_torchao_config(args.torchao_config)
        if spec is not None and self.device == "cpu":  # the tower as the language worker has it
            self.quantization = QuantizationReport(args.torchao_config)
            quantize_vision_tower(
                self.model, self.adapter.language_model, self.quantization, args.vision_int8dq
            )
        if self.device == "cpu" and self.dtype == torch.bfloat16:
            install_encoder_kernels(self.model, self.adapter.language_model)
        compile_if_asked(self.model, self.config, args)
        self.processor = MultimodalProcessor(
            model_path, self.config, hf_processor=load_hf_processor(model_path)
        )
        preprocessor = self.processor.preprocessor
        self.fingerprint = worker_fingerprint(
            args, model_path, preprocessor, self.dtype, self.quantization
        )
        # An encoder's store entries are keyed by pixels (remote_encoder), not by prompt items.
        self.embedder = build_embedder(
            args, self.adapter, preprocessor, self.dtype, self.fingerprint
        )
        self.weights_bytes = module_bytes(self.model)
        self.language_model_bytes = module_bytes(self.adapter.language_model)
        self.linear_methods = linear_methods(self.model)  # fixed once loaded
        logger.info(
            "encoder-only: %.1f MiB of weights (language model %.1f MiB), fingerprint %s",
            self.weights_bytes / 2**20,
            self.language_model_bytes / 2**20,
            self.fingerprint,
        )

    def encode(self, items: list[MultimodalItem]) -> dict[int, CachedEmbedding]:
        """Each item's embedding: from the cache or the shared store, else encoded (and kept
        in both)."""
        unique = list({item.hash: item for item in items}.values())
        found, shared, encoded = self.embedder.resolve(unique)
        return {**found, **shared, **encoded}

    def probe(self) -> None:
        """Encode a small grey image end to end (a health check; cached after the first)."""
        image = Image.new("RGB", (64, 64), (128, 128, 128))
        buf = io.BytesIO()
        image.save(buf, format="PNG")
        self.encode([self.processor.image_item(load_image(buf.getvalue()))])

    def info(self) -> dict[str, Any]:
        return {
            "encoder_only": True,
            "model_path": self.model_path,
            "dtype": dtype_name(self.dtype),
            "fingerprint": self.fingerprint,
            "mm_embedding_cache": {
                **self.embedder.stats.as_dict(),
                **self.embedder.cache.stats(),
            },
            "memory": {
                "weights_bytes": self.weights_bytes,
                "language_model_weights_bytes": self.language_model_bytes,
            },
            "weight_quantization": self.quantization.as_dict() if self.quantization else None,
            "linear_methods": self.linear_methods,
            "mm_global_cache": self.embedder.store.stats() if self.embedder.store else None,
        }
