"""End-to-end: the real server process, the openai client and httpx."""

from __future__ import annotations

import base64
import io
import json
import os
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import openai
import pytest
from conftest import make_image, model_dir, placeholder
from PIL import Image
from server_utils import launch_server

API_KEY = "sk-test"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
PH = placeholder("qwen2_5_vl")


def _jpeg(seed: int, size: tuple[int, int] = (64, 64)) -> bytes:
    buf = io.BytesIO()
    make_image(seed, *size).save(buf, format="JPEG", quality=85)
    return buf.getvalue()


def _data_url(data: bytes) -> str:
    return "data:image/jpeg;base64," + base64.b64encode(data).decode()


class _MediaHandler(BaseHTTPRequestHandler):
    files: dict[str, bytes] = {}

    def do_GET(self) -> None:  # noqa: N802
        if self.path == "/slow.jpg":
            time.sleep(3)
        body = self.files.get(self.path)
        if body is None:
            self.send_response(404)
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Type", "image/jpeg")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module")
def media_host():
    _MediaHandler.files = {
        "/cat.jpg": _jpeg(1),
        "/slow.jpg": _jpeg(2),
        "/huge.jpg": b"\xff" * (2 * 1024 * 1024),
    }
    server = ThreadingHTTPServer(("127.0.0.1", 0), _MediaHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.fixture(scope="module")
def media_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("media")
    (root / "allowed.jpg").write_bytes(_jpeg(3))
    outside = tmp_path_factory.mktemp("outside") / "secret.jpg"
    outside.write_bytes(_jpeg(4))
    return root, outside


@pytest.fixture(scope="module")
def server(media_dir):
    flags = [
        "--api-key",
        API_KEY,
        "--enable-metrics",
        "--enable-cache-report",
        "--chunked-prefill-size",
        "32",
        "--context-length",
        "512",
        "--allowed-local-media-path",
        str(media_dir[0]),
        "--limit-mm-data-per-request",
        '{"image": 3}',
        "--media-url-max-file-size-mb",
        "1",
        "--media-url-timeout",
        "1",
        "--allow-private-media-urls",  # the media test host is on loopback
        "--served-model-name",
        "tiny-vl",
    ]
    with launch_server(model_dir("qwen2_5_vl"), *flags) as (url, pid):
        yield url


@pytest.fixture()
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server}/v1", api_key=API_KEY)


def _chat_image_message(urls: list[str], text: str = "What do you see?") -> list[dict]:
    parts = [{"type": "image_url", "image_url": {"url": u}} for u in urls]
    return [{"role": "user", "content": [*parts, {"type": "text", "text": text}]}]


def _assert_integrity(url: str) -> None:
    deadline = time.time() + 30
    while time.time() < deadline:
        info = httpx.get(f"{url}/server_info", headers=AUTH).json()
        if info["num_running_reqs"] == 0 and info["num_queue_reqs"] == 0:
            break
        time.sleep(0.2)
    assert info["num_running_reqs"] == 0 and info["num_queue_reqs"] == 0
    assert info["mm_embedding_cache"]["pinned"] == 0
    check = httpx.get(f"{url}/debug/check_integrity", headers=AUTH)
    assert check.status_code == 200 and check.json() == {"ok": True}, check.text


def test_chat_one_and_several_images_stream_and_not(client, server, media_host, media_dir):
    urls = [_data_url(_jpeg(10)), f"{media_host}/cat.jpg", str(media_dir[0] / "allowed.jpg")]
    for images in (urls[:1], urls):
        messages = _chat_image_message(images)
        full = client.chat.completions.create(
            model="tiny-vl", messages=messages, max_tokens=8, temperature=0
        )
        assert full.choices[0].finish_reason in ("length", "stop")
        assert full.usage.completion_tokens == 8 or full.choices[0].finish_reason == "stop"
        stream = client.chat.completions.create(
            model="tiny-vl",
            messages=messages,
            max_tokens=8,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = list(stream)
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == full.choices[0].message.content
        usage = chunks[-1].usage
        assert usage.prompt_tokens == full.usage.prompt_tokens
        assert usage.prompt_tokens_details.cached_tokens == usage.prompt_tokens - 1


def test_generate_single_batched_and_streaming(server):
    img = base64.b64encode(_jpeg(20)).decode()
    params = {"max_new_tokens": 6, "temperature": 0}
    single = httpx.post(
        f"{server}/generate",
        headers=AUTH,
        json={"text": f"Look {PH} here", "image_data": img, "sampling_params": params},
    ).json()
    assert len(single["output_ids"]) == 6 and single["meta_info"]["prompt_tokens"] > 6
    batch = httpx.post(
        f"{server}/generate",
        headers=AUTH,
        json={
            "text": [f"Look {PH} here", "no image"],
            "image_data": [img, None],
            "sampling_params": params,
        },
    ).json()
    assert isinstance(batch, list) and batch[0]["output_ids"] == single["output_ids"]
    assert batch[0]["meta_info"]["cached_tokens"] > 0
    events = []
    with httpx.stream(
        "POST",
        f"{server}/generate",
        headers=AUTH,
        json={
            "text": f"Look {PH} here",
            "image_data": img,
            "sampling_params": params,
            "stream": True,
        },
    ) as resp:
        for line in resp.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                events.append(json.loads(line[6:]))
    assert events[-1]["output_ids"] == single["output_ids"]
    assert events[-1]["text"] == single["text"]
    assert events[-1]["meta_info"]["finish_reason"]["type"] == "length"


def test_other_endpoints(server, client):
    assert client.models.list().data[0].id == "tiny-vl"
    comp = client.completions.create(
        model="tiny-vl", prompt="Once upon", max_tokens=5, temperature=0
    )
    assert comp.usage.completion_tokens == 5 and comp.choices[0].finish_reason == "length"
    info = httpx.get(f"{server}/model_info", headers=AUTH).json()
    assert info["has_image_understanding"] is True
    server_info = httpx.get(f"{server}/server_info", headers=AUTH).json()
    assert {"encoded_items", "hits", "preprocess_skipped"} <= set(server_info["mm_embedding_cache"])
    assert "api_key" not in server_info
    for path in ("/health", "/ready", "/health_generate"):
        assert httpx.get(f"{server}{path}").status_code == 200
    assert httpx.post(f"{server}/flush_cache", headers=AUTH).status_code == 200
    metrics = httpx.get(f"{server}/metrics").text
    for name in (
        "sglang:time_to_first_token_seconds",
        "sglang:e2e_request_latency_seconds",
        "sglang:inter_token_latency_seconds",
        "sglang:prompt_tokens_total",
        "sglang:generation_tokens_total",
        "sglang:num_running_reqs",
        "sglang:num_queue_reqs",
        "sglang:token_usage",
        "sglang:cache_hit_rate",
        "sglang:mm_encoded_items",
        "sglang:mm_encoder_seconds",
    ):
        assert name in metrics, name


def test_api_key_is_enforced(server):
    assert httpx.get(f"{server}/v1/models").status_code == 401
    assert (
        httpx.get(f"{server}/v1/models", headers={"Authorization": "Bearer no"}).status_code == 401
    )
    assert httpx.post(f"{server}/generate", json={"text": "x"}).status_code == 401
    assert httpx.get(f"{server}/metrics").status_code == 200


def _bomb_png() -> bytes:
    buf = io.BytesIO()
    Image.new("1", (9000, 9000)).save(buf, format="PNG")
    return buf.getvalue()


def _bad_chat(urls: list[str], **extra) -> dict:
    return {"messages": _chat_image_message(urls), "max_tokens": 4, **extra}


@pytest.mark.parametrize(
    "name, path, body, needle",
    [
        (
            "corrupt image",
            "/v1/chat/completions",
            lambda h, d: _bad_chat([_data_url(_jpeg(1)[:100])]),
            "cannot decode",
        ),
        (
            "wrong base64",
            "/v1/chat/completions",
            lambda h, d: _bad_chat(["data:image/jpeg;base64,@@@notbase64"]),
            "base64",
        ),
        (
            "unsupported scheme",
            "/v1/chat/completions",
            lambda h, d: _bad_chat(["ftp://example.com/a.jpg"]),
            "scheme",
        ),
        (
            "fetch over size",
            "/v1/chat/completions",
            lambda h, d: _bad_chat([f"{h}/huge.jpg"]),
            "cannot fetch the image",
        ),
        (
            "fetch timeout",
            "/v1/chat/completions",
            lambda h, d: _bad_chat([f"{h}/slow.jpg"]),
            "cannot fetch the image",
        ),
        (
            "path outside allowed dir",
            "/v1/chat/completions",
            lambda h, d: _bad_chat([str(d[1])]),
            "neither valid base64 nor a readable file",
        ),
        (
            "decompression bomb",
            "/v1/chat/completions",
            lambda h, d: _bad_chat(
                ["data:image/png;base64," + base64.b64encode(_bomb_png()).decode()]
            ),
            "exceeds the limit",
        ),
        (
            "too many images",
            "/v1/chat/completions",
            lambda h, d: _bad_chat([_data_url(_jpeg(i)) for i in range(4)]),
            "limit is 3",
        ),
        (
            "prompt over context",
            "/generate",
            lambda h, d: {"text": "word " * 600},
            "context length",
        ),
        (
            "invalid sampling",
            "/v1/chat/completions",
            lambda h, d: {"messages": [{"role": "user", "content": "hi"}], "top_p": 2.0},
            "top_p",
        ),
        (
            "invalid generate params",
            "/generate",
            lambda h, d: {"text": "hi", "sampling_params": {"max_new_tokens": -1}},
            "max_new",
        ),
        ("missing messages", "/v1/chat/completions", lambda h, d: {"model": "x"}, "messages"),
    ],
)
def test_bad_input_is_a_400_and_server_keeps_serving(
    server, media_host, media_dir, name, path, body, needle
):
    resp = httpx.post(f"{server}{path}", headers=AUTH, json=body(media_host, media_dir), timeout=30)
    assert resp.status_code == 400, (name, resp.text)
    assert needle in resp.json()["error"]["message"], resp.text
    assert httpx.get(f"{server}/health_generate").status_code == 200


def test_malformed_json_is_a_400(server):
    resp = httpx.post(
        f"{server}/v1/chat/completions",
        headers={**AUTH, "Content-Type": "application/json"},
        content=b"{not json",
    )
    assert resp.status_code == 400


def test_disconnect_aborts_the_request(server):
    body = {
        "text": f"Long {PH} story",
        "image_data": base64.b64encode(_jpeg(30)).decode(),
        "sampling_params": {"max_new_tokens": 400, "ignore_eos": True, "temperature": 0},
        "stream": True,
    }
    steps_before = httpx.get(f"{server}/server_info", headers=AUTH).json()["forward_steps"]
    with httpx.stream("POST", f"{server}/generate", headers=AUTH, json=body) as resp:
        lines = resp.iter_lines()
        got = [next(lines) for _ in range(3)]
        assert any(line.startswith("data: ") for line in got)
    _assert_integrity(server)
    steps = httpx.get(f"{server}/server_info", headers=AUTH).json()["forward_steps"]
    assert steps - steps_before < 200  # stopped long before its 400 tokens


def test_concurrent_mixed_load(server):
    import concurrent.futures

    images = [_data_url(_jpeg(40 + i, (48 + 16 * (i % 3), 64))) for i in range(8)]

    def one(i: int) -> int:
        with httpx.Client(headers=AUTH, timeout=120) as http:
            if i % 3 == 0:
                resp = http.post(
                    f"{server}/generate",
                    json={"text": f"req {i} plain text", "sampling_params": {"max_new_tokens": 8}},
                )
                return resp.status_code
            body = {
                "messages": _chat_image_message([images[i % 8]], f"request {i}"),
                "max_tokens": 8,
                "temperature": 0.7,
                "stream": i % 2 == 0,
            }
            resp = http.post(f"{server}/v1/chat/completions", json=body)
            if body["stream"]:
                assert resp.text.rstrip().endswith("data: [DONE]")
            return resp.status_code

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        codes = list(pool.map(one, range(64)))
    assert codes == [200] * 64
    _assert_integrity(server)


def test_sigterm_leaves_no_orphan_process():
    with launch_server(model_dir("qwen2"), "--log-level", "warning") as (url, pid):
        children = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True)
        child_pids = [int(p) for p in children.stdout.split()]
        assert child_pids, "the scheduler runs in its own process"
    time.sleep(1)
    for child in child_pids:
        assert not os.path.exists(f"/proc/{child}") or _is_zombie(child)


def _is_zombie(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split(")")[-1].split()[0] == "Z"
