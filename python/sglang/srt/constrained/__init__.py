"""Structured outputs: JSON schema, regex, EBNF and structural-tag constraints (xgrammar)."""

from sglang.srt.constrained.spec import CONSTRAINT_KINDS, GrammarSpec, grammar_spec

__all__ = ["CONSTRAINT_KINDS", "GrammarSpec", "grammar_spec"]
