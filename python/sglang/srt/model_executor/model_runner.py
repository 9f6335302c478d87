"""Loads an HF model, owns the KV pools, and runs one forward per batch."""

from __future__ import annotations

import logging
import time
from typing import Any

import torch

from sglang.srt.core.forward_batch import ForwardBatch, PromptLogprobs
from sglang.srt.core.perf_counters import PerfCounters, wait_for_device
from sglang.srt.core.req import Pairs, Req, logprob_alternatives
from sglang.srt.layers.attention import create_attention_backend, default_attention_backend
from sglang.srt.layers.pooler import Head, chunk_parts
from sglang.srt.layers.pooling_config import PoolingConfig
from sglang.srt.layers.quantization import packed_linear
from sglang.srt.layers.quantization.base import linear_methods
from sglang.srt.layers.quantization.quantized_linear import QuantizedLinear
from sglang.srt.mem_cache.kv_layout import KVLayout
from sglang.srt.mem_cache.memory_pool import KVPool, ReqToTokenPool
from sglang.srt.mem_cache.pools import Pools
from sglang.srt.mem_cache.state_pool import StatePool
from sglang.srt.model_executor import host_memory, memory
from sglang.srt.model_executor.dtypes import dtype_name, resolve_launch_dtypes
from sglang.srt.model_executor.engine_config import EngineConfig
from sglang.srt.model_executor.linear_attention import install_pooled_linear_attention
from sglang.srt.model_executor.mm_fingerprint import worker_fingerprint
from sglang.srt.model_executor.model_loader import (
    build_embedder,
    compile_if_asked,
    install_cpu_kernels,
    load_config,
    load_model,
    published_format,
    quantize,
)
from sglang.srt.model_executor.pooling_head import build_pooling
from sglang.srt.models.adapters import get_adapter
from sglang.srt.multimodal.hf_processor import load_hf_processor
from sglang.srt.multimodal.processor import ImagePreprocessor
from sglang.srt.multimodal.remote_encoder import RemoteEncoders
from sglang.srt.multimodal.video_preprocess import VideoSettings

logger = logging.getLogger(__name__)

PROMPT_LOGPROB_ROWS = 256  # prompt positions whose logits exist at once
# Hybrid models: shares of the cache budget for linear-attention state (unless set by flags).
STATE_REQUESTS_FRACTION = 0.25
STATE_SNAPSHOTS_FRACTION = 0.1


class ModelRunner:
    def __init__(self, args: EngineConfig, model_path: str) -> None:
        self.args = args
        self.model_path = model_path
        self.device = args.resolved_device
        self.config = load_config(args, model_path)
        self.text_config = self.config.get_text_config()
        self.prequantized = published_format(args, self.config)
        self.is_multimodal = hasattr(self.config, "vision_config")
        choice, self.kv_cache_dtype = resolve_launch_dtypes(args, self.config)
        self.dtype, self.weight_dtype = choice.dtype, choice.weight_dtype
        (logger.warning if choice.fell_back else logger.info)(
            "dtype %s (%s)", dtype_name(self.dtype), choice.reason
        )
        if self.device.startswith("cuda") and self.dtype == torch.float32:
            # float32 is the exact mode; cuDNN's convolutions (patch embeddings) default to TF32.
            torch.backends.cudnn.allow_tf32 = False
            torch.backends.cuda.matmul.allow_tf32 = False
        # Refuse a launch that cannot fit before any weight loads (not after an OOM kill).
        self.fit_plan = memory.check_fits(
            memory.fit_inputs(
                args, model_path, self.config, self.dtype, self.kv_cache_dtype, self.weight_dtype
            )
        )
        self.perf = PerfCounters()
        self._head_rows = 0  # rows the LM head scored in the current forward
        self._load_weights()
        self._count_lm_work()
        self.state_shape = install_pooled_linear_attention(
            self.adapter.language_model, self.dtype, getattr(torch, args.mamba_ssm_dtype)
        )
        self.state_pool: StatePool | None = None
        self.state_snapshot_slots = 0
        self.context_length = args.context_length or self.text_config.max_position_embeddings
        self.vocab_size = self.text_config.vocab_size
        self._init_memory()
        self._init_attention()
        self._init_processing()
        self.pooling: PoolingConfig | None = None  # set when the model serves pooled states
        self.pool_head: Head | None = None
        if args.serves_pooling:
            self.pooling, self.pool_head = build_pooling(
                self.model_path, args.pooling_method, self.tokenizer, self._logits, self.dtype,
                self.device,
            )  # fmt: skip

    def _load_weights(self) -> None:
        """The model, its adapter, its quantization and the CPU kernels (``model_loader``)."""
        args = self.args
        with host_memory.heap_returned_while_loading():
            self.model = load_model(
                self.model_path, self.config, self.dtype, args, self.perf, self.prequantized,
                self.weight_dtype,
            )  # fmt: skip
            self.adapter = get_adapter(self.model, self.config)
            self.quantization = quantize(self.model, self.adapter, args)
        kernels = install_cpu_kernels(
            self.model, self.adapter, args, self.dtype, self.quantization is not None
        )
        compile_if_asked(self.model, self.config, args)
        self.lm_packed_copy_bytes = kernels.lm_packed_copy_bytes
        self.linear_methods = linear_methods(self.model)
        logger.info("linear methods: %s", self.linear_methods["counts"])

    def _init_attention(self) -> None:
        self.attn_backend = create_attention_backend(
            self.args.attention_backend or default_attention_backend(self.device),
            kv_pool=self.kv_pool,
            req_to_token_pool=self.req_to_token_pool,
        )
        self.attn_backend.perf = self.perf
        self.attn_backend.spans_in_sliding_layers_only = self.adapter.bidirectional_sliding_only
        self.attn_backend.window_bounds_spans = self.adapter.window_bounds_spans

    def _init_processing(self) -> None:
        """The processor and tokenizer, and the chunk-aware embedder with its per-image cache
        (and the fleet's store or encoder workers, under this worker's fingerprint)."""
        args, model_path = self.args, self.model_path
        self.hf_processor = load_hf_processor(model_path)
        self.tokenizer = getattr(self.hf_processor, "tokenizer", self.hf_processor)
        preprocessor = ImagePreprocessor(
            self.hf_processor, self.adapter, VideoSettings.from_model_dir(model_path)
        )
        fingerprint = ""
        if self.is_multimodal and (args.enable_mm_global_cache or args.encoder_urls):
            fingerprint = worker_fingerprint(
                args, model_path, preprocessor, self.dtype, self.quantization
            )
        remote = self._remote_encoders(fingerprint)
        self.embedder = build_embedder(
            args, self.adapter, preprocessor, self.dtype, fingerprint, remote
        )

    def _remote_encoders(self, fingerprint: str) -> RemoteEncoders | None:
        if not (self.args.encoder_urls and self.is_multimodal):
            return None
        urls = self.args.encoder_urls
        logger.info("encoder workers %s, fingerprint %s", urls, fingerprint)
        api_key = getattr(self.args, "api_key", None)  # a fleet shares the server's key
        return RemoteEncoders(urls, fingerprint, self.args.encoder_timeout, api_key)

    def weight_quantization(self) -> dict[str, Any] | None:
        """What ``/server_info`` reports of the weights' quantization."""
        if self.quantization is not None:
            return self.quantization.as_dict()
        if self.prequantized is None:
            return None
        layers = [m for m in self.model.modules() if isinstance(m, QuantizedLinear)]
        return {"method": self.prequantized.method, "format": self.prequantized.label,
                "quantized_layers": len(layers)}  # fmt: skip

    def _count_lm_work(self) -> None:
        """Multiply-adds per token of the LM's dense linears and of the LM head, and the bytes
        of weights a decode step reads (the LM's and the head's), for ``PerfCounters``."""
        language_model = self.adapter.language_model
        linears = [
            m for m in language_model.modules() if isinstance(m, torch.nn.Linear | QuantizedLinear)
        ]
        self.lm_linear_macs = sum(m.in_features * m.out_features for m in linears)
        head = self.model.get_output_embeddings()
        self.lm_head_macs = head.in_features * head.out_features
        # A step reads the head whole but one embedding row per request.
        embed = self.model.get_input_embeddings()
        in_lm = {id(p) for p in language_model.parameters()}
        embed_bytes = host_memory.module_bytes(embed) if id(embed.weight) in in_lm else 0
        lm_bytes = host_memory.module_bytes(language_model) - embed_bytes
        self.lm_weight_bytes = lm_bytes + host_memory.module_bytes(head)

    def _init_memory(self) -> None:
        layout = self._kv_layout()
        kv_dtype = self.kv_cache_dtype
        per_token = self.kv_bytes_per_token = layout.bytes_per_token(kv_dtype)
        self.weights_bytes = host_memory.module_bytes(self.model)
        self.weights_bytes += packed_linear.packed_bytes(self.model)
        budget = self._kv_budget_bytes(per_token)
        state_reqs = self._init_state_pool(budget) if self.state_shape else None
        state_bytes = self.state_pool.nbytes if self.state_pool else 0
        size = self.args.max_total_tokens or max(budget - state_bytes, 0) // per_token
        size = max(int(size), 16)
        max_reqs = self.args.max_running_requests or max(min(size // 64, 256), 8)
        if state_reqs is not None:  # every running request holds a state slot
            max_reqs = min(self.args.max_running_requests or state_reqs, state_reqs)
        self.max_running_requests = max_reqs
        self.max_total_tokens = size
        self.req_to_token_pool = ReqToTokenPool(max_reqs + 1, self.context_length + 8, self.device)
        self.kv_pool = KVPool(size, layout.shapes, kv_dtype, self.device)
        self.pools = Pools(self.kv_pool, self.req_to_token_pool, self.state_pool, self.device)
        self.memory_report = memory.runner_report(self, per_token)
        self.memory_report.log()

    def _kv_layout(self) -> KVLayout:
        """The pool's layers (see ``KVLayout``); every attention module of the language model
        learns the pool layer it reads and whether it writes it."""
        layout = KVLayout.of(self.text_config)
        if self.state_shape is not None:
            assert set(layout.pool_layer).isdisjoint(self.state_shape.layer_ids)
        for module in self.adapter.language_model.modules():
            layer = getattr(module, "layer_idx", None)
            if isinstance(layer, int) and layer in layout.pool_layer:
                module.kv_layer_idx = layout.pool_layer[layer]
                module.kv_shared = layer in layout.shared
        return layout

    def _init_state_pool(self, budget: int) -> int:
        """Slots of linear-attention state for running requests plus prefix-cache snapshots,
        carved out of the cache budget; returns the number of request slots."""
        assert self.state_shape is not None
        per_slot = self.state_shape.bytes_per_slot
        args = self.args
        requests = args.max_mamba_cache_size or args.max_running_requests
        if requests is None:
            requests = min(max(int(budget * STATE_REQUESTS_FRACTION) // per_slot, 1), 256)
        mb = args.state_snapshot_mb
        snapshot_bytes = mb * 2**20 if mb is not None else budget * STATE_SNAPSHOTS_FRACTION
        snapshots = 0 if args.disable_radix_cache else int(snapshot_bytes // per_slot)
        self.state_snapshot_slots = snapshots
        self.state_pool = StatePool(requests + snapshots, self.state_shape, self.device)
        logger.info(
            "linear-attention state: %d request + %d snapshot slots of %.2f MB",
            requests,
            snapshots,
            per_slot / 2**20,
        )
        return requests

    def _kv_budget_bytes(self, per_token: int) -> int:
        self.kv_budget_rule = "mem_fraction_static"
        if self.device == "cpu":
            floor = memory.min_kv_tokens(self.args.max_total_tokens, self.context_length)
            reserve = self.args.mm_cache_bytes + memory.RUNTIME_RESERVE_BYTES
            budget, self.kv_budget_rule = memory.cpu_kv_budget(
                self.args.mem_fraction_static, self.weights_bytes, reserve, floor * per_token
            )
            return budget
        free, total = torch.cuda.mem_get_info()
        fraction = self.args.mem_fraction_static or 0.85
        return max(int(free - total * (1 - fraction)), 1 << 28)

    @torch.no_grad()
    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        """Run the batch; return float32 logits at each request's last token: (num_reqs, vocab)."""
        started = time.perf_counter()
        self._head_rows = 0
        logits = self._forward(batch)
        wait_for_device(self.device)  # the clock, not the logits, needs the device done
        perf, elapsed = self.perf, time.perf_counter() - started
        if batch.is_decode:
            kv_tokens = sum(batch.prefix_lens) + batch.size
            perf.decode_forward_seconds += elapsed
            perf.decode_steps += 1
            perf.decode_bytes += self.lm_weight_bytes + kv_tokens * self.kv_bytes_per_token
        else:
            perf.prefill_forward_seconds += elapsed
            perf.lm_linear_flops += 2.0 * batch.num_tokens * self.lm_linear_macs
            perf.lm_head_flops += 2.0 * self._head_rows * self.lm_head_macs
        return logits

    def _forward(self, batch: ForwardBatch) -> torch.Tensor:
        self.attn_backend.prepare_metadata(batch)
        batch.attn_backend = self.attn_backend
        ids = batch.input_ids
        embed = self.model.get_input_embeddings()
        embeds = embed(self.adapter.text_ids(ids))
        lm_kwargs = self.adapter.token_lm_kwargs(ids)
        if not batch.is_decode and self.is_multimodal:
            lm_kwargs |= self.embedder.embed(
                batch.reqs, batch.prefix_lens, batch.extend_lens, embeds
            )
        positions = batch.positions.unsqueeze(-2)  # (1, T) or (3, 1, T)
        if self.adapter.position_offset:
            positions = positions + self.adapter.position_offset
        hidden = self.adapter.language_model(
            inputs_embeds=embeds.unsqueeze(0),
            position_ids=positions,
            use_cache=False,
            forward_batch=batch,
            **lm_kwargs,
        ).last_hidden_state[0]
        if not batch.is_decode and any(r.wants_prompt_logprobs for r in batch.reqs):
            batch.prompt_logprobs = self._prompt_logprobs(hidden, batch)
        if not batch.is_decode and any(r.pooling for r in batch.reqs):
            batch.pooled = chunk_parts(hidden, batch, self.pool_head)
        return self._logits(hidden[batch.last_token_indices])

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """float32 logits of hidden states (rows, hidden) -> (rows, vocab)."""
        self._head_rows += hidden.shape[0]
        logits = self.model.get_output_embeddings()(hidden).float()
        logits = self.adapter.scale_logits(logits)
        softcap = getattr(self.text_config, "final_logit_softcapping", None)
        if softcap:
            logits = torch.tanh(logits / softcap) * softcap
        return logits

    def _prompt_logprobs(
        self, hidden: torch.Tensor, batch: ForwardBatch
    ) -> list[PromptLogprobs | None]:
        """Per request, the logprobs of the prompt tokens its chunk predicts (see
        ``Req.prompt_logprob_positions``), computed in slices so that no (chunk, vocab) tensor
        is ever whole."""
        out: list[PromptLogprobs | None] = []
        row = 0
        for req, prefix, extend in zip(batch.reqs, batch.prefix_lens, batch.extend_lens):
            positions = req.prompt_logprob_positions(prefix, prefix + extend)
            if not positions:
                out.append(None)
                row += extend
                continue
            out.append(self._request_prompt_logprobs(req, hidden, row - prefix, positions))
            row += extend
        return out

    def _request_prompt_logprobs(
        self, req: Req, hidden: torch.Tensor, offset: int, positions: range
    ) -> PromptLogprobs:
        """The logprobs of the prompt tokens that ``positions`` predict (position p's hidden
        state is row p + ``offset``), with the alternatives ``req`` asks for."""
        chosen: list[float] = []
        top: list[Pairs] = []
        by_id: list[Pairs] = []
        for first in range(positions.start, positions.stop, PROMPT_LOGPROB_ROWS):
            last = min(first + PROMPT_LOGPROB_ROWS, positions.stop)
            rows = hidden[offset + first : offset + last]
            logprobs = torch.log_softmax(self._logits(rows), dim=-1)
            targets = torch.tensor(req.input_ids[first + 1 : last + 1], device=rows.device)
            chosen += logprobs.gather(1, targets[:, None])[:, 0].tolist()
            best, of_ids = logprob_alternatives(
                logprobs, req.top_logprobs_num, req.token_ids_logprob
            )
            top += best or []
            by_id += of_ids or []
        return (
            chosen,
            top if req.top_logprobs_num else None,
            by_id if req.token_ids_logprob else None,
        )
