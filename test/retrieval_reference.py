"""Hugging Face references for the retrieval tests: the tiny embedding and reranker checkpoints,
the prompts their inputs become (rendered here with the processor's own chat template), and
HF's forward pooled the same way."""

from __future__ import annotations

import base64
import functools
import io
from pathlib import Path

import conftest
import torch
import transformers
from conftest import hf_inputs, load_hf_model, make_image

from sglang.srt.multimodal.hf_processor import load_hf_processor
from sglang_dev.tiny_models.retrieval import (
    RERANK_TOKENS,
    build_tiny_embedding_model,
    build_tiny_reranker,
)

MATRYOSHKA = [8, 16]


@functools.cache
def checkpoint(kind: str) -> str:
    """qwen_embed: Qwen2-VL, last token, normalised (GME-style); gemma_embed: Gemma 3, mean,
    normalised, Matryoshka; qwen_tokens: Qwen2-VL yes/no reranker; gemma_score: Gemma 3 with a
    score head; text_embed: the text-only Qwen2."""
    assert conftest._MODEL_ROOT is not None
    out = Path(conftest._MODEL_ROOT) / "retrieval" / kind
    builders = {
        "qwen_embed": lambda: build_tiny_embedding_model("qwen2_vl", out),
        "gemma_embed": lambda: build_tiny_embedding_model(
            "gemma3", out, pooling="mean", matryoshka_dimensions=MATRYOSHKA
        ),
        "text_embed": lambda: build_tiny_embedding_model("qwen2", out),
        "qwen_tokens": lambda: build_tiny_reranker("qwen2_vl", out, "tokens"),
        "gemma_score": lambda: build_tiny_reranker("gemma3", out, "score"),
    }
    return str(builders[kind]())


def png(seed: int, width: int = 64, height: int = 64) -> bytes:
    buf = io.BytesIO()
    make_image(seed, width, height).save(buf, format="PNG")
    return buf.getvalue()


def data_url(seed: int) -> str:
    return "data:image/png;base64," + base64.b64encode(png(seed)).decode()


def image(seed: int):
    return make_image(seed)


@functools.cache
def _hf(path: str, cls_name: str = "AutoModelForImageTextToText"):
    cls = getattr(transformers, cls_name)
    return load_hf_model(cls, path, torch.float32), load_hf_processor(path)


def chat_prompt(path: str, parts: list[dict], generation_prompt: bool, system: str = "") -> str:
    """The processor's chat template over one user turn of ``parts`` (``{"type": "image"}`` /
    ``{"type": "text", "text": ...}``)."""
    processor = load_hf_processor(path)
    messages = [{"role": "user", "content": parts}]
    if system:
        messages.insert(0, {"role": "system", "content": system})
    return processor.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=generation_prompt
    )


def _inputs(path: str, prompt: str, images: list, cls_name: str):
    model, processor = _hf(path, cls_name)
    tokenizer = getattr(processor, "tokenizer", processor)
    bos = tokenizer.bos_token
    templated = bool(bos) and prompt.startswith(bos)
    if images:  # the processor adds the BOS that a template already wrote
        return model, hf_inputs(processor, prompt[len(bos) :] if templated else prompt, images)
    return model, tokenizer([prompt], return_tensors="pt", add_special_tokens=not templated)


@torch.no_grad()
def hf_hidden(path: str, prompt: str, images: list) -> torch.Tensor:
    """HF's last hidden states (after the final norm) of one prompt: (tokens, hidden)."""
    model, inputs = _inputs(path, prompt, images, "AutoModelForImageTextToText")
    inner = model.model
    return inner(**inputs).last_hidden_state[0].float()


@torch.no_grad()
def hf_text_hidden(path: str, prompt: str) -> torch.Tensor:
    model, inputs = _inputs(path, prompt, [], "AutoModelForCausalLM")
    return model.model(**inputs).last_hidden_state[0].float()


def pooled(hidden: torch.Tensor, method: str, dims: int | None = None) -> torch.Tensor:
    """``method`` pooling of (tokens, hidden), cut to ``dims``, normalised."""
    vector = {"last": hidden[-1], "mean": hidden.mean(0), "cls": hidden[0]}[method]
    return torch.nn.functional.normalize(vector[:dims] if dims else vector, dim=0)


@torch.no_grad()
def hf_token_score(path: str, prompt: str, images: list) -> tuple[torch.Tensor, float]:
    """The yes/no reranker's [no, yes] logits at the last token and P(yes)."""
    model, inputs = _inputs(path, prompt, images, "AutoModelForImageTextToText")
    tokenizer = load_hf_processor(path).tokenizer
    ids = [tokenizer.convert_tokens_to_ids(t) for t in RERANK_TOKENS]
    logits = model(**inputs).logits[0, -1, ids].float()
    return logits, float(torch.softmax(logits, 0)[1])


@torch.no_grad()
def hf_classifier_score(path: str, prompt: str, images: list) -> float:
    """Gemma 3's own sequence classifier: the sigmoid of its one logit."""
    model, inputs = _inputs(path, prompt, images, "Gemma3ForSequenceClassification")
    return float(torch.sigmoid(model(**inputs).logits[0, 0].float()))
