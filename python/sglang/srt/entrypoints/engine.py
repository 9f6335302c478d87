"""Offline engine: ``sglang.Engine(model_path=..., **server_args).generate(...)``."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import random
import uuid
from typing import Any

import torch

from sglang.srt.managers.req import Req
from sglang.srt.managers.scheduler import Scheduler
from sglang.srt.model_executor.model_runner import ModelRunner
from sglang.srt.multimodal.processor import MultimodalProcessor
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.server_args import ServerArgs

logger = logging.getLogger(__name__)


class Engine:
    def __init__(self, model_path: str | None = None, **kwargs: Any) -> None:
        if model_path is None:
            from sglang.testing.tiny_models import default_model_path

            model_path = str(default_model_path())
        self.server_args = ServerArgs(model_path=model_path, **kwargs)
        args = self.server_args
        self._seed = args.random_seed if args.random_seed is not None else random.randrange(2**31)
        torch.manual_seed(self._seed)
        self.runner = ModelRunner(args, model_path)
        self.processor = MultimodalProcessor(model_path, self.runner.config)
        self.tokenizer = self.processor.tokenizer
        self.eos_token_ids = _eos_token_ids(model_path, self.tokenizer)
        self.scheduler = Scheduler(args, self.runner, detokenize=self._decode)
        self._num_reqs = 0

    # Public API --------------------------------------------------------------------------------
    def generate(
        self,
        prompt: str | list[str] | None = None,
        sampling_params: dict | list[dict] | None = None,
        input_ids: list[int] | list[list[int]] | None = None,
        image_data: Any = None,
        rid: str | list[str] | None = None,
        return_logprob: bool = False,
    ) -> dict | list[dict]:
        reqs, batched = self.make_requests(prompt, sampling_params, input_ids, image_data, rid)
        for req in reqs:
            req.return_logprob = return_logprob
        for req in reqs:
            self.scheduler.add_request(req)
        while not all(req.finished for req in reqs):
            self.scheduler.step()
        outputs = [self.output_of(req) for req in reqs]
        return outputs if batched else outputs[0]

    def make_requests(
        self,
        prompt: str | list[str] | None,
        sampling_params: dict | list[dict] | None,
        input_ids: list[int] | list[list[int]] | None,
        image_data: Any,
        rid: str | list[str] | None = None,
    ) -> tuple[list[Req], bool]:
        """Validate and process inputs into requests (all or nothing: raises ValueError)."""
        if (prompt is None) == (input_ids is None):
            raise ValueError("give exactly one of prompt and input_ids")
        batched = isinstance(prompt, list) or bool(input_ids and isinstance(input_ids[0], list))
        prompts = (prompt if batched else [prompt]) if prompt is not None else None
        ids_list = (input_ids if batched else [input_ids]) if input_ids is not None else None
        n = len(prompts if prompts is not None else ids_list)  # type: ignore[arg-type]
        images = _per_request(image_data, n, batched, "image_data")
        params = _per_request(sampling_params, n, batched, "sampling_params", allow_dict=True)
        rids = _per_request(rid, n, batched, "rid")
        reqs = []
        for i in range(n):
            sp = SamplingParams.from_dict(params[i])
            loaded = self.processor.load_images(_as_list(images[i]))
            limit = self.server_args.image_limit
            if limit is not None and len(loaded) > limit:
                raise ValueError(f"{len(loaded)} images in one request; the limit is {limit}")
            ids, items = self.processor.process(
                prompts[i] if prompts is not None else None,
                ids_list[i] if ids_list is not None else None,  # type: ignore[index]
                loaded,
            )
            reqs.append(self._new_req(rids[i], ids, items, sp))
        return reqs, batched

    def output_of(self, req: Req) -> dict:
        out = {
            "text": self._decode(req),
            "output_ids": list(req.output_ids),
            "meta_info": {
                "id": req.rid,
                "prompt_tokens": len(req.input_ids),
                "completion_tokens": len(req.output_ids),
                "cached_tokens": req.cached_len,
                "finish_reason": req.finish_reason,
                "e2e_latency": (req.finish_time or 0.0) - req.arrival_time,
            },
        }
        if req.return_logprob:
            out["meta_info"]["output_token_logprobs"] = [
                (lp, tok, None) for lp, tok in zip(req.output_logprobs, req.output_ids)
            ]
        return out

    def get_server_info(self) -> dict:
        runner, scheduler = self.runner, self.scheduler
        cache, stats = runner.embedder.cache, runner.embedder.stats
        return {
            **{k: v for k, v in dataclasses.asdict(self.server_args).items() if k != "api_key"},
            "max_total_num_tokens": runner.max_total_tokens,
            "max_running_requests": runner.max_running_requests,
            "context_length": runner.context_length,
            "chunked_prefill_size": scheduler.chunk_size or -1,
            "forward_steps": scheduler.forward_steps,
            "mm_embedding_cache": {
                "mode": self.server_args.mm_cache_mode,
                "hits": cache.counters.hits,
                "misses": cache.counters.misses,
                "encoded_items": stats.encoded_items,
                "encoded_tokens": stats.encoded_tokens,
                "encoder_calls": stats.encoder_calls,
                "evictions": cache.counters.evictions,
                "entries": len(cache),
                "bytes_used": cache.bytes_used,
                "capacity_bytes": cache.capacity_bytes,
                "encoder_seconds": stats.encoder_seconds,
                "max_encoder_call_tokens": stats.max_call_tokens,
                "preprocess_skipped": stats.preprocess_skipped,
                "pinned": cache.num_pinned,
            },
        }

    def flush_cache(self) -> bool:
        return self.scheduler.flush_cache()

    def shutdown(self) -> None:
        self.scheduler.waiting.clear()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()

    # Helpers -----------------------------------------------------------------------------------
    def _new_req(self, rid: str | None, ids: list[int], items: list, sp: SamplingParams) -> Req:
        self._num_reqs += 1
        generator = None
        if not sp.is_greedy:
            seed = sp.seed if sp.seed is not None else self._seed + self._num_reqs
            generator = torch.Generator().manual_seed(seed)
        return Req(
            rid=rid or uuid.uuid4().hex,
            input_ids=ids,
            sampling_params=sp,
            mm_items=items,
            eos_token_ids=self.eos_token_ids,
            generator=generator,
        )

    def _decode(self, req: Req) -> str:
        sp = req.sampling_params
        text = self.tokenizer.decode(req.output_ids, skip_special_tokens=sp.skip_special_tokens)
        reason = req.finish_reason or {}
        if isinstance(reason.get("matched"), str):
            text = text[: text.find(reason["matched"])]
        return text


def _per_request(value: Any, n: int, batched: bool, name: str, allow_dict: bool = False) -> list:
    if not batched:
        return [value]
    if value is None or (allow_dict and isinstance(value, dict)):
        return [value] * n
    if not isinstance(value, list) or len(value) != n:
        raise ValueError(f"{name} must be a list with one entry per prompt ({n})")
    return value


def _as_list(images: Any) -> list:
    if images is None:
        return []
    return list(images) if isinstance(images, (list, tuple)) else [images]


def _eos_token_ids(model_path: str, tokenizer: Any) -> frozenset[int]:
    ids: set[int] = set()
    path = os.path.join(model_path, "generation_config.json")
    if os.path.exists(path):
        with open(path) as f:
            eos = json.load(f).get("eos_token_id")
        ids.update(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return frozenset(ids)
