"""``get_tokenizer`` under SGLang's name and signature (its test kits load the served model's
tokenizer with it)."""

from __future__ import annotations

from typing import Any


def get_tokenizer(
    tokenizer_name: str,
    *args: Any,
    tokenizer_mode: str = "auto",
    trust_remote_code: bool = False,
    tokenizer_revision: str | None = None,
    **kwargs: Any,
) -> Any:
    """The Hugging Face tokenizer of a model folder or hub id (``tokenizer_mode="slow"``: the
    Python tokenizer)."""
    from transformers import AutoTokenizer

    kwargs.pop("tokenizer_backend", None)  # SGLang's alternative backends: HF's only here
    if tokenizer_mode == "slow":
        kwargs["use_fast"] = False
    return AutoTokenizer.from_pretrained(
        tokenizer_name,
        *args,
        trust_remote_code=trust_remote_code,
        revision=tokenizer_revision,
        **kwargs,
    )
