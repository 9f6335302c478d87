"""The chat page at ``/``, driven in a real browser (Debian's Chromium, headless, through
Playwright pointed at that binary: no browser download) against the real server.

What the page shows is checked against the server's own API, asked directly for the same
conversation: the streamed text, the cache figures of turn 2, and the server's error messages
for a file that is no image and for an oversized image. Screenshots of the page are written to
``build/test-artifacts/`` (not committed)."""

from __future__ import annotations

import base64
import io
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from conftest import make_image, model_dir
from PIL import Image
from playwright.sync_api import Browser, Page, expect, sync_playwright
from server_utils import launch_server

from sglang_dev.video_clips import encode_clip, random_frames

CHROMIUM = os.environ.get("SGLANG_TEST_CHROMIUM", "/usr/bin/chromium")
# As root in a sandbox with no outside network: no sandboxing, and no background connections.
CHROMIUM_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
API_KEY = "page-test-key"
ARTIFACTS = Path(__file__).resolve().parents[1] / "build" / "test-artifacts"
MAX_TOKENS = 8
TIMEOUT_MS = 60_000


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    flags = ["--enable-cache-report", "--api-key", API_KEY, "--chunked-prefill-size", "64"]
    with launch_server(model_dir("qwen2_5_vl"), *flags) as (url, _):
        yield url


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    assert shutil.which(CHROMIUM), (
        f"no Chromium at {CHROMIUM}: bash scripts/install_test_deps.sh installs Debian's "
        "chromium package; elsewhere set SGLANG_TEST_CHROMIUM"
    )
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        yield browser
        browser.close()


@pytest.fixture()
def page(browser: Browser, server: str) -> Iterator[Page]:
    page = browser.new_page(viewport={"width": 1100, "height": 900})
    page.set_default_timeout(TIMEOUT_MS)
    page.goto(f"{server}/")
    yield page
    page.close()


def _png(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def _file(name: str, mime: str, data: bytes) -> dict:
    return {"name": name, "mimeType": mime, "buffer": data}


def _data_url(mime: str, data: bytes) -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def _user(text: str, *files: dict) -> dict:
    parts: list[dict] = [
        {"type": "image_url", "image_url": {"url": _data_url(f["mimeType"], f["buffer"])}}
        for f in files
    ]
    return {"role": "user", "content": [*parts, {"type": "text", "text": text}]}


def _api(server: str, messages: list[dict]) -> httpx.Response:
    """The same request the page sends, asked directly and without streaming."""
    body = {"messages": messages, "max_tokens": MAX_TOKENS, "temperature": 0}
    headers = {"Authorization": f"Bearer {API_KEY}"}
    return httpx.post(f"{server}/v1/chat/completions", json=body, headers=headers, timeout=120)


def _unlock(page: Page) -> None:
    """Without the key the page says the server refused it; with it, it names the model."""
    expect(page.locator("#model")).to_contain_text("invalid or missing API key")
    page.locator("#settings summary").click()
    page.fill("#api-key", API_KEY)
    page.dispatch_event("#api-key", "change")
    expect(page.locator("#model")).to_have_text(model_dir("qwen2_5_vl"))
    page.fill("#temperature", "0")
    page.fill("#max-tokens", str(MAX_TOKENS))


def _send(page: Page, text: str, *files: dict) -> None:
    if files:
        page.set_input_files("#files", list(files))
        expect(page.locator("#attachments > *")).to_have_count(len(files))
    page.fill("#prompt", text)
    page.click("#send")


def _record_reply_updates(page: Page) -> None:
    """Collect every text the newest reply shows, to see it grow token by token."""
    page.evaluate(
        """() => {
        window.replyTexts = [];
        new MutationObserver(() => {
            const bodies = document.querySelectorAll(".turn.assistant .body");
            const text = bodies.length ? bodies[bodies.length - 1].textContent : "";
            if (text && text !== window.replyTexts.at(-1)) window.replyTexts.push(text);
        }).observe(document.getElementById("conversation"),
                   {childList: true, subtree: true, characterData: true});
    }"""
    )


def test_two_turns_with_two_images_stream_and_show_the_cache(page: Page, server: str) -> None:
    _unlock(page)
    _record_reply_updates(page)
    a = _file("a.png", "image/png", _png(make_image(11, 96, 64)))
    b = _file("b.png", "image/png", _png(make_image(12, 64, 96)))
    replies = page.locator(".turn.assistant:not(.error)")
    stats = page.locator(".turn.assistant .stats")

    _send(page, "What is in this image?", a)
    expect(stats).to_have_count(1)
    first = replies.nth(0).locator(".body").inner_text()
    turn1 = [_user("What is in this image?", a)]
    assert first == _api(server, turn1).json()["choices"][0]["message"]["content"]
    updates = page.evaluate("window.replyTexts")
    assert len(updates) >= 2 and updates[-1] == first, updates  # streamed, not shown at once
    assert "image 1 (a.png): encoded" in stats.nth(0).inner_text()

    _send(page, "And what about this one?", b)
    expect(stats).to_have_count(2)
    second = replies.nth(1).locator(".body").inner_text()
    turn2 = [*turn1, {"role": "assistant", "content": first}, _user("And what about this one?", b)]
    reference = _api(server, turn2).json()
    assert second == reference["choices"][0]["message"]["content"]
    line = stats.nth(1).inner_text()
    prompt_tokens = reference["usage"]["prompt_tokens"]
    assert f"{prompt_tokens} prompt tokens" in line, line
    cached = int(line.split(" cached")[0].rsplit("· ", 1)[1])
    assert 0 < cached < prompt_tokens, line  # turn 1's prompt and reply came from the KV cache
    assert "image 1 (a.png): prefix cache" in line and "image 2 (b.png): encoded" in line, line
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "chat_page_two_turns.png"), full_page=True)

    page.click("#new-chat")  # a new conversation that opens with turn 2's image
    _send(page, "Describe it in one word.", b)
    expect(stats).to_have_count(1)
    assert "image 1 (b.png): embedding cache" in stats.nth(0).inner_text()
    page.screenshot(path=str(ARTIFACTS / "chat_page_new_chat.png"), full_page=True)


def test_the_embedded_reader_says_what_it_does_and_reads_the_demos_line(browser: Browser) -> None:
    """Started without --model-path and on its default dtype, the server's page says what the
    model does, and the model reads the line the demo draws."""
    from scripts.demo import DEMO_TEXT, QUESTION, draw_text
    from sglang.srt.entrypoints.default_model import DESCRIPTION

    with launch_server(None, "--dtype", "auto") as (url, _):
        page = browser.new_page(viewport={"width": 1100, "height": 700})
        page.set_default_timeout(TIMEOUT_MS)
        page.goto(f"{url}/")
        expect(page.locator("#model")).to_have_text(DESCRIPTION)
        page.locator("#settings summary").click()
        page.fill("#temperature", "0")
        _send(page, QUESTION, _file("demo.png", "image/png", _png(draw_text(DEMO_TEXT))))
        expect(page.locator(".turn.assistant .stats")).to_have_count(1)
        reply = page.locator(".turn.assistant .body").nth(0).inner_text()
        assert DEMO_TEXT.lower() in reply.lower(), reply
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "chat_page_embedded_reader.png"), full_page=True)
        page.close()


@pytest.mark.parametrize(
    "bad",
    [
        _file("notes.txt", "text/plain", b"these are notes, not pixels"),
        _file("huge.png", "image/png", _png(Image.new("L", (8200, 8200)))),  # 67 MP: over 64
    ],
    ids=["not-an-image", "oversized-image"],
)
def test_a_bad_upload_shows_the_servers_message(page: Page, server: str, bad: dict) -> None:
    _unlock(page)
    _send(page, "What is this?", bad)
    error = page.locator(".turn.error")
    expect(error).to_have_count(1)
    direct = _api(server, [_user("What is this?", bad)])
    assert direct.status_code == 400
    assert error.inner_text() == direct.json()["error"]["message"]
    # the failed turn is not part of the conversation: the next one works
    _send(page, "Hello there", _file("a.png", "image/png", _png(make_image(11, 96, 64))))
    expect(page.locator(".turn.assistant .stats")).to_have_count(1)


def test_the_page_is_open_and_works_offline(server: str) -> None:
    """The page and its files need no key (the API behind them does) and load nothing from
    elsewhere: the policy allows the page's own origin and data/blob images only."""
    page = httpx.get(f"{server}/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    policy = page.headers["content-security-policy"]
    assert "default-src 'self'" in policy and "http" not in policy
    for asset in ("/ui/chat.js", "/ui/chat.css"):
        response = httpx.get(f"{server}{asset}")
        assert response.status_code == 200 and "http://" not in response.text
        assert "https://" not in response.text
    assert httpx.get(f"{server}/v1/models").status_code == 401
    assert "/" not in httpx.get(f"{server}/openapi.json", headers=_key()).json()["paths"]


def _key() -> dict[str, str]:
    return {"Authorization": f"Bearer {API_KEY}"}


def test_a_video_goes_through_the_page(page: Page, server: str) -> None:
    clip = _file("clip.mp4", "video/mp4", encode_clip(random_frames(5, 8, 64, 64), fps=4.0))
    _unlock(page)
    _send(page, "What happens in this video?", clip)
    stats = page.locator(".turn.assistant .stats")
    expect(stats).to_have_count(1)
    assert "video 1 (clip.mp4): encoded" in stats.inner_text()
    video = {"type": "video_url", "video_url": {"url": _data_url("video/mp4", clip["buffer"])}}
    question = {"type": "text", "text": "What happens in this video?"}
    direct = _api(server, [{"role": "user", "content": [video, question]}])
    reply = page.locator(".turn.assistant .body").inner_text()
    assert reply == direct.json()["choices"][0]["message"]["content"]
