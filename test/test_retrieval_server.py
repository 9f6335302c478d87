"""``/v1/embeddings``, ``/v1/score`` and ``/v1/rerank`` over HTTP against HF: SGLang's and vLLM's
example bodies unchanged, base64, usage, cosine and cross-encoder ranking, bad inputs (400, the
server keeps serving, nothing leaks), and a corpus embedded twice encoding each image once."""

from __future__ import annotations

import base64
import struct

import httpx
import pytest
import torch
from retrieval_reference import (
    chat_prompt,
    checkpoint,
    data_url,
    hf_classifier_score,
    hf_hidden,
    image,
    png,
    pooled,
)
from server_utils import launch_server

ATOL = 1e-5


@pytest.fixture(scope="module")
def embed_server(tmp_path_factory):
    media = tmp_path_factory.mktemp("media")
    for seed in (1, 2):
        (media / f"{seed}.png").write_bytes(png(seed))
    flags = ("--chunked-prefill-size", "16", "--allowed-local-media-path", str(media))
    with launch_server(checkpoint("qwen_embed"), *flags) as (url, _):
        yield url, media


@pytest.fixture(scope="module")
def rerank_server():
    with launch_server(checkpoint("gemma_score"), "--chunked-prefill-size", "24") as (url, _):
        yield url


def _post(url: str, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{url}{path}", json=body, timeout=60)


def _vectors(resp: httpx.Response) -> list[torch.Tensor]:
    assert resp.status_code == 200, resp.text
    return [torch.tensor(d["embedding"]) for d in resp.json()["data"]]


def _from_base64(text: str) -> torch.Tensor:
    raw = base64.b64decode(text)
    return torch.tensor(struct.unpack(f"<{len(raw) // 4}f", raw))


def _close(got: torch.Tensor, want: torch.Tensor) -> bool:
    return torch.allclose(got, want, atol=ATOL, rtol=0)


def test_sglang_and_vllm_example_bodies(embed_server) -> None:
    url, media = embed_server
    path = checkpoint("qwen_embed")
    text = "a picture of noise"
    # SGLang's multimodal embedding example (an image path, then a text input)
    sglang_body = {"model": path, "input": [{"text": text}, {"image": str(media / "1.png")}]}
    got_text, got_image = _vectors(_post(url, "/v1/embeddings", sglang_body))
    assert _close(got_text, pooled(hf_hidden(path, text, []), "last"))
    want_image = hf_hidden(path, chat_prompt(path, [{"type": "image"}], True), [image(1)])
    assert _close(got_image, pooled(want_image, "last"))
    # vLLM's chat embedding example: the template without the generation prompt
    parts = [{"type": "image_url", "image_url": {"url": data_url(2)}},
             {"type": "text", "text": "Represent the given image."}]  # fmt: skip
    vllm_body = {"model": path, "messages": [{"role": "user", "content": parts}],
                 "encoding_format": "float"}  # fmt: skip
    (got_chat,) = _vectors(_post(url, "/v1/embeddings", vllm_body))
    hf_parts = [{"type": "image"}, {"type": "text", "text": "Represent the given image."}]
    prompt = chat_prompt(path, hf_parts, generation_prompt=False)
    assert _close(got_chat, pooled(hf_hidden(path, prompt, [image(2)]), "last"))


def test_openai_inputs_base64_and_usage(embed_server) -> None:
    url, _ = embed_server
    tokenizer_ids = _post(url, "/v1/tokenize", {"prompt": "token ids"}).json()["tokens"]
    body = {"input": ["first text", "second text"], "encoding_format": "base64"}
    resp = _post(url, "/v1/embeddings", body)
    data = resp.json()["data"]
    decoded = [_from_base64(d["embedding"]) for d in data]
    floats = _vectors(_post(url, "/v1/embeddings", {"input": ["first text", "second text"]}))
    assert all(_close(a, b) for a, b in zip(decoded, floats))
    path = checkpoint("qwen_embed")
    assert _close(floats[1], pooled(hf_hidden(path, "second text", []), "last"))
    counts = [_post(url, "/v1/tokenize", {"prompt": t}).json()["count"] for t in body["input"]]
    assert resp.json()["usage"] == {"prompt_tokens": sum(counts), "total_tokens": sum(counts)}
    by_ids = _vectors(_post(url, "/v1/embeddings", {"input": tokenizer_ids}))[0]
    assert _close(by_ids, pooled(hf_hidden(path, "token ids", []), "last"))


@pytest.mark.parametrize(
    "body, needle",
    [
        ({}, "exactly one of 'input' and 'messages'"),
        ({"input": []}, "cannot be empty"),
        ({"input": "x", "dimensions": 8}, "Matryoshka"),
        ({"input": ["fine", "long " * 3000]}, "context length"),
        ({"input": [{"image": "data:image/png;base64,AAAA"}]}, "image"),
    ],
    ids=["no-input", "empty", "dimensions", "over-long", "bad-image"],
)
def test_bad_embedding_requests_are_400_and_change_nothing(embed_server, body, needle) -> None:
    url, _ = embed_server
    before = httpx.get(f"{url}/server_info").json()
    resp = _post(url, "/v1/embeddings", body)
    assert resp.status_code == 400 and needle in resp.json()["message"], resp.text
    after = httpx.get(f"{url}/server_info").json()
    assert after["forward_steps"] == before["forward_steps"]  # nothing of the batch ran
    assert httpx.get(f"{url}/debug/check_integrity").json() == {"ok": True}
    assert len(_vectors(_post(url, "/v1/embeddings", {"input": "still serving"}))) == 1


def test_corpus_twice_with_two_instructions_encodes_each_image_once(embed_server) -> None:
    url, _ = embed_server

    def encoded() -> int:
        return httpx.get(f"{url}/server_info").json()["mm_embedding_cache"]["encoded_items"]

    httpx.post(f"{url}/flush_cache")
    before = encoded()
    corpus = [data_url(10 + i) for i in range(3)]
    for instruction in ("Represent this image for retrieval.", "Find an image like this."):
        body = {"input": [{"text": instruction, "image": u} for u in corpus]}
        assert len(_vectors(_post(url, "/v1/embeddings", body))) == 3
    assert encoded() - before == 3


def test_rerank_with_an_embedding_model_orders_by_cosine(embed_server) -> None:
    url, _ = embed_server
    path = checkpoint("qwen_embed")
    docs = ["red apples", "blue sky", "green grass", "apples and pears"]
    body = {"query": "fruit", "documents": docs, "top_n": 3}
    resp = _post(url, "/v1/rerank", body).json()
    query = pooled(hf_hidden(path, "fruit", []), "last")
    want = [float(query @ pooled(hf_hidden(path, d, []), "last")) for d in docs]
    order = sorted(range(len(docs)), key=lambda i: -want[i])[:3]
    assert [r["index"] for r in resp["results"]] == order
    assert all(abs(r["relevance_score"] - want[r["index"]]) < ATOL for r in resp["results"])
    assert resp["results"][0]["document"] == {"text": docs[order[0]]}


def test_cross_encoder_rerank_and_score_equal_hf(rerank_server) -> None:
    url = rerank_server
    path = checkpoint("gemma_score")
    query = "a noisy picture"
    # Jina's multimodal documents: images and text
    documents = [{"image": data_url(20)}, {"text": "a photo of a cat"}, {"image": data_url(21)}]
    resp = _post(url, "/v1/rerank", {"query": query, "documents": documents}).json()
    doc_parts = [[{"type": "image"}], [{"type": "text", "text": "a photo of a cat"}],
                 [{"type": "image"}]]  # fmt: skip
    images = [[image(20)], [], [image(21)]]
    want = [
        hf_classifier_score(
            path, chat_prompt(path, [{"type": "text", "text": query}, *p], True), im
        )
        for p, im in zip(doc_parts, images)
    ]
    assert [r["index"] for r in resp["results"]] == sorted(range(3), key=lambda i: -want[i])
    assert all(abs(r["relevance_score"] - want[r["index"]]) < ATOL for r in resp["results"])
    # vLLM's score body: one text against several
    score = _post(url, "/v1/score", {"text_1": query, "text_2": ["a photo of a cat", "x"]}).json()
    assert abs(score["data"][0]["score"] - want[1]) < ATOL and len(score["data"]) == 2
    bad = _post(url, "/v1/rerank", {"query": query, "documents": []})
    assert bad.status_code == 400 and "nothing to score" in bad.json()["message"]
    assert httpx.get(f"{url}/debug/check_integrity").json() == {"ok": True}


def test_an_embedding_server_refuses_generation_and_says_so(embed_server) -> None:
    """As SGLang's ``is_generation: false`` server: chat and /generate are a 400 naming the
    endpoints it serves, its health probe pools instead of generating."""
    url, _ = embed_server
    assert httpx.get(f"{url}/model_info").json()["is_generation"] is False
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    for path, body in (("/v1/chat/completions", chat), ("/generate", {"text": "hi"})):
        resp = _post(url, path, body)
        assert resp.status_code == 400 and "/v1/embeddings" in resp.text, resp.text
    assert httpx.get(f"{url}/health_generate", timeout=60).status_code == 200
    assert httpx.get(f"{url}/debug/check_integrity").json() == {"ok": True}
