"""Llama 3 style text-only LM: its special tokens and header-id chat template."""

from __future__ import annotations

from typing import Any

from sglang_dev.tiny_models.common import (
    TEXT,
    Family,
    Recipe,
    TokSpec,
)

_LLAMA_TEMPLATE = (
    "{{- bos_token -}}"
    "{%- for message in messages -%}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' -}}"
    "{%- if message['content'] is string -%}{{- message['content'] | trim -}}"
    "{%- else -%}{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'text' -%}{{- part['text'] | trim -}}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{{- '<|eot_id|>' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}{%- endif -%}"
)

_LLAMA_TAIL = (
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
)
_LLAMA_ROLES = {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}


def _recipe_llama(tok: Any, vocab: int) -> Recipe:
    from transformers import LlamaConfig

    t = tok.convert_tokens_to_ids
    bos, eos = t("<|begin_of_text|>"), [t("<|end_of_text|>"), t("<|eot_id|>")]
    config = LlamaConfig(
        **TEXT, vocab_size=vocab, bos_token_id=bos, eos_token_id=eos, rms_norm_eps=1e-5
    )
    return Recipe(config, "AutoModelForCausalLM", {"bos_token_id": bos, "eos_token_id": eos})


FAMILY_SPECS = (
    Family(
        "llama",
        TokSpec((), _LLAMA_TAIL, _LLAMA_ROLES, _LLAMA_TEMPLATE, add_bos=True),
        _recipe_llama,
    ),
)
