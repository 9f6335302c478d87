"""The scheduler's side of constrained decoding and logit shaping.

A constrained request waits outside the admission queue until its grammar has compiled (other
requests keep running meanwhile). At each step the token bitmasks of the batch's constrained
requests are filled while the model runs and applied to those rows only; ``logit_bias`` is added
the same way. On a GPU the fill runs after the forward is launched (the kernels are still
running); on a CPU it runs on a worker thread during the forward, but only for large
vocabularies: with a small one the fill takes microseconds and the thread hand-off costs more.
Each sampled token advances the request's matcher; a request whose grammar has terminated (it
accepted a stop token) is finished.
"""

from __future__ import annotations

import concurrent.futures
import logging
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from sglang.srt.constrained.spec import grammar_spec
from sglang.srt.core.finish import FinishReason

if TYPE_CHECKING:
    from sglang.srt.constrained.xgrammar_backend import GrammarBackend
    from sglang.srt.core.io_struct import TokenizedRequest
    from sglang.srt.core.req import Req

logger = logging.getLogger(__name__)

IDLE_WAIT_S = 0.05
OVERLAP_MIN_VOCAB = 32768
MAX_TOP_LOGPROBS = 20


@dataclass
class RequestGrammar:
    """A request's grammar: the compile future until ready, then its own matcher."""

    future: Future
    matcher: Any = None
    after_lead: int | None = None  # the UTF-8 lead byte the last token ended on (Utf8Guard)

    @property
    def terminated(self) -> bool:
        return self.matcher is not None and self.matcher.is_terminated()


class ConstraintManager:
    def __init__(
        self, tokenizer: Any, vocab_size: int, stop_token_ids: frozenset[int], args: Any
    ) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.stop_token_ids = stop_token_ids
        self.any_whitespace = not getattr(args, "constrained_json_disable_any_whitespace", False)
        on_cpu = args.resolved_device == "cpu"
        self.overlap_on_thread = on_cpu and vocab_size >= OVERLAP_MIN_VOCAB
        self._backend: GrammarBackend | None = None
        self._mask_pool: ThreadPoolExecutor | None = None
        self._pending: tuple[list[Req], Future] | None = None

    @property
    def backend(self) -> GrammarBackend:
        if self._backend is None:
            from sglang.srt.constrained.xgrammar_backend import GrammarBackend

            self._backend = GrammarBackend(
                self.tokenizer, self.vocab_size, self.stop_token_ids, self.any_whitespace
            )
        return self._backend

    # Intake ------------------------------------------------------------------------------------
    def check(self, tokenized: TokenizedRequest) -> None:
        """ValueError for a constraint that cannot work: bias outside the vocabulary, a schema /
        regex / grammar that does not parse, or too many top logprobs."""
        sp, top = tokenized.sampling_params, tokenized.top_logprobs_num
        if not (isinstance(top, int) and 0 <= top <= MAX_TOP_LOGPROBS):
            raise ValueError(f"top_logprobs_num must be in [0, {MAX_TOP_LOGPROBS}], got {top!r}")
        for token in sp.logit_bias or ():
            if not 0 <= token < self.vocab_size:
                raise ValueError(
                    f"logit_bias names token {token}, outside the vocabulary [0, {self.vocab_size})"
                )
        spec = grammar_spec(sp)
        if spec is not None:
            self.backend.check(spec)

    def attach(self, req: Req) -> bool:
        """Start compiling the request's grammar; True when it has one (then it must wait)."""
        spec = grammar_spec(req.sampling_params)
        if spec is None:
            return False
        req.grammar = RequestGrammar(self.backend.compile(spec))
        return True

    def take_compiled(self, queue: list[Req], idle: bool) -> tuple[list[Req], list[Req]]:
        """Remove requests whose grammar is done from ``queue``: (ready, failed). ``failed`` ones
        are finished with an abort that the API answers as 400. When the scheduler has nothing
        else to do, wait a little for a compile instead of spinning."""
        if idle and queue:
            concurrent.futures.wait(
                [r.grammar.future for r in queue],
                timeout=IDLE_WAIT_S,
                return_when=concurrent.futures.FIRST_COMPLETED,
            )
        ready, failed = [], []
        for req in [r for r in queue if r.grammar.future.done()]:
            queue.remove(req)
            exc = req.grammar.future.exception()
            if exc is None:
                req.grammar.matcher = self.backend.matcher(req.grammar.future.result())
                ready.append(req)
            else:
                req.finish_reason = FinishReason.error(str(exc), 400)
                failed.append(req)
        return ready, failed

    # Each step ---------------------------------------------------------------------------------
    def prepare(self, reqs: list[Req]) -> None:
        """Begin filling the bitmasks of the batch's constrained requests (overlaps the forward)."""
        if self._pending is not None:  # its requests did not sample; never leave a fill running
            self._pending[1].result()
            self._pending = None
        constrained = [r for r in reqs if _has_matcher(r)]
        if not constrained or not self.overlap_on_thread:
            self._pending = None
            return
        if self._mask_pool is None:
            self._mask_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="grammar-mask")
        self._pending = (constrained, self._mask_pool.submit(self._fill, constrained))

    def _fill(self, reqs: list[Req]) -> torch.Tensor:
        bitmask = self.backend.allocate_bitmask(len(reqs))
        for row, req in enumerate(reqs):
            req.grammar.matcher.fill_next_token_bitmask(bitmask, row)
            self.backend.utf8.restrict(bitmask, row, req.grammar.after_lead)
        return bitmask

    def shaped(self, logits: torch.Tensor, reqs: list[Req]) -> torch.Tensor:
        """A copy of ``logits`` (row i belongs to reqs[i]) with logit_bias added and grammar masks
        applied; ``logits`` itself when no request has either."""
        if not any(r.sampling_params.logit_bias or _has_matcher(r) for r in reqs):
            return logits
        out = logits.clone()
        self.apply(out, reqs)
        return out

    def apply(self, logits: torch.Tensor, reqs: list[Req]) -> None:
        """Shape the logits rows of ``reqs`` (row i belongs to reqs[i]) in place."""
        for row, req in enumerate(reqs):
            bias = req.sampling_params.logit_bias
            if bias:
                ids = torch.tensor(list(bias), dtype=torch.int64, device=logits.device)
                values = torch.tensor(list(bias.values()), dtype=logits.dtype, device=logits.device)
                logits[row].index_add_(0, ids, values)
        constrained = [r for r in reqs if _has_matcher(r)]
        if not constrained:
            return
        bitmask, filled = self._take_pending(constrained)
        rows = {id(r): i for i, r in enumerate(reqs)}
        order = [rows[id(r)] for r in filled]
        full = self.backend.allocate_bitmask(len(reqs))
        full[order] = bitmask[: len(filled)]
        self.backend.apply_bitmask(logits, full, order)

    def _take_pending(self, constrained: list[Req]) -> tuple[torch.Tensor, list[Req]]:
        pending, self._pending = self._pending, None
        if pending is not None:
            prepared, future = pending
            wanted = {id(r) for r in constrained}
            if wanted <= {id(r) for r in prepared}:
                bitmask = future.result()
                keep = [i for i, r in enumerate(prepared) if id(r) in wanted]
                return bitmask[keep], [prepared[i] for i in keep]
            future.result()  # never leave a fill running against a matcher we advance next
        return self._fill(constrained), constrained

    def accept(self, req: Req, token: int) -> None:
        """Advance the request's grammar by its sampled token; a rejected token (possible only
        when a stop string or id forced the end) aborts the request."""
        grammar = req.grammar
        if grammar is None or grammar.matcher is None or req.finished:
            return
        grammar.after_lead = self.backend.utf8.lead_at_end(token)
        if not grammar.matcher.accept_token(token):
            req.finish_reason = FinishReason.abort(
                f"token {token} does not match the request's grammar"
            )

    def close(self) -> None:
        if self._backend is not None:
            self._backend.close()
        if self._mask_pool is not None:
            self._mask_pool.shutdown(wait=False)


def _has_matcher(req: Req) -> bool:
    return req.grammar is not None and req.grammar.matcher is not None
