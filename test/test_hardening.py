"""Requests that used to take the server down, hang it or slip past its limits, each probed
against the real server process; the server must answer and stay consistent."""

from __future__ import annotations

import base64
import io
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import psutil
import pytest
from conftest import make_image, model_dir, placeholder
from server_utils import launch_server

PH = placeholder("qwen2_5_vl")
BARE_RUN = "<|image_pad|>" * 16


def _jpeg(seed: int) -> bytes:
    buf = io.BytesIO()
    make_image(seed).save(buf, format="JPEG", quality=85)
    return buf.getvalue()


class _Media(BaseHTTPRequestHandler):
    redirect_to = ""

    def do_GET(self) -> None:  # noqa: N802
        if self.path == "/redirect":
            self.send_response(302)
            self.send_header("Location", self.redirect_to)
            self.end_headers()
            return
        if self.path in ("/missing.jpg", "/big.jpg", "/notes.txt"):
            body = {"/big.jpg": b"\xff" * (2 << 20), "/notes.txt": b"plain text"}.get(self.path)
            self.send_response(404 if body is None else 200)
            self.end_headers()
            self.wfile.write(body or b"")
            return
        if self.path == "/trickle.jpg":  # one byte at a time, never fast enough
            self.send_response(200)
            self.send_header("Content-Length", "1000")
            self.end_headers()
            for _ in range(40):
                self.wfile.write(b"\xff")
                self.wfile.flush()
                time.sleep(0.25)
            return
        self.send_response(200)
        self.end_headers()
        self.wfile.write(_jpeg(1))

    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module")
def media_host():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Media)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.fixture(scope="module")
def server():
    flags = ["--context-length", "4096", "--chunked-prefill-size", "32", "--media-url-timeout", "1"]
    with launch_server(model_dir("qwen2_5_vl"), *flags) as (url, pid):
        yield url, pid


def _post(url: str, path: str, body: dict, **kw) -> httpx.Response:
    return httpx.post(f"{url}{path}", json=body, timeout=kw.pop("timeout", 60), **kw)


def _chat(content, **extra) -> dict:
    return {"messages": [{"role": "user", "content": content}], "max_tokens": 4, **extra}


def _assert_healthy(url: str) -> None:
    assert httpx.get(f"{url}/health_generate", timeout=60).status_code == 200
    deadline = time.time() + 30
    while time.time() < deadline:
        info = httpx.get(f"{url}/server_info").json()
        if info["num_running_reqs"] == 0 and info["num_queue_reqs"] == 0:
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"the server did not drain in 30 s: {info['load']}")
    assert info["mm_embedding_cache"]["pinned"] == 0
    assert httpx.get(f"{url}/debug/check_integrity").json() == {"ok": True}


def _assert_error(resp: httpx.Response, status: int, needle: str) -> None:
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert body["object"] == "error" and needle in body["error"]["message"], body


PROBES = [
    # (name, path, body, needle): each used to end the scheduler process or run wild
    ("bare placeholder run, /generate", "/generate", {"text": f"hi {BARE_RUN} there"}, "no image"),
    ("placeholder token, no image, chat", "/v1/chat/completions", _chat(f"see {PH}"), "no image"),
    ("token id past the vocabulary", "/generate", {"input_ids": [1, 2, 10**9]}, "vocabulary"),
    ("negative token id", "/generate", {"input_ids": [1, -5, 3]}, "vocabulary"),
    ("temperature infinity", "/generate", {"text": "a", "sampling_params": {}}, "temperature"),
    ("max_tokens 0 in chat", "/v1/chat/completions", _chat("hi", max_tokens=0), "max_tokens"),
    ("negative max_tokens", "/v1/completions", {"prompt": "a", "max_tokens": -2}, "max_tokens"),
    ("logit_bias out of range", "/v1/chat/completions", _chat("hi", logit_bias={"5": 1e3}), "bias"),
    (
        "uncompilable response_format",
        "/v1/chat/completions",
        _chat(
            "hi", response_format={"type": "json_schema", "json_schema": {"schema": {"type": 7}}}
        ),
        "invalid json_schema",
    ),
    (
        "tool_choice required without a parser",
        "/v1/chat/completions",
        _chat(
            "hi", tools=[{"type": "function", "function": {"name": "f"}}], tool_choice="required"
        ),
        "--tool-call-parser",
    ),
    (
        "legacy functions",
        "/v1/chat/completions",
        _chat("hi", functions=[{"name": "f"}]),
        "'functions'",
    ),
    ("completion suffix", "/v1/completions", {"prompt": "a", "suffix": "b"}, "'suffix'"),
    ("generate lora", "/generate", {"text": "a", "lora_path": "x"}, "'lora_path'"),
    ("seed out of range", "/generate", {"text": "a", "sampling_params": {"seed": 2**80}}, "seed"),
    ("rid list for one prompt", "/generate", {"text": "a", "rid": ["x"]}, "rid must be a string"),
    ("rid count off", "/generate", {"text": ["a", "b"], "rid": ["x"]}, "rid must be a list"),
]


@pytest.mark.parametrize("name, path, body, needle", PROBES, ids=[p[0] for p in PROBES])
def test_request_errors_are_400_and_the_server_survives(server, name, path, body, needle):
    url, _ = server
    if name == "temperature infinity":  # JSON has no infinity; Python's encoder writes one
        content = json.dumps({**body, "sampling_params": {"temperature": float("inf")}})
        resp = httpx.post(
            f"{url}{path}", content=content, headers={"Content-Type": "application/json"}
        )
    else:
        resp = _post(url, path, body)
    _assert_error(resp, 400, needle)
    _assert_healthy(url)


@pytest.mark.parametrize("temperature", [1e-40, 1e-300, 5e-324])
def test_tiny_temperatures_sample_the_argmax(server, temperature):
    url, _ = server
    params = {"max_new_tokens": 8, "temperature": 0}
    greedy = _post(url, "/generate", {"text": "Once", "sampling_params": params})
    params["temperature"] = temperature
    tiny = _post(url, "/generate", {"text": "Once", "sampling_params": params})
    assert tiny.status_code == 200, tiny.text
    assert tiny.json()["output_ids"] == greedy.json()["output_ids"]
    _assert_healthy(url)


def test_max_new_tokens_zero_generates_nothing(server):
    url, _ = server
    out = _post(url, "/generate", {"text": "Once upon", "sampling_params": {"max_new_tokens": 0}})
    assert out.status_code == 200, out.text
    body = out.json()
    assert body["output_ids"] == [] and body["text"] == ""
    assert body["meta_info"]["finish_reason"]["type"] == "length"
    assert body["meta_info"]["completion_tokens"] == 0
    _assert_healthy(url)


def test_duplicate_request_id_in_flight_is_rejected(server):
    """A second request with a running request's rid is refused, and the first goes on
    generating: tokens keep streaming after the refusal (leaving its stream then aborts it)."""
    url, _ = server
    long = {"max_new_tokens": 3000, "ignore_eos": True, "temperature": 0}
    body = {"text": "a", "rid": "dup", "stream": True, "sampling_params": long}
    with httpx.stream("POST", f"{url}/generate", json=body, timeout=60) as first:
        assert first.status_code == 200
        lines = (line for line in first.iter_lines() if line.startswith("data: {"))
        before = len(json.loads(next(lines)[6:])["output_ids"])
        second = _post(url, "/generate", {"text": "b", "rid": "dup"}, timeout=30)
        _assert_error(second, 400, "already running")
        for _ in range(5):
            after = json.loads(next(lines)[6:])
        assert len(after["output_ids"]) > before and after["meta_info"]["finish_reason"] is None
    _assert_healthy(url)


def _running(url: str) -> int:
    return httpx.get(f"{url}/server_info").json()["num_running_reqs"]


def test_non_streaming_request_is_aborted_when_the_client_leaves(server):
    url, _ = server
    host, port = url.removeprefix("http://").split(":")
    body = json.dumps(
        {"text": "story", "sampling_params": {"max_new_tokens": 4000, "ignore_eos": True}}
    ).encode()
    head = (
        f"POST /generate HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    client = socket.create_connection((host, int(port)))
    client.sendall(head + body)
    deadline = time.time() + 30
    while _running(url) == 0:
        assert time.time() < deadline, "the request never started"
        time.sleep(0.01)
    steps_before = httpx.get(f"{url}/server_info").json()["forward_steps"]
    client.close()  # the client leaves while its request decodes
    deadline = time.time() + 20
    while _running(url):
        assert time.time() < deadline, "the abandoned request kept running"
        time.sleep(0.05)
    steps = httpx.get(f"{url}/server_info").json()["forward_steps"] - steps_before
    assert steps < 2000  # it stopped long before its 4000 tokens
    _assert_healthy(url)


def test_non_utf8_body_gets_the_usual_error_format(server):
    url, _ = server
    resp = httpx.post(
        f"{url}/v1/chat/completions",
        content=b'{"messages": [{"role": "user", "content": "\xff\xfe"}]}',
        headers={"Content-Type": "application/json"},
    )
    assert resp.status_code == 400
    assert resp.json()["object"] == "error"
    _assert_healthy(url)


def test_huge_prompt_is_rejected_before_tokenization(server):
    url, pid = server
    api = psutil.Process(pid)
    rss_before = api.memory_info().rss
    body = json.dumps(_chat("word " * 10_000_000))  # a 50 MB body, under the default limit
    start = time.perf_counter()
    resp = httpx.post(
        f"{url}/v1/chat/completions",
        content=body,
        headers={"Content-Type": "application/json"},
        timeout=120,
    )
    elapsed = time.perf_counter() - start
    _assert_error(resp, 400, "context length")
    assert elapsed < 30, elapsed  # tokenizing it whole took over a minute
    assert api.memory_info().rss - rss_before < 1.5 * 2**30
    _assert_healthy(url)


def test_body_over_the_limit_is_413_before_parsing():
    flags = ("--max-request-body-mb", "1", "--disable-chat-page")
    with launch_server(model_dir("qwen2"), *flags) as (url, _):
        assert httpx.get(f"{url}/").status_code == 404  # --disable-chat-page (same server)
        big = json.dumps({"text": "x" * (2 * 2**20)}).encode()
        resp = httpx.post(f"{url}/generate", content=big)
        _assert_error(resp, 413, "larger than 1 MB")

        def chunks():  # no Content-Length: counted while reading
            for _ in range(3):
                yield b" " * 2**20

        resp = httpx.post(f"{url}/generate", content=chunks())
        assert resp.status_code == 413
        ok = {"text": "ok", "sampling_params": {"max_new_tokens": 2}}
        assert httpx.post(f"{url}/generate", json=ok, timeout=60).status_code == 200


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_image_urls_to_private_addresses_are_refused_alike(server, media_host):
    url, _ = server
    port = media_host.rsplit(":", 1)[1]
    targets = [
        f"{media_host}/cat.jpg",  # open loopback port
        f"http://127.0.0.1:{_closed_port()}/cat.jpg",  # closed loopback port
        f"http://localhost:{port}/cat.jpg",  # by name
        f"{url}/health",  # the server itself
        "http://169.254.169.254/latest/meta-data",  # link-local (cloud metadata)
        "http://10.1.2.3/a.jpg",  # private
        "http://[::1]/a.jpg",
    ]
    messages = set()
    for target in targets:
        resp = _post(url, "/v1/chat/completions", _chat([_image_part(target)]), timeout=30)
        assert resp.status_code == 400, (target, resp.text)
        messages.add(resp.json()["error"]["message"].replace(target[:200], "URL"))
    assert len(messages) == 1  # refused before connecting: no port's state shows
    message = messages.pop()
    assert "not a public address" in message and "--allow-private-media-urls" in message
    _assert_healthy(url)


def _image_part(target: str) -> dict:
    return {"type": "image_url", "image_url": {"url": target}}


def test_a_trickling_download_stops_at_the_total_deadline(media_host):
    import asyncio

    from sglang.srt.multimodal.image_io import ImageError
    from sglang.srt.multimodal.media_fetch import fetch_image_source
    from sglang.srt.server_args import ServerArgs

    args = ServerArgs(media_url_timeout=1.0, allow_private_media_urls=True).fetch_policy
    start = time.perf_counter()
    with pytest.raises(ImageError, match="cannot fetch"):
        asyncio.run(fetch_image_source(f"{media_host}/trickle.jpg", args))
    assert time.perf_counter() - start < 3  # each byte came in time; the whole did not
    data = asyncio.run(fetch_image_source(f"{media_host}/cat.jpg", args))
    assert data == _jpeg(1)


def test_media_errors_name_their_cause_and_flag(media_host):
    import asyncio

    from sglang.srt.multimodal.image_io import ImageError, load_image
    from sglang.srt.multimodal.media_fetch import fetch_image_source
    from sglang.srt.server_args import ServerArgs

    allowed = ServerArgs(
        media_url_timeout=1.0, media_url_max_file_size_mb=1, allow_private_media_urls=True
    ).fetch_policy
    expected = {
        "/missing.jpg": "answered HTTP 404",
        "/big.jpg": "larger than 1 MB (the limit is --media-url-max-file-size-mb)",
        "/trickle.jpg": "within 1 s (the limit is --media-url-timeout)",
    }
    for path, cause in expected.items():
        with pytest.raises(ImageError) as info:
            asyncio.run(fetch_image_source(f"{media_host}{path}", allowed))
        assert cause in str(info.value), (path, str(info.value))
    with pytest.raises(ImageError, match="--allow-private-media-urls"):
        asyncio.run(fetch_image_source(f"{media_host}/cat.jpg", ServerArgs().fetch_policy))
    text = asyncio.run(fetch_image_source(f"{media_host}/notes.txt", allowed))
    with pytest.raises(ImageError, match="cannot decode image: not a supported image format"):
        load_image(text)
    with pytest.raises(ImageError, match="--allowed-local-media-path"):
        load_image("/etc/hostname", None)


def test_redirect_targets_are_checked_too(media_host, monkeypatch):
    """With only 127.0.0.1 counted as public, a redirect to a host on 127.0.0.2 is refused,
    though the same fetch succeeds when private addresses are allowed."""
    import asyncio

    from sglang.srt.multimodal import media_fetch
    from sglang.srt.multimodal.image_io import ImageError
    from sglang.srt.server_args import ServerArgs

    try:
        other = ThreadingHTTPServer(("127.0.0.2", 0), _Media)
    except OSError:
        pytest.skip("cannot bind 127.0.0.2 here")
    threading.Thread(target=other.serve_forever, daemon=True).start()
    monkeypatch.setattr(_Media, "redirect_to", f"http://127.0.0.2:{other.server_port}/cat.jpg")
    fetch = media_fetch.fetch_image_source
    try:
        allowed = ServerArgs(media_url_timeout=5.0, allow_private_media_urls=True).fetch_policy
        assert asyncio.run(fetch(f"{media_host}/redirect", allowed)) == _jpeg(1)
        monkeypatch.setattr(media_fetch, "is_public_address", lambda ip: ip == "127.0.0.1")
        guarded = ServerArgs(media_url_timeout=5.0).fetch_policy
        assert asyncio.run(fetch(f"{media_host}/cat.jpg", guarded)) == _jpeg(1)
        with pytest.raises(ImageError, match="cannot fetch"):
            asyncio.run(fetch(f"{media_host}/redirect", guarded))
    finally:
        other.shutdown()


def test_base64_images_still_work(server):
    url, _ = server
    data = "data:image/jpeg;base64," + base64.b64encode(_jpeg(3)).decode()
    resp = _post(url, "/v1/chat/completions", _chat([_image_part(data)]))
    assert resp.status_code == 200, resp.text


def _raw_status(url: str, head: bytes, pieces: int = 1) -> int:
    """The status code the server answers to ``head`` sent raw, in ``pieces`` writes."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as client:
        step = -(-len(head) // pieces)
        for start in range(0, len(head), step):
            try:
                client.sendall(head[start : start + step])
            except (BrokenPipeError, ConnectionResetError):  # answered and closed mid-head
                break
            time.sleep(0.05 if pieces > 1 else 0)
        reply = client.recv(65536)
    return int(reply.split(b" ", 2)[1])


def _head(target: str = "/health", headers: list[tuple[str, str]] = ()) -> bytes:
    lines = [f"GET {target} HTTP/1.1", "Host: x", *(f"{k}: {v}" for k, v in headers)]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


@pytest.mark.parametrize(
    ("name", "head", "status"),
    [
        ("2000 headers in one read", _head(headers=[(f"x-{i}", "y") for i in range(2000)]), 431),
        ("101 headers", _head(headers=[(f"x-{i}", "y") for i in range(100)]), 431),
        ("one 9 KiB header", _head(headers=[("x-big", "y" * 9 * 1024)]), 431),
        ("40 KiB over 8 headers", _head(headers=[(f"x-{i}", "y" * 5000) for i in range(8)]), 431),
        ("a 9 KiB path", _head(target="/health?" + "q" * 9 * 1024), 414),
        ("99 headers and 1 Host", _head(headers=[(f"x-{i}", "y") for i in range(99)]), 200),
    ],
)
def test_request_heads_are_bounded(server, name, head, status):
    url, _ = server
    assert _raw_status(url, head) == status, name
    _assert_healthy(url)


def test_a_head_arriving_in_pieces_is_bounded_too(server):
    """h11 buffers a head that arrives in several reads only up to its limit: 400 past it."""
    url, _ = server
    head = _head(headers=[(f"x-{i}", "y" * 4000) for i in range(30)])  # 120 KB in 6 writes
    assert _raw_status(url, head, pieces=6) in (400, 431)
    _assert_healthy(url)
