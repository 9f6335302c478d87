"""What a forward's logits mean for each request: its prompt logprobs, its new token (penalties,
logit bias and grammar masks applied), its logprobs and whether it has finished."""

from __future__ import annotations

import logging
import os
import time
from typing import Any

import torch

from sglang.srt.core.finish import FinishReason
from sglang.srt.core.forward_batch import ForwardBatch
from sglang.srt.core.req import Req, logprob_alternatives
from sglang.srt.layers.pooler import add_part, finish_pooling
from sglang.srt.managers.constraints import ConstraintManager
from sglang.srt.managers.linear_state import LinearStateManager
from sglang.srt.managers.step_failure import StepFailure
from sglang.srt.multimodal.embedder import MultimodalEmbedder
from sglang.srt.sampling.custom_logit_processor import apply_custom_processors
from sglang.srt.sampling.sampler import apply_penalties, sample
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.sampling.stop_strings import matched_stop, matched_stop_regex, skipped_token_ids

logger = logging.getLogger(__name__)

# SGLang's switch: sampled rows report logprobs before temperature instead of after it.
RETURN_ORIGINAL_LOGPROB_ENV = "SGLANG_RETURN_ORIGINAL_LOGPROB"


def output_logprobs(shaped: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """The logprobs reported for sampled tokens, as SGLang's sampler gives them: over the logits
    the token was drawn from (penalties, ``logit_bias`` and grammar masks applied, so a token
    the grammar forbids is at -inf and a forced one near 0), and for non-greedy rows after
    temperature (before it with ``SGLANG_RETURN_ORIGINAL_LOGPROB``); top-k / top-p / min-p
    do not renormalise them. Masked tokens read the dtype's lowest finite value (as SGLang
    clamps them), which JSON can carry."""
    scaled = shaped
    original = os.environ.get(RETURN_ORIGINAL_LOGPROB_ENV, "").lower() in ("1", "true")
    temperatures = [1.0 if sp.is_greedy or original else sp.temperature for sp in params]
    if any(t != 1.0 for t in temperatures):
        divisor = torch.tensor(temperatures, dtype=shaped.dtype, device=shaped.device)
        scaled = shaped / divisor[:, None]
    return torch.log_softmax(scaled, dim=-1).clamp(min=torch.finfo(shaped.dtype).min)


class OutputProcessor:
    def __init__(
        self,
        embedder: MultimodalEmbedder,
        vocab_size: int,
        tokenizer: Any,
        constraints: ConstraintManager,
        states: LinearStateManager | None,
    ) -> None:
        self.embedder = embedder
        self.vocab_size = vocab_size
        self.tokenizer = tokenizer
        self.special_ids = skipped_token_ids(tokenizer)
        self.constraints = constraints
        self.states = states

    def process(
        self, batch: ForwardBatch, logits: torch.Tensor
    ) -> tuple[list[Req], list[StepFailure]]:
        """Advance every request of ``batch`` past its step's tokens and give one new token to
        those past their prompt. Returns the requests that produced a token or finished, and
        those whose sampling failed."""
        if self.states is not None:
            self.states.step_done(batch)
        rows = []
        for i, req in enumerate(batch.reqs):
            self._advance(batch, i, req)
            if not req.is_prefilling:
                rows.append(i)
        if not rows:
            return [], []
        reqs = [batch.reqs[i] for i in rows]
        if len(rows) < logits.shape[0]:
            logits = logits[rows]
        tokens, failed, shaped = self._sample(reqs, logits)
        logprobs = None
        if any(r.return_logprob for r in reqs):
            logprobs = output_logprobs(shaped, [r.sampling_params for r in reqs])
        now = time.perf_counter()
        produced = []
        for i, (req, token) in enumerate(zip(reqs, tokens)):
            if req.first_token_time is None:
                req.first_token_time = now
            if token is not None:
                req.output_ids.append(token)
                if req.return_logprob:
                    self._take_logprobs(req, token, logprobs[i : i + 1])
                self.constraints.accept(req, token)
                self._check_finished(req)
            elif req.sampling_params.max_new_tokens == 0:  # the prompt only
                if req.pooling is not None:
                    finish_pooling(req)
                req.finish_reason = FinishReason.length_limit(0)
            else:  # its sampling failed
                continue
            produced.append(req)
        return produced, failed

    def _advance(self, batch: ForwardBatch, i: int, req: Req) -> None:
        """Record row ``i``'s prompt logprobs and move ``req`` past its step's tokens."""
        if batch.prompt_logprobs is not None and batch.prompt_logprobs[i] is not None:
            chosen, top, by_id = batch.prompt_logprobs[i]
            req.input_logprobs += chosen
            req.input_top_logprobs += top if top is not None else [None] * len(chosen)
            req.input_token_ids_logprobs += by_id if by_id is not None else [None] * len(chosen)
        if batch.pooled is not None:
            add_part(req, batch.pooled[i])
        req.computed_len += req.extend_len
        req.extend_len = 0
        self.embedder.release(req, req.computed_len)

    def _sample(
        self, reqs: list[Req], logits: torch.Tensor
    ) -> tuple[list[int | None], list[StepFailure], torch.Tensor]:
        """One token per request; None for requests that get none: ``max_new_tokens == 0``,
        or a failure of that request alone (NaN logits, its custom logit processor or the
        sampler raising), also returned; and the logits the tokens were drawn from (penalties,
        logit bias, grammar masks and custom processors applied)."""
        params = [r.sampling_params for r in reqs]
        if any(sp.has_penalties or sp.min_new_tokens for sp in params):
            apply_penalties(
                logits,
                params,
                [r.input_ids for r in reqs],
                [r.output_ids for r in reqs],
                [self._banned_ids(r) for r in reqs],
            )
        shaped = self.constraints.shaped(logits, reqs)
        tokens: list[int | None] = [None] * len(reqs)
        failed: list[StepFailure] = []
        processors = [r.custom_logit_processor for r in reqs]
        broken: dict[int, str] = {}
        if any(processors):
            shaped = shaped.clone() if shaped is logits else shaped
            broken = apply_custom_processors(
                shaped, processors, [sp.custom_params for sp in params]
            )
            failed += [StepFailure(reqs[row], why) for row, why in broken.items()]
        greedy_ids = shaped.argmax(dim=-1)  # what ``sample`` gives a greedy row
        # argmax takes a NaN for the largest value: a row holds a NaN iff its argmax points at one
        top_ids = greedy_ids if shaped is logits else logits.argmax(dim=-1)
        bad = logits.gather(-1, top_ids.unsqueeze(-1)).isnan().squeeze(-1).tolist()
        greedy = greedy_ids.tolist()
        for i, req in enumerate(reqs):
            if req.sampling_params.max_new_tokens == 0 or i in broken:
                continue
            if bad[i]:
                failed.append(StepFailure(req, "the model produced NaN logits for this request"))
                continue
            if params[i].is_greedy:
                tokens[i] = greedy[i]
                continue
            try:
                tokens[i] = sample(shaped[i : i + 1], [params[i]], [req.generator])[0]
            except Exception as exc:
                logger.exception("sampling failed for request %s", req.rid)
                failed.append(StepFailure(req, f"sampling failed: {exc}"))
        return tokens, failed, shaped

    def _banned_ids(self, req: Req) -> list[int]:
        """Ids the request may not produce yet (EOS and stop ids before ``min_new_tokens``)."""
        sp = req.sampling_params
        if len(req.output_ids) >= sp.min_new_tokens:
            return []
        eos = [] if sp.ignore_eos else list(req.eos_token_ids)
        return [t for t in (*eos, *(sp.stop_token_ids or ())) if 0 <= t < self.vocab_size]

    @staticmethod
    def _take_logprobs(req: Req, token: int, logprobs: torch.Tensor) -> None:
        """Record the sampled token's logprob from its (1, vocab) row, with its top
        alternatives and the logprobs of the request's ``token_ids_logprob``."""
        req.output_logprobs.append(float(logprobs[0, token]))
        top, by_id = logprob_alternatives(logprobs, req.top_logprobs_num, req.token_ids_logprob)
        if top is not None:
            req.output_top_logprobs += top
        if by_id is not None:
            req.output_token_ids_logprobs += by_id

    def _check_finished(self, req: Req) -> None:
        sp, token = req.sampling_params, req.output_ids[-1]
        if req.finished:  # the grammar rejected the token
            return
        if req.grammar is not None and req.grammar.terminated:
            req.finish_reason = FinishReason.stop(token)
            return
        if token in (sp.stop_token_ids or ()) or (not sp.ignore_eos and token in req.eos_token_ids):
            req.finish_reason = FinishReason.stop(token)
        elif len(req.output_ids) >= sp.max_new_tokens:
            req.finish_reason = FinishReason.length_limit(len(req.output_ids))
        if req.finish_reason is None:
            stop = self._matched_stop(req)
            if stop is not None:
                req.finish_reason = FinishReason.stop(stop)

    def _matched_stop(self, req: Req) -> str | None:
        """The stop string or stop_regex pattern that the output now ends with (None if none).
        As in SGLang, a regex is reported by its pattern and the text is cut only where that
        pattern appears literally, so what a regex matched stays in the output."""
        sp, ids = req.sampling_params, req.output_ids
        skip = sp.skip_special_tokens
        if sp.stop:
            stop = matched_stop(self.tokenizer, ids, sp.stop, skip, self.special_ids)
            if stop is not None:
                return stop
        if sp.stop_regex:
            return matched_stop_regex(self.tokenizer, ids, sp.stop_regex, skip, self.special_ids)
        return None
