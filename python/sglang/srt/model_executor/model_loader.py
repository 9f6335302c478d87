"""From a checkpoint folder to a model ready to serve, for both runners (the language worker's
``ModelRunner`` and the encoder-only ``EncoderRunner``): the config and the checks that refuse a
model before its weights load, the HF model on the engine's attention, the weights rewritten for
the launch's quantization, the native CPU kernels installed, and the chunk-aware embedder.

The order is fixed: check, load, quantize, install kernels, compile. Quantization replaces
linears, and the kernels wrap whatever linears are left, so installing them first would pack
weights that quantization then throws away; torch.compile traces what is there when it runs.
"""

from __future__ import annotations

import functools
import logging
from collections import Counter
from dataclasses import dataclass
from typing import Any

import torch
import transformers
from transformers import AutoConfig

from sglang.srt.core.forward_batch import ForwardBatch
from sglang.srt.core.perf_counters import PerfCounters, instrument_vision
from sglang.srt.layers import native_activation, native_norm, native_rotary
from sglang.srt.layers.quantization import bf16_weights, decode_linear, packed_linear
from sglang.srt.layers.quantization.checkpoint_formats import (
    PrequantizedFormat,
    check_method_flag,
    read_format,
)
from sglang.srt.mem_cache.mm_embedding_cache import MultimodalEmbeddingCache
from sglang.srt.model_executor.dtypes import cpu_bfloat16_isa
from sglang.srt.model_executor.engine_config import EngineConfig
from sglang.srt.model_executor.mm_fingerprint import shared_store
from sglang.srt.model_executor.prequantized import prequantized_config
from sglang.srt.model_executor.quantization import (
    QuantizationReport,
    apply_torchao_config,
    copy_out_of_checkpoint,
    quantize_head_and_embeddings,
    quantize_vision_tower,
)
from sglang.srt.models import fast_vision
from sglang.srt.models.adapters import ModelAdapter, get_adapter, load_vlm
from sglang.srt.multimodal.embedder import MultimodalEmbedder
from sglang.srt.multimodal.processor import ImagePreprocessor
from sglang.srt.multimodal.remote_encoder import RemoteEncoders

logger = logging.getLogger(__name__)

ATTENTION_NAME = "sglang_engine"


def _engine_attention(module, query, key, value, attention_mask, scaling=None, **kwargs):
    batch: ForwardBatch = kwargs["forward_batch"]
    out = batch.attn_backend.forward(
        query,
        key,
        value,
        module.kv_layer_idx,
        batch,
        scaling=scaling if scaling is not None else module.head_dim**-0.5,
        sliding_window=kwargs.get("sliding_window"),
        softcap=kwargs.get("softcap"),
        save_kv=not module.kv_shared,
    )
    return out, None


transformers.AttentionInterface.register(ATTENTION_NAME, _engine_attention)


def load_config(args: EngineConfig, model_path: str) -> Any:
    """The checkpoint's config; a model no adapter can serve fails here, before its weights."""
    config = AutoConfig.from_pretrained(model_path, trust_remote_code=args.trust_remote_code)
    get_adapter(None, config)
    return config


def published_format(args: EngineConfig, config: Any) -> PrequantizedFormat | None:
    """The format of a checkpoint published quantized (None: not), refused where the launch
    cannot serve it: on CUDA, or with ``--torchao-config`` on top."""
    published = read_format(config)
    check_method_flag(args.quantization, published)
    if published and args.resolved_device != "cpu":
        raise ValueError(
            f"a checkpoint published quantized ({published.label}) loads on the CPU "
            "only; on CUDA serve its unquantized weights with --torchao-config"
        )
    if published and args.torchao_config:
        raise ValueError(
            f"--torchao-config {args.torchao_config}: the checkpoint is already quantized "
            f"({published.label})"
        )
    return published


def load_model(
    model_path: str,
    config: Any,
    dtype: torch.dtype,
    args: EngineConfig,
    perf: PerfCounters,
    prequantized: PrequantizedFormat | None = None,
    weight_dtype: torch.dtype | None = None,
    **kwargs: Any,
) -> torch.nn.Module:
    """The HF model on ``args``' device, its language model on the engine's attention and its
    vision tower on SDPA (and the fast vision paths); ``kwargs`` go to ``from_pretrained``. A
    ``prequantized`` checkpoint's linears load straight into the native quantized layouts. With
    ``weight_dtype`` (bfloat16, under a float32 ``dtype``) the model loads in bfloat16 and all
    but its linear and embedding weights are widened (``bf16_weights``)."""
    multimodal = hasattr(config, "vision_config")
    if prequantized is not None:
        kwargs["load_config" if multimodal else "config"] = prequantized_config(
            config, prequantized, model_path
        )
    if multimodal:
        load = functools.partial(load_vlm, config=config)
        attn = {"text_config": ATTENTION_NAME, "vision_config": "sdpa", "": "sdpa"}
    else:
        load = transformers.AutoModelForCausalLM.from_pretrained
        attn = ATTENTION_NAME
    transformers.utils.logging.disable_progress_bar()
    load_dtype = weight_dtype or dtype
    kwargs = {"dtype": load_dtype, "trust_remote_code": args.trust_remote_code, **kwargs}
    try:
        model = load(model_path, attn_implementation=attn, **kwargs)
    except ValueError as exc:
        if not multimodal or "scaled_dot_product_attention" not in str(exc):
            raise
        # A vision tower without SDPA (GOT-OCR 2's SAM encoder) runs its eager attention.
        attn = {**attn, "vision_config": "eager", "": "eager"}
        model = load(model_path, attn_implementation=attn, **kwargs)
    model = model.to(args.resolved_device).eval()
    if weight_dtype is not None:
        stored = bf16_weights.store_in_bfloat16(model, [model.get_input_embeddings()])
        logger.info(
            "weights in bfloat16, computed in float32: %d linears and %d embeddings (%.1f GiB)",
            stored.linears, stored.embeddings, stored.bfloat16_bytes / 2**30,
        )  # fmt: skip
    if multimodal and fast_vision.install(model, config, perf):
        instrument_vision(model.model.visual, perf)
    return model


def compile_if_asked(model: torch.nn.Module, config: Any, args: EngineConfig) -> None:
    """``--enable-torch-compile``: the Qwen-VL towers' blocks, compiled once the kernels and
    the linears' methods are in place (compiling first would trace what they then replace)."""
    if args.enable_torch_compile and config.model_type in fast_vision.FAST_VISION_MODEL_TYPES:
        fast_vision.compile_tower(model)


def quantize(
    model: torch.nn.Module, adapter: ModelAdapter, args: EngineConfig
) -> QuantizationReport | None:
    """``--torchao-config`` applied to the language model, its head and embeddings and (as the
    flags ask) the vision tower; what is left on the checkpoint's mapping is copied off it."""
    report = apply_torchao_config(adapter.language_model, args.torchao_config)
    if report is None:
        return None
    quantize_head_and_embeddings(model, adapter.language_model, report, args.cpu_lm_head_dtype)
    quantize_vision_tower(model, adapter.language_model, report, args.vision_int8dq)
    copy_out_of_checkpoint(model)
    return report


@dataclass(frozen=True)
class KernelPlan:
    """What ``install_cpu_kernels`` did: LM linears holding only packed panels, and the bytes of
    packed copies kept beside plain weights for prompt chunks (``--cpu-packed-lm-weights on``)."""

    lm_packed_only: int = 0
    lm_packed_copy_bytes: int = 0


def install_cpu_kernels(
    model: torch.nn.Module,
    adapter: ModelAdapter,
    args: EngineConfig,
    dtype: torch.dtype,
    quantized: bool,
) -> KernelPlan:
    """The native CPU kernels a launch's dtype takes: in bfloat16 the LM's linears (packed or
    decode-sized) and the encoder's; in float32 on a CPU without bfloat16 arithmetic, the decode
    batches' linears. Nothing on CUDA."""
    if args.resolved_device != "cpu":
        return KernelPlan()
    head = model.get_output_embeddings()
    if dtype == torch.float32 and not cpu_bfloat16_isa():
        linears = [*adapter.language_model.modules(), head]
        routed = decode_linear.install(linears, torch.float32)
        logger.info("decode batches' float32 linears on the native kernel: %d", routed)
        return KernelPlan()
    if dtype != torch.bfloat16:
        return KernelPlan()
    plan = _route_lm_linears(model, adapter, head, args.cpu_packed_lm_weights)
    install_encoder_kernels(model, adapter.language_model)
    if plan.lm_packed_only and not quantized:
        copied = copy_out_of_checkpoint(model)  # what packing left on the mapping
        logger.info("%.1f MiB not packed copied off the checkpoint", copied / 2**20)
    return plan


def _route_lm_linears(
    model: torch.nn.Module, adapter: ModelAdapter, head: torch.nn.Module, setting: str
) -> KernelPlan:
    """One layout per bfloat16 linear of the language model and its head: the native GEMM's
    packed panels, which serve prompt chunks and decode rows alike, where the CPU has that
    GEMM; elsewhere the plain weight, read by the decode kernel and torch's product (with a
    oneDNN-packed copy beside it for prompt chunks only if asked for). A weight another module
    shares stays plain, but for a head tied to the input embeddings (see ``_pack_tied_head``)."""
    linears = [*adapter.language_model.modules(), head]
    packed = 0
    if setting != "off":
        counts = Counter(id(p) for _, p in model.named_parameters(remove_duplicate=False))
        own = [m for m in linears if counts[id(getattr(m, "weight", None))] == 1]
        packed = packed_linear.install(own, native_only=True)
        packed += _pack_tied_head(model, head, counts)
        logger.info("language-model linears on the native GEMM, packed only: %d", packed)
    routed = decode_linear.install(linears)
    logger.info("decode-sized bfloat16 linears on the native kernel: %d", routed)
    copy_bytes = 0
    if setting == "on":
        plain = [m for m in linears[:-1] if not packed_linear.holds_only_packed(m)]
        copies = packed_linear.add_packed_copies(plain)
        copy_bytes = sum(getattr(m, "packed_weight_bytes", 0) for m in plain)
        logger.info("language-model linears with packed copies for prompts: %d", copies)
    return KernelPlan(packed, copy_bytes)


def _pack_tied_head(model: torch.nn.Module, head: torch.nn.Module, counts: Counter[int]) -> int:
    """A head tied to the input embeddings (and nothing else) is packed too where the
    embedding can read its rows from the head's panels: decode steps multiply every row by
    the head, which is the largest matrix of a small model."""
    embed = model.get_input_embeddings()
    if counts[id(getattr(head, "weight", None))] != 2:  # shared with the embeddings only
        return 0
    if not packed_linear.lookups_can_move_to(embed, head):
        return 0
    if not packed_linear.install([head], native_only=True):
        return 0
    assert packed_linear.serve_lookups_from_head(embed, head)
    logger.info("tied LM head packed; the input embeddings read its panels")
    return 1


def install_encoder_kernels(model: torch.nn.Module, language_model: torch.nn.Module) -> None:
    """bfloat16 on a CPU: the vision tower's and projector's linears on packed weights, their
    QuickGELUs, every SiLU-gated MLP, every Llama-style RMSNorm and rotary embedding on the
    native kernels."""
    head = model.get_output_embeddings()
    in_lm = {id(m) for m in language_model.modules()} | {id(head)}
    encoder = [m for m in model.modules() if id(m) not in in_lm]
    logger.info("encoder linears with packed weights: %d", packed_linear.install(encoder))
    logger.info("encoder QuickGELUs on the native kernel: %d", native_activation.install(encoder))
    gated = native_activation.install_gated_silu(model.modules())
    logger.info("SiLU-gated MLPs on the native kernel: %d", gated)
    logger.info("RMSNorms on the native kernel: %d", native_norm.install_rms_norms(model.modules()))
    rotary = native_rotary.install(model.modules())
    logger.info("modeling modules with rotary embeddings on the native kernel: %d", rotary)


def build_embedder(
    args: EngineConfig,
    adapter: Any,
    preprocessor: ImagePreprocessor,
    dtype: torch.dtype,
    fingerprint: str,
    remote: RemoteEncoders | None = None,
) -> MultimodalEmbedder:
    """A worker's embedder (language or encoder-only): its per-image cache, and the fleet's
    store under ``fingerprint`` when one is shared (empty: none)."""
    return MultimodalEmbedder(
        adapter,
        preprocessor,
        MultimodalEmbeddingCache(args.mm_cache_bytes),
        args.resolved_device,
        dtype,
        args.mm_encoder_token_budget or max(args.chunked_prefill_size or 8192, 1024),
        args.mm_cache_mode,
        video_groups=args.mm_video_cache == "per-group",
        store=shared_store(args, fingerprint) if fingerprint else None,
        remote=remote,
    )
