"""Pure ASGI middleware: header limits, API key and request-body limit.

Pure ASGI (not Starlette's ``BaseHTTPMiddleware``) so that endpoints keep the server's own
``receive`` channel and ``request.is_disconnected()`` sees a client that went away.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def error_body(status: int, message: str) -> dict:
    """The error format of every endpoint (OpenAI's, plus SGLang's top-level fields)."""
    kind = "invalid_request_error" if status < 500 else "internal_error"
    return {
        "object": "error",
        "error": {"message": message, "type": kind, "code": status},
        "message": message,
        "code": status,
    }


async def send_error(send: Send, status: int, message: str) -> None:
    body = json.dumps(error_body(status, message)).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


# The request's head, bounded as llama-server (cpp-httplib: 100 headers) and nginx (8 KiB per
# line, 32 KiB in all) bound theirs. h11 bounds only a head that arrives in several reads.
MAX_HEADER_COUNT = 100
MAX_HEADER_LINE_BYTES = 8 * 1024
MAX_HEADER_BYTES = 32 * 1024
MAX_TARGET_BYTES = 8 * 1024


def _header(scope: Scope, name: bytes) -> bytes | None:
    return next((v for k, v in scope.get("headers", ()) if k.lower() == name), None)


class HeaderLimitMiddleware:
    """Heads over the limits are answered before anything else runs: 431 for too many or too
    large headers, 414 for a request target (path and query) over ``MAX_TARGET_BYTES``."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            refusal = head_refusal(scope)
            if refusal is not None:
                await send_error(send, *refusal)
                return
        await self.app(scope, receive, send)


def head_refusal(scope: Scope) -> tuple[int, str] | None:
    """(status, message) where the request's head breaks a limit, else None."""
    headers = scope.get("headers", ())
    if len(headers) > MAX_HEADER_COUNT:
        return 431, f"{len(headers)} request headers; at most {MAX_HEADER_COUNT} are accepted"
    lines = [len(name) + len(value) + 4 for name, value in headers]  # "name: value\r\n"
    if max(lines, default=0) > MAX_HEADER_LINE_BYTES:
        return 431, f"a request header is longer than {MAX_HEADER_LINE_BYTES} bytes"
    if sum(lines) > MAX_HEADER_BYTES:
        return 431, f"request headers take more than {MAX_HEADER_BYTES} bytes"
    target = len(scope.get("raw_path") or b"") + len(scope.get("query_string") or b"")
    if target > MAX_TARGET_BYTES:
        return 414, f"request target longer than {MAX_TARGET_BYTES} bytes"
    return None


class ApiKeyMiddleware:
    """Requests need ``Authorization: Bearer <key>`` except on ``open_paths``."""

    def __init__(self, app: ASGIApp, api_key: str, open_paths: set[str]) -> None:
        self.app = app
        self.expected = f"Bearer {api_key}".encode()
        self.open_paths = open_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] not in self.open_paths:
            if _header(scope, b"authorization") != self.expected:
                await send_error(send, 401, "invalid or missing API key")
                return
        await self.app(scope, receive, send)


class BodyLimitMiddleware:
    """Bodies over ``max_bytes`` are answered 413 before the application parses anything:
    at once from Content-Length, else as soon as the bytes read pass the limit. The body is
    read here and replayed; afterwards ``receive`` is the server's again (disconnects show)."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _header(scope, b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._refuse(send)
            return
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client left while sending
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await self._refuse(send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body: bytes | None = b"".join(chunks)

        async def replay() -> Message:
            nonlocal body
            if body is None:
                return await receive()
            message, body = {"type": "http.request", "body": body, "more_body": False}, None
            return message

        await self.app(scope, replay, send)

    async def _refuse(self, send: Send) -> None:
        mb = self.max_bytes / 2**20
        await send_error(send, 413, f"request body larger than {mb:g} MB (--max-request-body-mb)")
