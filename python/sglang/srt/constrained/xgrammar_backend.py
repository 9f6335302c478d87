"""Grammar compilation and matching with xgrammar (imported on first use: it costs ~1.5 s).

Compiled grammars are cached by ``GrammarSpec`` (an LRU of futures, so concurrent requests with
the same schema share one compile); compiles run on a worker thread, off the scheduler's step.
"""

from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch

from sglang.srt.constrained.spec import GrammarSpec
from sglang.srt.constrained.utf8_guard import Utf8Guard

CACHE_ENTRIES = 256
# Without a cap, a weak model can emit whitespace between JSON tokens forever; 8 covers
# indentation a few levels deep.
MAX_JSON_WHITESPACE = 8

_NATIVE_PREFIX = re.compile(r"^\s*(\[[\d:]+\]\s*)?\S+\.(cc|h|cpp):\d+:\s*")
_CHECK_PREFIX = re.compile(r"Check failed: \(.*?\) is false:\s*")


class GrammarError(ValueError):
    """A constraint that cannot compile; the message names the problem."""


class GrammarBackend:
    """xgrammar for one tokenizer. ``stop_token_ids`` end a request once its grammar accepts."""

    def __init__(
        self,
        tokenizer: Any,
        vocab_size: int,
        stop_token_ids: Iterable[int],
        any_whitespace: bool = True,
    ) -> None:
        import xgrammar

        self.xgr = xgrammar
        self.vocab_size = vocab_size
        self.any_whitespace = any_whitespace
        self.info = _tokenizer_info(xgrammar, tokenizer, vocab_size, sorted(stop_token_ids))
        words = xgrammar.get_bitmask_shape(1, vocab_size)[1]
        self.utf8 = Utf8Guard(list(self.info.decoded_vocab), words)
        self.compiler = xgrammar.GrammarCompiler(self.info, max_threads=1, cache_enabled=False)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="grammar-compile")
        self._cache: OrderedDict[GrammarSpec, Future] = OrderedDict()
        self._lock = threading.Lock()
        self.compiles = 0
        self.cache_hits = 0

    # Compile -----------------------------------------------------------------------------------
    def check(self, spec: GrammarSpec) -> None:
        """Parse the constraint without compiling it against the vocabulary (milliseconds)."""
        with _named_errors(spec):
            self._grammar(spec)

    def compile(self, spec: GrammarSpec) -> Future:
        """A future of the compiled grammar; a failed compile holds a GrammarError."""
        with self._lock:
            future = self._cache.get(spec)
            if future is not None and not (future.done() and future.exception()):
                self._cache.move_to_end(spec)
                self.cache_hits += 1
                return future
            self.compiles += 1
            future = self._pool.submit(self._compile_now, spec)
            self._cache[spec] = future
            while len(self._cache) > CACHE_ENTRIES:
                self._cache.popitem(last=False)
            return future

    def _compile_now(self, spec: GrammarSpec) -> Any:
        with _named_errors(spec):
            return self.compiler.compile_grammar(self._grammar(spec))

    def _grammar(self, spec: GrammarSpec) -> Any:
        grammar = self.xgr.Grammar
        if spec.kind == "json_schema":
            return grammar.from_json_schema(
                _schema_text(spec.source),
                any_whitespace=self.any_whitespace,
                max_whitespace_cnt=MAX_JSON_WHITESPACE if self.any_whitespace else None,
            )
        if spec.kind == "regex":
            return grammar.from_regex(spec.source)
        if spec.kind == "ebnf":
            return grammar.from_ebnf(spec.source)
        if spec.kind == "structural_tag":
            cap = MAX_JSON_WHITESPACE if self.any_whitespace else 1
            return grammar.from_structural_tag(_structural_tag(_json(spec.source), cap))
        raise GrammarError(f"unknown constraint kind {spec.kind!r}")

    # Match -------------------------------------------------------------------------------------
    def matcher(self, compiled: Any) -> Any:
        return self.xgr.GrammarMatcher(compiled)

    def allocate_bitmask(self, rows: int) -> torch.Tensor:
        return self.xgr.allocate_token_bitmask(rows, self.vocab_size)

    def apply_bitmask(self, logits: torch.Tensor, bitmask: torch.Tensor, rows: list[int]) -> None:
        """Set the logits of disallowed tokens to -inf, in place, for ``rows`` only."""
        width = min(logits.shape[-1], self.vocab_size)
        self.xgr.apply_token_bitmask_inplace(logits, bitmask, vocab_size=width, indices=rows)
        if logits.shape[-1] > self.vocab_size:  # padded lm_head columns are never text
            logits[rows, self.vocab_size :] = float("-inf")

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def _tokenizer_info(xgr: Any, tokenizer: Any, vocab_size: int, stop_ids: list[int]) -> Any:
    """xgrammar's view of the vocabulary, with special added tokens (image pads, chat markers)
    blanked: a constrained output never contains them, so its text survives
    ``skip_special_tokens`` decoding unchanged."""
    base = xgr.TokenizerInfo.from_huggingface(
        tokenizer, vocab_size=vocab_size, stop_token_ids=stop_ids
    )
    special = {i for i, tok in tokenizer.added_tokens_decoder.items() if tok.special}
    special.update(getattr(tokenizer, "all_special_ids", ()))
    vocab = [b"" if i in special else piece for i, piece in enumerate(base.decoded_vocab)]
    return xgr.TokenizerInfo(
        vocab,
        xgr.VocabType.RAW,
        vocab_size=vocab_size,
        stop_token_ids=stop_ids,
        add_prefix_space=base.add_prefix_space,
    )


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise GrammarError(f"not valid JSON: {exc}") from None


def _schema_text(source: str) -> str:
    schema = _json(source)
    if not isinstance(schema, (dict, bool)):
        raise GrammarError("json_schema must be a JSON object (or a boolean schema)")
    return json.dumps(_plain_length_strings(schema))


def _structural_tag(node: Any, whitespace_cap: int) -> Any:
    """Apply the JSON-schema fixes and the whitespace cap inside a structural tag."""
    if isinstance(node, list):
        return [_structural_tag(x, whitespace_cap) for x in node]
    if not isinstance(node, dict):
        return node
    out = {key: _structural_tag(value, whitespace_cap) for key, value in node.items()}
    if out.get("type") == "json_schema" and isinstance(out.get("json_schema"), dict):
        out["json_schema"] = _plain_length_strings(node["json_schema"])
        out.setdefault("max_whitespace_cnt", whitespace_cap)
    return out


def _plain_length_strings(node: Any) -> Any:
    """Turn the length bounds of strings without a pattern into a pattern of JSON-safe characters.

    xgrammar (0.2.x) lets a string with minLength/maxLength and no pattern contain raw control
    characters, which is not JSON; the pattern keeps the same bounds without them (and xgrammar
    ignores lengths given beside a pattern, so the lengths move into it)."""
    if isinstance(node, list):
        return [_plain_length_strings(x) for x in node]
    if not isinstance(node, dict):
        return node
    out = {
        key: value
        if key in ("enum", "const", "default", "examples")
        else _plain_length_strings(value)
        for key, value in node.items()
    }
    bounded = "minLength" in out or "maxLength" in out
    if out.get("type") == "string" and bounded and not {"pattern", "format"} & out.keys():
        lo, hi = out.pop("minLength", 0), out.pop("maxLength", "")
        out["pattern"] = f'^[^"\\\\\\x00-\\x1f]{{{lo},{hi}}}$'
    return out


class _named_errors:
    """Turn xgrammar's native errors into GrammarError("invalid <kind>: <reason>")."""

    def __init__(self, spec: GrammarSpec) -> None:
        self.spec = spec

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        if exc is None or isinstance(exc, GrammarError):
            if isinstance(exc, GrammarError) and not str(exc).startswith("invalid"):
                raise GrammarError(f"invalid {self.spec.kind}: {exc}") from None
            return False
        if isinstance(exc, (RuntimeError, ValueError, TypeError)):
            raise GrammarError(f"invalid {self.spec.kind}: {_clean(str(exc))}") from None
        return False


def _clean(message: str) -> str:
    first = message.strip().splitlines()[0] if message.strip() else "cannot compile"
    return _CHECK_PREFIX.sub("", _NATIVE_PREFIX.sub("", first)).strip()
