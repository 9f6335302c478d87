"""The HTTP app of an encoder-only worker (``launch_server --encoder-only``): ``POST /encode``
for language workers (``multimodal.remote_encoder`` has the wire), health and info routes.

One process: encoding runs on one worker thread (the tower takes every core), so the event loop
keeps answering health checks and accepting requests while an image encodes."""

from __future__ import annotations

import asyncio
import json
import logging
from concurrent.futures import ThreadPoolExecutor

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from sglang.srt.entrypoints.http_utils import error_response
from sglang.srt.entrypoints.middleware import (
    ApiKeyMiddleware,
    BodyLimitMiddleware,
    HeaderLimitMiddleware,
)
from sglang.srt.model_executor.encoder_runner import EncoderRunner
from sglang.srt.multimodal.image_io import ImageError
from sglang.srt.multimodal.remote_encoder import (
    EncodeRequestError,
    item_from_json,
    reply_entries,
)
from sglang.srt.server_args import ServerArgs

logger = logging.getLogger(__name__)

MAX_ITEMS_PER_REQUEST = 256
MAX_WAITING_REQUESTS = 64  # past this, /encode answers 503 and senders encode locally
OPEN_PATHS = {"/health", "/health_generate"}


def create_encoder_app(runner: EncoderRunner, args: ServerArgs) -> FastAPI:
    app = FastAPI(title="sglang-vitcache encoder", version="0.1.0")
    app.add_middleware(BodyLimitMiddleware, max_bytes=args.max_request_body_mb * 2**20)
    if args.api_key:
        app.add_middleware(ApiKeyMiddleware, api_key=args.api_key, open_paths=OPEN_PATHS)
    app.add_middleware(HeaderLimitMiddleware)
    worker = ThreadPoolExecutor(1, thread_name_prefix="encoder")
    handler = EncodeHandler(runner, worker)
    app.add_api_route("/encode", handler.encode, methods=["POST"])
    app.add_api_route("/health", handler.health, methods=["GET"])
    app.add_api_route("/health_generate", handler.health_generate, methods=["GET"])
    for path in ("/server_info", "/get_server_info"):
        app.add_api_route(path, handler.server_info, methods=["GET"])
    for path in ("/model_info", "/get_model_info"):
        app.add_api_route(path, handler.model_info, methods=["GET"])
    return app


class EncodeHandler:
    def __init__(self, runner: EncoderRunner, worker: ThreadPoolExecutor) -> None:
        self.runner = runner
        self.worker = worker
        self.waiting = 0  # /encode requests waiting for their turn or encoding
        self.turn = asyncio.Lock()  # one encode at a time: the tower takes every core

    async def encode(self, request: Request) -> Response:
        try:
            body = json.loads(await request.body())
            fingerprint, raw_items = body["fingerprint"], body["items"]
            if not isinstance(raw_items, list) or not 0 < len(raw_items) <= MAX_ITEMS_PER_REQUEST:
                raise EncodeRequestError(f"1 to {MAX_ITEMS_PER_REQUEST} items per request")
            received = [item_from_json(raw) for raw in raw_items]
        except (ValueError, KeyError, TypeError, ImageError) as e:
            return error_response(400, f"invalid /encode request: {e}")
        if fingerprint != self.runner.fingerprint:
            return error_response(
                409,
                "this encoder serves another checkpoint, processor, dtype or tower "
                f"quantization (fingerprint {self.runner.fingerprint}, asked {fingerprint})",
            )
        if self.waiting >= MAX_WAITING_REQUESTS:
            return error_response(503, f"{self.waiting} /encode requests are waiting")
        self.waiting += 1
        try:
            async with self.turn:
                if await request.is_disconnected():  # the sender gave up while it waited
                    return error_response(499, "the client went away before its turn")
                entries = await asyncio.get_running_loop().run_in_executor(
                    self.worker, self.runner.encode, [r.item for r in received]
                )
        except (ValueError, RuntimeError) as e:  # the item does not match its token count
            return error_response(400, f"cannot encode: {e}")
        finally:
            self.waiting -= 1
        reply = reply_entries(received, entries, self.runner.fingerprint)
        return Response(reply, media_type="application/octet-stream")

    async def health(self) -> Response:
        return Response(status_code=200)

    async def health_generate(self) -> Response:
        """A real encode of a small fixed image (cached after the first)."""
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self.worker, self.runner.probe)
        except Exception as e:  # the tower cannot encode: the worker is not healthy
            logger.exception("health check encode failed")
            return error_response(503, f"encoder unhealthy: {e}")
        return Response(status_code=200)

    async def server_info(self) -> JSONResponse:
        return JSONResponse(self.runner.info())

    async def model_info(self) -> JSONResponse:
        config = self.runner.config
        return JSONResponse(
            {
                "model_path": self.runner.model_path,
                "model_type": config.model_type,
                "architectures": getattr(config, "architectures", None),
                "is_generation": False,
            }
        )
