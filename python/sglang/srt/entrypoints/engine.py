"""Offline engine: ``sglang.Engine(model_path=..., **server_args).generate(...)``."""

from __future__ import annotations

import logging
from typing import Any

import torch

from sglang.srt.core.finish import finish_json
from sglang.srt.core.io_struct import (
    TokenizedRequest,
    input_logprob_meta,
    logprob_meta,
    output_logprob_meta,
    token_ids_per_request,
)
from sglang.srt.core.req import Req
from sglang.srt.entrypoints.default_model import resolve_model_path
from sglang.srt.entrypoints.openai.protocol_retrieval import MultimodalEmbeddingInput
from sglang.srt.entrypoints.openai.retrieval import NOT_POOLING, piece_input, piece_of
from sglang.srt.layers.pooler import embedding_output
from sglang.srt.managers.constraints import MAX_TOP_LOGPROBS
from sglang.srt.managers.detokenizer import IncrementalDetokenizer
from sglang.srt.managers.inputs import (
    GenerateInput,
    check_mm_limits,
    split_generate_inputs,
    tokenize,
)
from sglang.srt.managers.parallel_sampling import fan_out
from sglang.srt.managers.scheduler import Scheduler
from sglang.srt.model_executor.model_runner import ModelRunner
from sglang.srt.multimodal.processor import MultimodalProcessor
from sglang.srt.server_args import ServerArgs

logger = logging.getLogger(__name__)


class Engine:
    def __init__(self, model_path: str | None = None, **kwargs: Any) -> None:
        # As SGLang's Engine: log at ``log_level`` unless the application configured logging.
        logging.basicConfig(
            level=str(kwargs.get("log_level", "info")).upper(),
            format="[%(asctime)s] %(levelname)s %(name)s: %(message)s",
        )
        model_path = resolve_model_path(model_path)
        self.server_args = ServerArgs(model_path=model_path, **kwargs)
        args = self.server_args
        if args.random_seed is not None:
            torch.manual_seed(args.random_seed)
        self.runner = ModelRunner(args, model_path)
        self.processor = MultimodalProcessor(
            model_path, self.runner.config, hf_processor=self.runner.hf_processor
        )
        self.tokenizer = self.processor.tokenizer
        self.scheduler = Scheduler(args, self.runner, self.tokenizer)

    # Public API --------------------------------------------------------------------------------
    def generate(
        self,
        prompt: str | list[str] | None = None,
        sampling_params: dict | list[dict] | None = None,
        input_ids: list[int] | list[list[int]] | None = None,
        image_data: Any = None,
        rid: str | list[str] | None = None,
        return_logprob: bool = False,
        top_logprobs_num: int = 0,
        logprob_start_len: int = -1,
        token_ids_logprob: list[int] | list[list[int]] | None = None,
        video_data: Any = None,
        mm_processor_kwargs: dict[str, Any] | None = None,
    ) -> dict | list[dict]:
        """With ``n`` > 1 in a request's sampling params, its n outputs take its place in the
        returned list (which is then a list even for one prompt). With ``return_logprob``,
        ``logprob_start_len`` >= 0 also returns the prompt tokens' logprobs from there on, and
        ``token_ids_logprob`` (ids, or a list of ids per prompt) the logprobs of those ids at
        every position. ``video_data``: one video (or a list per prompt) as encoded bytes, a
        path, base64 or a data URL, or decoded (n, height, width, 3) uint8 frames;
        ``mm_processor_kwargs`` their sampling options (``fps``, ``max_frames``, ...)."""
        if not 0 <= top_logprobs_num <= MAX_TOP_LOGPROBS:
            raise ValueError(f"top_logprobs_num must be in [0, {MAX_TOP_LOGPROBS}]")
        tokenized, batched = self.tokenize(
            prompt, sampling_params, input_ids, image_data, rid, video_data, mm_processor_kwargs
        )
        token_ids = token_ids_per_request(token_ids_logprob, len(tokenized))
        for t, ids in zip(tokenized, token_ids):
            t.ask_logprobs(top_logprobs_num if return_logprob else None, logprob_start_len, ids)
            t.validate_logprobs(self.runner.vocab_size)
        if any(t.sampling_params.n > 1 for t in tokenized):
            tokenized, batched = self._fan_out(tokenized), True
        outputs = [self.output_of(req) for req in self._run(tokenized)]
        return outputs if batched else outputs[0]

    def _run(self, tokenized: list[TokenizedRequest]) -> list[Req]:
        reqs = [self.scheduler.add_request(t) for t in tokenized]
        while not all(req.finished for req in reqs):
            self.scheduler.step()
        if self.scheduler.hicache is not None:  # as a server's last output waits for its pages
            self.scheduler.hicache.wait_persisted(reqs, timeout=30)
        return reqs

    def _fan_out(self, tokenized: list[TokenizedRequest]) -> list[TokenizedRequest]:
        plan = fan_out(tokenized)
        if not self.server_args.disable_radix_cache:
            self._run(list(plan.prefills.values()))
        return plan.requests

    def tokenize(
        self,
        prompt: str | list[str] | None,
        sampling_params: dict | list[dict] | None,
        input_ids: list[int] | list[list[int]] | None,
        image_data: Any,
        rid: str | list[str] | None = None,
        video_data: Any = None,
        mm_processor_kwargs: dict[str, Any] | None = None,
    ) -> tuple[list[TokenizedRequest], bool]:
        """Validate and process inputs (all or nothing: raises ValueError)."""
        inputs, batched = split_generate_inputs(
            prompt, sampling_params, input_ids, image_data, rid, video_data, mm_processor_kwargs
        )
        return self._tokenize_inputs(inputs), batched

    def _tokenize_inputs(
        self, inputs: list[GenerateInput], pooling: bool = False
    ) -> list[TokenizedRequest]:
        tokenized = []
        for inp in inputs:
            check_mm_limits(self.server_args, len(inp.images), len(inp.videos))
            images = self.processor.load_images(inp.images)
            videos = self.processor.load_videos(inp.videos, inp.video_options)
            tokenized.append(tokenize(self.processor, self.server_args, inp, images, videos))
        for t in tokenized:
            t.pooling = pooling
            self.scheduler.check_request(t)
        return tokenized

    def encode(
        self,
        prompt: str | list[str] | list[dict[str, Any]] | None = None,
        image_data: Any = None,
        input_ids: list[int] | list[list[int]] | None = None,
        video_data: Any = None,
        dimensions: int | None = None,
        rid: str | list[str] | None = None,
    ) -> dict | list[dict]:
        """SGLang's ``Engine.encode``: pooled vectors of prompts (as ``generate`` takes them,
        with ``image_data``), token ids, or SGLang's multimodal list ``[{"text", "image",
        "video"}, ...]`` (each through the chat template); ``{"embedding", "meta_info"}`` each.
        Needs a model that serves pooling (``is_embedding=True``)."""
        config = self.runner.pooling
        if config is None:
            raise ValueError(NOT_POOLING)
        config.check_dimensions(dimensions, self.runner.text_config.hidden_size)
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], dict):
            pieces = [piece_of(MultimodalEmbeddingInput(**item)) for item in prompt]
            inputs = [piece_input(self, self.server_args, piece) for piece in pieces]  # type: ignore[arg-type]
            batched = True
        else:
            inputs, batched = split_generate_inputs(
                prompt, {"max_new_tokens": 0}, input_ids, image_data, rid, video_data
            )
        tokenized = self._tokenize_inputs(inputs, pooling=True)
        outputs = []
        for req in self._run(tokenized):
            vector = embedding_output(req.embedding or [], config, dimensions)
            outputs.append({"embedding": vector, "meta_info": self.output_of(req)["meta_info"]})
        return outputs if batched else outputs[0]

    def output_of(self, req: Req) -> dict:
        out: dict[str, Any] = {
            "text": self._decode(req),
            "output_ids": list(req.output_ids),
            "meta_info": {
                "id": req.rid,
                "prompt_tokens": len(req.input_ids),
                "completion_tokens": len(req.output_ids),
                "cached_tokens": req.cached_len,
                "finish_reason": finish_json(req.finish_reason),
                "e2e_latency": (req.finish_time or 0.0) - req.arrival_time,
            },
        }
        if req.mm_items:
            out["meta_info"]["mm_items"] = req.mm_report()
        if req.return_logprob:
            output = output_logprob_meta(
                req,
                req.output_ids,
                req.output_logprobs,
                req.output_top_logprobs,
                output_token_ids_logprobs=req.output_token_ids_logprobs,
            )
            prompt = {}
            if req.wants_prompt_logprobs:
                prompt = input_logprob_meta(
                    req,
                    req.input_logprobs,
                    req.input_top_logprobs,
                    input_token_ids_logprobs=req.input_token_ids_logprobs,
                )
            out["meta_info"] |= logprob_meta(req, output, prompt)
        return out

    def get_server_info(self) -> dict:
        return self.scheduler.info()

    def flush_cache(self) -> bool:
        return self.scheduler.flush_cache()

    def shutdown(self) -> None:
        self.scheduler.waiting.clear()
        self.scheduler.grammar_queue.clear()
        self.scheduler.constraints.close()
        if self.scheduler.hicache is not None:
            self.scheduler.hicache.drain()  # pages a later worker may read

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()

    def _decode(self, req: Req) -> str:
        detokenizer = IncrementalDetokenizer(self.tokenizer, req.sampling_params)
        return detokenizer.finish(req.finish_reason, req.output_ids)
