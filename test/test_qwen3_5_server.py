"""The server on a tiny Qwen3.5: multi-turn image chat resumes from state snapshots, thinking
control (chat_template_kwargs, --reasoning-parser qwen3), concurrent load, integrity checks."""

from __future__ import annotations

import base64
import concurrent.futures
import io
import json
import time

import httpx
import pytest
from conftest import make_image, model_dir
from server_utils import launch_server

NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}


def _image_url(seed: int, width: int = 64, height: int = 64) -> str:
    buf = io.BytesIO()
    make_image(seed, width, height).save(buf, format="JPEG", quality=85)
    return "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode()


def _user(text: str, *images: str) -> dict:
    parts = [{"type": "image_url", "image_url": {"url": url}} for url in images]
    return {"role": "user", "content": [*parts, {"type": "text", "text": text}]}


@pytest.fixture(scope="module")
def server():
    flags = ["--enable-cache-report", "--chunked-prefill-size", "32", "--reasoning-parser", "qwen3"]
    with launch_server(model_dir("qwen3_5"), *flags) as (url, _):
        yield url


def _chat(url: str, messages: list[dict], **extra) -> dict:
    body = {"messages": messages, "max_tokens": 8, "temperature": 0, **extra}
    resp = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120)
    assert resp.status_code == 200, resp.text
    return resp.json()


def _stream(url: str, messages: list[dict], **extra) -> tuple[str, str]:
    body = {"messages": messages, "max_tokens": 8, "temperature": 0, "stream": True, **extra}
    reasoning = content = ""
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=120) as resp:
        for line in resp.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                for choice in json.loads(line[6:])["choices"]:
                    reasoning += choice["delta"].get("reasoning_content") or ""
                    content += choice["delta"].get("content") or ""
    return reasoning, content


def _info(url: str) -> dict:
    return httpx.get(f"{url}/server_info").json()


def _assert_integrity(url: str) -> None:
    deadline = time.time() + 30
    while _info(url)["num_running_reqs"] and time.time() < deadline:
        time.sleep(0.2)
    check = httpx.get(f"{url}/debug/check_integrity")
    assert check.status_code == 200 and check.json() == {"ok": True}, check.text


def test_multi_turn_image_chat_hits_the_cache_from_round_one(server) -> None:
    httpx.post(f"{server}/flush_cache")
    messages: list[dict] = []
    restored = _info(server)["linear_state"]["restored"]
    for turn in range(3):
        messages.append(_user(f"Round {turn}: what changed?", _image_url(100 + turn)))
        encoded = _info(server)["mm_embedding_cache"]["encoded_items"]
        out = _chat(server, messages, **NO_THINKING)
        cached = out["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert turn == 0 or cached > 0
        assert _info(server)["mm_embedding_cache"]["encoded_items"] - encoded == 1
        messages.append({"role": "assistant", "content": out["choices"][0]["message"]["content"]})
    assert _info(server)["linear_state"]["restored"] - restored == 2
    _assert_integrity(server)


def test_thinking_control_and_reasoning_parser(server) -> None:
    messages = [_user("Describe it.", _image_url(7))]
    thinking = _chat(server, messages)  # the template opens <think>: output starts inside it
    plain = _chat(server, messages, **NO_THINKING)
    # enable_thinking=False closes the block in the prompt: "<think>\n\n</think>\n\n"
    assert thinking["usage"]["prompt_tokens"] < plain["usage"]["prompt_tokens"]

    raw = _chat(server, messages, separate_reasoning=False)["choices"][0]["message"]
    assert raw["reasoning_content"] is None  # SGLang's message always has the key
    parsed = thinking["choices"][0]["message"]
    # The template opened the block: reasoning runs to </think>, whitespace around it dropped.
    reasoning, _, content = raw["content"].partition("</think>")
    assert (parsed["reasoning_content"], parsed["content"]) == (reasoning.strip(), content.lstrip())
    assert parsed["reasoning_content"]  # a random model never closes the block in 8 tokens
    assert _stream(server, messages) == (parsed["reasoning_content"], parsed["content"])

    no_block = plain["choices"][0]["message"]
    assert no_block["reasoning_content"] is None  # the output never opened a block
    assert _stream(server, messages, **NO_THINKING)[1] == no_block["content"]


def test_reserved_template_kwargs_are_rejected(server) -> None:
    body = {
        "messages": [_user("hi")],
        "max_tokens": 2,
        "chat_template_kwargs": {"add_generation_prompt": False},
    }
    resp = httpx.post(f"{server}/v1/chat/completions", json=body, timeout=60)
    assert resp.status_code == 400 and "add_generation_prompt" in resp.text


def test_concurrent_mixed_load(server) -> None:
    images = [_image_url(200 + i, 48 + 16 * (i % 3), 64) for i in range(6)]

    def one(i: int) -> int:
        with httpx.Client(timeout=180) as http:
            if i % 3 == 0:
                body = {"text": f"req {i} plain text", "sampling_params": {"max_new_tokens": 6}}
                return http.post(f"{server}/generate", json=body).status_code
            body = {
                "messages": [_user(f"request {i}", images[i % 6])],
                "max_tokens": 6,
                "temperature": 0.7,
                "stream": i % 2 == 0,
                **(NO_THINKING if i % 4 else {}),
            }
            resp = http.post(f"{server}/v1/chat/completions", json=body)
            if body["stream"]:
                assert resp.text.rstrip().endswith("data: [DONE]")
            return resp.status_code

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        codes = list(pool.map(one, range(24)))
    assert codes == [200] * 24
    _assert_integrity(server)


def test_reasoning_tokens_count_the_thinking_part(server) -> None:
    """SGLang's ``usage.reasoning_tokens``: the whole output while the block the prompt opened
    stays open, 0 without thinking; ``/generate``'s ``require_reasoning`` counts to the end tag
    (here forced at once by logit_bias), and an output that opens the block itself reasons."""
    messages = [_user("Describe it.")]
    usage = _chat(server, messages)["usage"]
    assert usage["reasoning_tokens"] == usage["completion_tokens"] == 8
    assert usage["completion_tokens_details"] == {"reasoning_tokens": 8}
    plain = _chat(server, messages, **NO_THINKING)["usage"]
    assert plain["reasoning_tokens"] == 0 and "completion_tokens_details" not in plain
    for extra, expected in (({}, 8), (NO_THINKING, 0)):
        body = {"messages": messages, "max_tokens": 8, "stream": True, **extra}
        body["stream_options"] = {"include_usage": True}
        with httpx.stream("POST", f"{server}/v1/chat/completions", json=body, timeout=120) as r:
            lines = [x[6:] for x in r.iter_lines() if x.startswith("data: {")]
        assert json.loads(lines[-1])["usage"]["reasoning_tokens"] == expected

    ids = httpx.post(f"{server}/tokenize", json={"prompt": "<think></think>"}).json()["tokens"]
    think, end = ids  # one special token each
    for bias, require, expected in ((end, True, 1), (end, False, 0), (think, False, 4)):
        body = {
            "text": "Question: what is 1+3?",
            "sampling_params": {"max_new_tokens": 4, "logit_bias": {str(bias): 100.0}},
            "require_reasoning": require,
        }
        out = httpx.post(f"{server}/generate", json=body, timeout=60).json()
        assert out["output_ids"] == [bias] * 4
        assert out["meta_info"]["reasoning_tokens"] == expected, (bias, require)
