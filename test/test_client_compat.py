"""SGLang's clients, replayed: the exact request shapes each one sends (read from its source)
against a live server, with SGLang-shaped answers asserted.

- SGLang's frontend language (sglang 0.5.23, ``sglang/lang/backend/runtime_endpoint.py`` and
  ``interpreter.py``): ``GET /get_model_info`` (its chat template is picked by ``model_path``),
  ``POST /flush_cache``; every gen is a ``/generate`` whose ``sampling_params`` carry SGLang's
  whole set with defaults (``stop_regex: []`` included), plus ``regex`` for ``regex=`` /
  ``dtype=``; streaming reads the cumulative ``text`` of each SSE event; ``select`` first caches
  the prefix (``max_new_tokens: 0``), then scores every choice in one batched ``/generate`` with
  ``logprob_start_len = prompt_tokens - 2`` and ``return_text_in_logprobs`` (token healing reads
  the text of the first prompt entry); forks and ``run_batch`` pre-cache a shared prefix with
  ``max_new_tokens: 0``; ``sgl.image`` sends one raw base64 image, also with a batch of texts.
  The script benchmark/peers/sglang_frontend.sh runs the real frontend against a server.
- The OpenAI Python client (chat and completions, streamed and not, SGLang fields in
  ``extra_body``).
- vLLM's ``bench serve`` (``vllm/benchmarks/lib/endpoint_request_func.py``): streamed chat with
  ``max_completion_tokens`` and an image part, streamed completions with ``logprobs: null`` and
  ``repetition_penalty``, both with ``stream_options.include_usage`` and ``ignore_eos``; it
  times the first chunk that has choices, so none may come before the first token.
- sglang-router (0.3.2): requests re-serialized with its defaults (see test_router.py), streamed.
"""

from __future__ import annotations

import base64
import functools
import io
import json
import re
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import openai
import pytest
from conftest import make_image, model_dir

FAMILY = "qwen2_5_vl"
TIMEOUT = 120
# One running request at a time: the first-chunk test holds the only slot with a long request.
FLAGS = ("--max-running-requests", "1", "--chunked-prefill-size", "64")
# SglSamplingParams.to_srt_kwargs() of a plain gen, plus global_config's two decode settings.
FRONTEND_PARAMS = {
    "skip_special_tokens": True,
    "spaces_between_special_tokens": True,
    "max_new_tokens": 128,
    "min_new_tokens": 0,
    "n": 1,
    "stop": [],
    "stop_token_ids": [],
    "stop_regex": [],
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": -1,
    "min_p": 0.0,
    "frequency_penalty": 0.0,
    "presence_penalty": 0.0,
    "ignore_eos": False,
    "regex": None,
    "json_schema": None,
}
# The frontend's "qwen2-vl" chat template (chosen for a model path matching "qwen.*vl").
SYSTEM = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
IMAGE_TOKEN = "<|vision_start|><|image_pad|><|vision_end|>"
META_KEYS = {"id", "finish_reason", "prompt_tokens", "completion_tokens", "cached_tokens"}


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    from server_utils import launch_server

    with launch_server(model_dir(FAMILY), *FLAGS) as (url, _):
        yield url


@functools.cache
def _tokenizer() -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir(FAMILY))


def _png_base64(seed: int) -> str:
    buf = io.BytesIO()
    make_image(seed, 96, 64).save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode()


def _generate(url: str, body: dict[str, Any]) -> Any:
    resp = httpx.post(f"{url}/generate", json=body, timeout=TIMEOUT)
    assert resp.status_code == 200, resp.text
    return resp.json()


def _gen(url: str, text: str, image: str | None = None, **params: Any) -> dict[str, Any]:
    """A frontend gen: ``RuntimeEndpoint.generate``'s body."""
    body: dict[str, Any] = {"text": text, "sampling_params": {**FRONTEND_PARAMS, **params}}
    if image is not None:
        body["image_data"] = image
    return _generate(url, body)


def _assert_generate_shape(out: dict[str, Any]) -> None:
    assert set(out) == {"text", "output_ids", "meta_info"} and isinstance(out["text"], str)
    meta = out["meta_info"]
    assert META_KEYS <= set(meta) and meta["completion_tokens"] == len(out["output_ids"])
    assert meta["finish_reason"]["type"] in ("stop", "length")


def _sse(resp: httpx.Response) -> Iterator[dict[str, Any]]:
    """The JSON events of an SSE body, up to ``[DONE]`` (which must end it)."""
    for line in resp.iter_lines():
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            return
        yield json.loads(data)
    raise AssertionError("the stream ended without [DONE]")


# SGLang's frontend ---------------------------------------------------------------------------
def test_frontend_handshake_and_cache_calls(server: str) -> None:
    info = httpx.get(f"{server}/get_model_info").json()
    assert info["model_path"] == model_dir(FAMILY) and re.search("qwen.*vl", info["model_path"])
    assert httpx.get(f"{server}/server_info").json()["max_running_requests"] == 1
    prefix = SYSTEM + "<|im_start|>user\nA shared preamble for the forks. " * 4
    cached = _generate(server, {"text": prefix, "sampling_params": {"max_new_tokens": 0}})
    _assert_generate_shape(cached)
    assert cached["text"] == "" and cached["meta_info"]["completion_tokens"] == 0
    # A fork's gen then finds the prefix in the cache.
    out = _gen(server, prefix + "Tip 1:", max_new_tokens=4, temperature=0)
    assert out["meta_info"]["cached_tokens"] >= cached["meta_info"]["prompt_tokens"] - 1
    assert httpx.post(f"{server}/flush_cache").status_code == 200


def test_frontend_gen_with_every_default_param(server: str) -> None:
    out = _gen(server, "Question: two plus two?\nAnswer:", max_new_tokens=6, temperature=0)
    _assert_generate_shape(out)
    again = _gen(server, "Question: two plus two?\nAnswer:", max_new_tokens=6, temperature=0)
    assert again["output_ids"] == out["output_ids"]
    # stop strings, stop token ids and min_new_tokens as the frontend sends them
    ids = _gen(server, "Count:", max_new_tokens=8, temperature=0, ignore_eos=True)["output_ids"]
    stopped = _gen(server, "Count:", max_new_tokens=8, temperature=0, stop_token_ids=[ids[2]])
    assert stopped["output_ids"] == ids[: ids.index(ids[2]) + 1]


def test_frontend_regex_and_dtype_int(server: str) -> None:
    out = _gen(server, "Three digits: ", max_new_tokens=8, temperature=0, regex="[0-9]{3}")
    assert re.fullmatch("[0-9]{3}", out["text"]), out
    # dtype=int: REGEX_INT, with " " and "\n" as stop strings
    out = _gen(
        server, "A number: ", max_new_tokens=8, temperature=0, regex=r"[-+]?[0-9]+[ \n]*",
        stop=[" ", "\n"],
    )  # fmt: skip
    assert re.fullmatch(r"[-+]?[0-9]+", out["text"]), out


def test_frontend_stop_regex(server: str) -> None:
    base = {"max_new_tokens": 24, "temperature": 0, "ignore_eos": True}
    free = _gen(server, "Count: one two three", **base)
    pattern = r"[a-z]\s"  # a letter and a space: nothing the text spells literally
    assert re.search(pattern, free["text"][:-2]), free["text"]  # the tiny model's greedy text
    out = _gen(server, "Count: one two three", **base, stop_regex=[pattern])
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": pattern}
    ids = out["output_ids"]
    assert free["output_ids"][: len(ids)] == ids and len(ids) < len(free["output_ids"])
    assert re.search(pattern, out["text"])  # the matched text stays in the output
    assert not re.search(pattern, _tokenizer().decode(ids[:-1]))  # the first match


def test_frontend_streaming_reads_cumulative_text(server: str) -> None:
    body = {
        "text": "Tell a story:",
        "sampling_params": {**FRONTEND_PARAMS, "max_new_tokens": 12, "ignore_eos": True},
        "stream": True,
    }
    pos, pieces, events = 0, [], []
    with httpx.stream("POST", f"{server}/generate", json=body, timeout=TIMEOUT) as resp:
        assert resp.status_code == 200
        for event in _sse(resp):
            pieces.append(event["text"][pos:])  # the frontend's own reading of a stream
            pos += len(pieces[-1])
            events.append(event)
    assert len(events) > 1 and events[-1]["meta_info"]["completion_tokens"] == 12
    assert "".join(pieces) == events[-1]["text"]
    assert all(events[i]["text"].startswith(events[i - 1]["text"]) for i in range(1, len(events)))


def test_stream_interval(server: str) -> None:
    """SGLang's rule: the first token at once, then every ``stream_interval`` tokens, and the
    last."""
    params = {"max_new_tokens": 12, "ignore_eos": True, "stream_interval": 4}
    body = {"text": "Count:", "sampling_params": params, "stream": True}
    with httpx.stream("POST", f"{server}/generate", json=body, timeout=TIMEOUT) as resp:
        counts = [e["meta_info"]["completion_tokens"] for e in _sse(resp)]
    assert counts[0] == 1 and counts[-1] == 12 and len(counts) <= 4
    assert all(b - a >= 4 for a, b in zip(counts[:-2], counts[1:-1])), counts


def _select(url: str, text: str, choices: list[str], image: str | None = None) -> list[dict]:
    """``RuntimeEndpoint.select``'s two requests; returns the scored choices."""
    first: dict[str, Any] = {"text": text, "sampling_params": {"max_new_tokens": 0}}
    second: dict[str, Any] = {
        "text": [text + c for c in choices],
        "sampling_params": {"max_new_tokens": 0, "temperature": 0},
        "return_logprob": True,
        "return_text_in_logprobs": True,
    }
    if image is not None:
        first["image_data"] = second["image_data"] = image
    prompt_len = _generate(url, first)["meta_info"]["prompt_tokens"]
    second["logprob_start_len"] = max(prompt_len - 2, 0)
    scored = _generate(url, second)
    assert isinstance(scored, list) and len(scored) == len(choices)
    for out in scored:
        meta = out["meta_info"]
        entries = meta["input_token_logprobs"]
        assert len(entries) == meta["prompt_tokens"] - second["logprob_start_len"]
        assert meta["output_token_logprobs"] == [] and out["text"] == ""
        # token healing tests the prompt against the text of the first entry
        assert all(isinstance(lp, float) and isinstance(t, str) for lp, _, t in entries)
    return scored


def test_frontend_select_with_token_healing(server: str) -> None:
    tokenizer = _tokenizer()
    text = "The colour of a clear sky is "
    scored = _select(server, text, [" blue", " red", "green"])
    for out in scored:
        for _, token, token_text in out["meta_info"]["input_token_logprobs"]:
            assert token_text == tokenizer.decode([token])
    # without return_text_in_logprobs the entries carry no text, as in SGLang
    body = {"text": text, "sampling_params": {"max_new_tokens": 1, "temperature": 0}}
    body |= {"return_logprob": True, "top_logprobs_num": 2, "logprob_start_len": 3}
    meta = _generate(server, body)["meta_info"]
    assert {e[2] for e in meta["input_token_logprobs"] + meta["output_token_logprobs"]} == {None}
    assert meta["input_top_logprobs"][0][0][2] is None
    # top-k entries with their text
    meta = _generate(server, {**body, "return_text_in_logprobs": True})["meta_info"]
    for top in meta["input_top_logprobs"] + meta["output_top_logprobs"]:
        assert len(top) == 2 and all(t == tokenizer.decode([tok]) for _, tok, t in top)
    assert meta["output_token_logprobs_length"] == 1
    # the unconditional-likelihood method's request (input_ids, no logprob_start_len): SGLang
    # then returns no prompt logprobs, and its keys are still there
    body = {"input_ids": [[9, 10, 11]], "sampling_params": {"max_new_tokens": 0}}
    meta = _generate(server, {**body, "return_logprob": True})[0]["meta_info"]
    assert meta["input_token_logprobs"] == [] == meta["output_token_logprobs"]


def test_frontend_image_gen_and_select(server: str) -> None:
    image = _png_base64(5)  # sgl.image sends the file's bytes as raw base64
    prompt = SYSTEM + f"<|im_start|>user\n{IMAGE_TOKEN}What is this?<|im_end|>\n"
    prompt += "<|im_start|>assistant\n"
    out = _gen(server, prompt, image=image, max_new_tokens=6, temperature=0)
    _assert_generate_shape(out)
    assert out["meta_info"]["prompt_tokens"] > 30  # the image's placeholder tokens
    scored = _select(server, prompt, ["cat", "dog"], image=image)
    assert all(s["meta_info"]["prompt_tokens"] > 30 for s in scored)


def test_frontend_run_batch_threads(server: str) -> None:
    prompts = [f"Topic {t}. One word:" for t in ("sea", "sky", "stone", "tree")]
    with ThreadPoolExecutor(4) as pool:
        outs = list(pool.map(lambda p: _gen(server, p, max_new_tokens=4, temperature=0), prompts))
    for out in outs:
        _assert_generate_shape(out)


# The OpenAI client ---------------------------------------------------------------------------
def test_openai_client_chat_and_completions(server: str) -> None:
    client = openai.OpenAI(base_url=f"{server}/v1", api_key="EMPTY")
    image = {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{_png_base64(6)}"}}
    messages = [{"role": "user", "content": [image, {"type": "text", "text": "Describe it."}]}]
    reply = client.chat.completions.create(
        model="default", messages=messages, max_tokens=5, temperature=0
    )
    assert reply.object == "chat.completion" and reply.choices[0].message.role == "assistant"
    assert reply.usage.completion_tokens <= 5 and reply.usage.prompt_tokens > 30
    chunks = list(
        client.chat.completions.create(
            model="default", messages=messages, max_tokens=5, temperature=0, stream=True,
            stream_options={"include_usage": True},
        )
    )  # fmt: skip
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[-1].usage is not None
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == reply.choices[0].message.content
    done = client.completions.create(
        model="default", prompt="Count: one two three", max_tokens=24, temperature=0,
        extra_body={"ignore_eos": True, "stop_regex": r"[a-z]\s", "top_k": 5},
    )  # fmt: skip
    assert done.choices[0].finish_reason == "stop" and re.search(r"[a-z]\s", done.choices[0].text)


# vLLM's bench serve --------------------------------------------------------------------------
def _bench_stream(url: str, path: str, payload: dict) -> tuple[list[dict], dict]:
    """Read a stream as bench serve does: chunks with choices, then the usage chunk."""
    headers = {"x-request-id": "bench-0"}
    chunks, usage = [], {}
    with httpx.stream("POST", url + path, json=payload, headers=headers, timeout=TIMEOUT) as r:
        assert r.status_code == 200, r.read()
        for data in _sse(r):
            if data.get("choices"):
                chunks.append(data)
            elif data.get("usage"):
                usage = data["usage"]
    return chunks, usage


def test_vllm_bench_serve_requests(server: str) -> None:
    image = {"type": "image_url", "image_url": {"url": f"data:image/jpeg;base64,{_png_base64(7)}"}}
    chat = {
        "model": model_dir(FAMILY),
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}, image]}],
        "max_completion_tokens": 6,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
    }
    chunks, usage = _bench_stream(server, "/v1/chat/completions", chat)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[0]["object"] == "chat.completion.chunk"
    assert usage["completion_tokens"] == 6 and usage["prompt_tokens"] > 30
    completion = {
        "model": model_dir(FAMILY),
        "prompt": "Once upon a time",
        "repetition_penalty": 1.0,
        "max_tokens": 6,
        "logprobs": None,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
    }
    chunks, usage = _bench_stream(server, "/v1/completions", completion)
    assert chunks[0]["object"] == "text_completion" and usage["completion_tokens"] == 6
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


# sglang-router ---------------------------------------------------------------------------------
def test_router_reserialized_streams(server: str) -> None:
    router_fields = {"return_hidden_states": False, "no_stop_trim": False, "ignore_eos": True}
    chat = {
        "messages": [{"role": "user", "content": "hi"}],
        "model": "unknown",
        "logprobs": False,
        "max_completion_tokens": 3,
        "stream": True,
        "skip_special_tokens": True,
        "separate_reasoning": True,
        "stream_reasoning": True,
        "continue_final_message": False,
        **router_fields,
    }
    chunks, _ = _bench_stream(server, "/v1/chat/completions", chat)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    body = {
        "text": "hi",
        "model": None,
        "sampling_params": {"max_new_tokens": 3, "ignore_eos": True},
        "return_text_in_logprobs": False,
        "stream": True,
        "log_metrics": True,
        "return_hidden_states": False,
        "background": False,
        "no_logs": False,
        "return_bytes": False,
        "return_entropy": False,
    }
    with httpx.stream("POST", f"{server}/generate", json=body, timeout=TIMEOUT) as resp:
        events = list(_sse(resp))
    assert events[-1]["meta_info"]["completion_tokens"] == 3
    assert events[-1]["meta_info"]["finish_reason"] == {"type": "length", "length": 3}


# No chunk before the first token ---------------------------------------------------------------
def _first_chunk(url: str, path: str, body: dict, seen: dict[str, tuple[float, dict]]) -> None:
    with httpx.stream("POST", url + path, json=body, timeout=TIMEOUT) as resp:
        for data in _sse(resp):
            seen.setdefault(path, (time.perf_counter(), data))


def _wait_queued(url: str, waiting: int) -> None:
    deadline = time.time() + 60
    while httpx.get(f"{url}/get_load").json()[0]["num_waiting_reqs"] < waiting:
        assert time.time() < deadline, "the requests never reached the queue"
        time.sleep(0.05)


def test_no_streamed_chunk_precedes_the_first_token(server: str) -> None:
    """The only running slot is held by a long request, so the streams below wait in the queue
    with no token: none may send anything (a chat's role delta, a completion's echo) until the
    long request is gone and they have their first token."""
    streams = {
        "/v1/chat/completions": {
            "messages": [{"role": "user", "content": "Hi"}],
            "max_tokens": 3,
            "stream": True,
        },
        "/v1/completions": {"prompt": "Echo me", "max_tokens": 3, "echo": True, "stream": True},
        "/generate": {"text": "Hi", "sampling_params": {"max_new_tokens": 3}, "stream": True},
    }
    blocker = {
        "text": "Hold the slot",
        "sampling_params": {"max_new_tokens": 3000, "ignore_eos": True, "temperature": 0},
        "stream": True,
    }
    seen: dict[str, tuple[float, dict]] = {}
    with httpx.stream("POST", f"{server}/generate", json=blocker, timeout=TIMEOUT) as held:
        events = _sse(held)  # kept: a generator closed early closes the response
        next(events)  # it is running
        threads = [
            threading.Thread(target=_first_chunk, args=(server, path, body, seen))
            for path, body in streams.items()
        ]
        for thread in threads:
            thread.start()
        _wait_queued(server, len(streams))
        time.sleep(0.3)  # what was sent before a token would have arrived by now
        released = time.perf_counter()
        assert not seen, f"chunks before any token: {seen}"
    # leaving the blocker's stream aborts it; the queued requests run
    for thread in threads:
        thread.join(TIMEOUT)
    assert set(seen) == set(streams)
    assert all(at > released for at, _ in seen.values())
    assert seen["/v1/chat/completions"][1]["choices"][0]["delta"]["role"] == "assistant"
    assert seen["/v1/completions"][1]["choices"][0]["text"] == "Echo me"
    assert seen["/generate"][1]["meta_info"]["completion_tokens"] >= 1
