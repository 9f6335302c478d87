"""The chat page at ``/``: static files from ``chat_page/``, served without a build step and
loading nothing from elsewhere (it works offline). The page is a client of the server's own
OpenAI API, so ``--api-key`` guards what it does, not the page itself. ``--disable-chat-page``
leaves ``/`` unserved."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import Response

FILES = Path(__file__).parent / "chat_page"
ROUTES = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/ui/chat.js": ("chat.js", "text/javascript; charset=utf-8"),
    "/ui/chat.css": ("chat.css", "text/css; charset=utf-8"),
}
# Scripts and styles from the page's own files only; images from data: and blob: URLs.
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data: blob:; "
    "media-src 'self' data: blob:; object-src 'none'; base-uri 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


def add_chat_page(app: FastAPI) -> None:
    for path, (name, media_type) in ROUTES.items():
        content = (FILES / name).read_bytes()
        app.add_api_route(
            path, _responder(content, media_type), methods=["GET"], include_in_schema=False
        )


def _responder(content: bytes, media_type: str) -> Callable[[], Awaitable[Response]]:
    async def serve() -> Response:
        return Response(content, media_type=media_type, headers=SECURITY_HEADERS)

    return serve
