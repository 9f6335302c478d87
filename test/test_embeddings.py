"""Pooled hidden states (``Engine.encode``) against HF's forward pooled the same way: Qwen2-VL
(last token) and Gemma 3 (mean, Matryoshka) embedding checkpoints and a Qwen2-VL yes/no
reranker head; chunked and whole, caches on and off, batched and alone."""

from __future__ import annotations

import pytest
import torch
from retrieval_reference import (
    chat_prompt,
    checkpoint,
    data_url,
    hf_hidden,
    hf_text_hidden,
    hf_token_score,
    image,
    pooled,
)

import sglang

ATOL = 1e-5
# SGLang's multimodal inputs and what the processor's template is given for each
ITEMS = [
    ({"text": "a red square", "image": data_url(1)}, [{"type": "image"}, {"type": "text", "text": "a red square"}], [1]),  # noqa: E501
    ({"image": data_url(2)}, [{"type": "image"}], [2]),
    ({"text": "words " * 12}, None, []),
]  # fmt: skip


def _engine(kind: str, **kwargs) -> sglang.Engine:
    return sglang.Engine(
        model_path=checkpoint(kind), device="cpu", dtype="float32", log_level="error", **kwargs
    )


def _reference(kind: str, item: dict, parts: list | None, seeds: list[int], method: str, **kw):
    path = checkpoint(kind)
    if parts is None:  # text alone: as it is, special tokens added
        return pooled(hf_hidden(path, item["text"], []), method, **kw)
    prompt = chat_prompt(path, parts, generation_prompt=True)
    return pooled(hf_hidden(path, prompt, [image(s) for s in seeds]), method, **kw)


def _close(got: list[float], want: torch.Tensor) -> bool:
    return torch.allclose(torch.tensor(got), want, atol=ATOL, rtol=0)


@pytest.mark.parametrize(
    "flags",
    [
        {"chunked_prefill_size": -1},
        {"chunked_prefill_size": 16, "disable_radix_cache": True, "mm_cache_mode": "off"},
    ],
    ids=["whole-cached", "chunked-uncached"],
)
def test_qwen2_vl_last_token_embeddings_equal_hf(flags: dict) -> None:
    engine = _engine("qwen_embed", **flags)
    batch = engine.encode([item for item, _, _ in ITEMS])
    alone = [engine.encode([item])[0] for item, _, _ in ITEMS]  # the caches hold them now
    for (item, parts, seeds), got, one in zip(ITEMS, batch, alone):
        want = _reference("qwen_embed", item, parts, seeds, "last")
        assert _close(got["embedding"], want) and _close(one["embedding"], want)
    cached = alone[0]["meta_info"]["cached_tokens"]
    assert (cached > 0) == ("disable_radix_cache" not in flags)
    encoded = engine.get_server_info()["mm_embedding_cache"]["encoded_items"]
    if "mm_cache_mode" in flags:  # each chunk an image overlaps encodes it again
        assert encoded > 4
    else:
        assert encoded == 2  # two images, each encoded once for four requests


def test_deliberate_errors_do_not_match() -> None:
    """The comparison above can fail: the token before the last, or the prompt without its
    image, pooled by HF, differ from the engine's vector."""
    engine = _engine("qwen_embed")
    item, parts, _ = ITEMS[0]
    got = engine.encode([item])[0]["embedding"]
    path = checkpoint("qwen_embed")
    hidden = hf_hidden(path, chat_prompt(path, parts, True), [image(1)])
    assert not _close(got, pooled(hidden[:-1], "last"))
    text_only = chat_prompt(path, parts[1:], True)
    assert not _close(got, pooled(hf_hidden(path, text_only, []), "last"))


def test_gemma3_mean_pooling_and_matryoshka_equal_hf() -> None:
    engine = _engine("gemma_embed", chunked_prefill_size=24)
    item, parts, seeds = ITEMS[0]
    full = engine.encode([item])[0]["embedding"]
    cut = engine.encode([item], dimensions=8)[0]["embedding"]
    assert _close(full, _reference("gemma_embed", item, parts, seeds, "mean"))
    assert _close(cut, _reference("gemma_embed", item, parts, seeds, "mean", dims=8))
    assert not _close(full, _reference("gemma_embed", item, parts, seeds, "last"))
    with pytest.raises(ValueError, match="dimensions must be one of"):
        engine.encode([item], dimensions=5)


def test_pooling_method_flag_overrides_the_checkpoint() -> None:
    engine = _engine("qwen_embed", pooling_method="cls")
    ids = engine.tokenizer("first token pooled")["input_ids"]
    got = engine.encode(input_ids=ids)["embedding"]
    want = pooled(hf_hidden(checkpoint("qwen_embed"), "first token pooled", []), "cls")
    assert _close(got, want)


def test_yes_no_reranker_head_equals_hf_logits() -> None:
    engine = _engine("qwen_tokens", chunked_prefill_size=16)
    path = checkpoint("qwen_tokens")
    parts = [{"type": "image"}, {"type": "text", "text": "is this red?"}]
    prompt = chat_prompt(path, parts, generation_prompt=True)
    got = engine.encode(prompt, image_data=data_url(3))["embedding"]
    want, _ = hf_token_score(path, prompt, [image(3)])
    assert torch.allclose(torch.tensor(got), want, atol=ATOL, rtol=0) and len(got) == 2


def test_bad_inputs_raise_and_the_engine_keeps_serving() -> None:
    engine = _engine("text_embed")
    with pytest.raises(ValueError, match="does not accept images"):
        engine.encode([{"text": "x", "image": data_url(1)}])
    with pytest.raises(ValueError, match="context length"):
        engine.encode("long " * 5000)
    with pytest.raises(ValueError, match="Matryoshka"):
        engine.encode("hello", dimensions=4)
    assert not engine.scheduler.has_work
    engine.scheduler.check_integrity()
    got = engine.encode("hello there")["embedding"]
    assert _close(got, pooled(hf_text_hidden(checkpoint("text_embed"), "hello there"), "last"))


def test_a_generation_model_refuses_encode() -> None:
    from conftest import model_dir

    engine = sglang.Engine(model_path=model_dir("qwen2"), device="cpu", log_level="error")
    with pytest.raises(ValueError, match="--is-embedding"):
        engine.encode("hello")
