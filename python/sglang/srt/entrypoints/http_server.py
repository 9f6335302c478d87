"""FastAPI app: OpenAI-compatible and SGLang endpoints over the tokenizer manager. This module
only wires: routes to the serving handlers, middleware, exception handlers and the lifespan."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema
from starlette.exceptions import HTTPException

from sglang.srt.entrypoints.chat_page import ROUTES as CHAT_PAGE_ROUTES
from sglang.srt.entrypoints.chat_page import add_chat_page
from sglang.srt.entrypoints.http_utils import error_response, first_error
from sglang.srt.entrypoints.middleware import (
    ApiKeyMiddleware,
    BodyLimitMiddleware,
    HeaderLimitMiddleware,
)
from sglang.srt.entrypoints.openai.serving_base import served_model_name
from sglang.srt.entrypoints.openai.serving_chat import OpenAIServingChat
from sglang.srt.entrypoints.openai.serving_completions import OpenAIServingCompletion
from sglang.srt.entrypoints.openai.serving_embedding import EmbeddingHandler
from sglang.srt.entrypoints.openai.serving_responses import ResponsesHandler
from sglang.srt.entrypoints.openai.serving_score import RerankHandler, ScoreHandler
from sglang.srt.entrypoints.openai.serving_tokenize import DetokenizeHandler, TokenizeHandler
from sglang.srt.entrypoints.serving_generate import GenerateHandler
from sglang.srt.entrypoints.serving_info import InfoHandler
from sglang.srt.managers.tokenizer_manager import TokenizerManager
from sglang.srt.server_args import ServerArgs

logger = logging.getLogger(__name__)

OPEN_PATHS = {"/health", "/health_generate", "/ready", "/metrics", *CHAT_PAGE_ROUTES}


class BodyHandler(Protocol):
    """A handler of POST requests whose body it parses itself (as ``body_model``)."""

    body_model: type[BaseModel]

    async def handle(self, request: Request) -> Response: ...


def create_app(manager: TokenizerManager, args: ServerArgs, warm_up: bool = False) -> FastAPI:
    app = FastAPI(
        title="sglang-vitcache", version="0.1.0", lifespan=_lifespan(manager, args, warm_up)
    )
    # The last added is the outermost: the head's limits, then the API key, are checked before
    # any body is read.
    app.add_middleware(BodyLimitMiddleware, max_bytes=args.max_request_body_mb * 2**20)
    if args.api_key:
        app.add_middleware(ApiKeyMiddleware, api_key=args.api_key, open_paths=OPEN_PATHS)
    app.add_middleware(HeaderLimitMiddleware)
    _add_exception_handlers(app)
    _add_info_routes(app, manager, args)
    if not args.disable_chat_page:
        add_chat_page(app)
    responses = ResponsesHandler(manager, args)
    app.add_api_route("/v1/responses/{response_id}", responses.retrieve, methods=["GET"])
    handlers: dict[str, tuple[str, BodyHandler]] = {
        "/generate": ("generate", GenerateHandler(manager, args)),
        "/v1/completions": ("completions", OpenAIServingCompletion(manager, args)),
        "/v1/chat/completions": ("chat_completions", OpenAIServingChat(manager, args)),
        "/v1/responses": ("responses", responses),
        "/v1/tokenize": ("tokenize", TokenizeHandler(manager, args)),
        "/tokenize": ("tokenize_", TokenizeHandler(manager, args)),
        "/v1/detokenize": ("detokenize", DetokenizeHandler(manager, args)),
        "/detokenize": ("detokenize_", DetokenizeHandler(manager, args)),
        "/v1/embeddings": ("embeddings", EmbeddingHandler(manager, args)),
        "/v1/score": ("score", ScoreHandler(manager, args)),
        "/score": ("score_", ScoreHandler(manager, args)),
        "/v1/rerank": ("rerank", RerankHandler(manager, args)),
        "/rerank": ("rerank_", RerankHandler(manager, args)),
    }
    for path, (name, handler) in handlers.items():
        app.add_api_route(path, handler.handle, methods=["POST"], name=name)
    _document_parsed_bodies(app, {path: h.body_model for path, (_, h) in handlers.items()})
    return app


def _lifespan(
    manager: TokenizerManager, args: ServerArgs, warm_up: bool
) -> Callable[[FastAPI], contextlib.AbstractAsyncContextManager[None]]:
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await manager.start()
        task = asyncio.create_task(_warm_up(args)) if warm_up else None
        yield
        if task is not None:
            task.cancel()
        manager.close()

    return lifespan


def _add_info_routes(app: FastAPI, manager: TokenizerManager, args: ServerArgs) -> None:
    info = InfoHandler(manager, args)
    app.add_api_route("/health", info.health, methods=["GET"])
    app.add_api_route("/ready", info.ready, methods=["GET"])
    app.add_api_route("/health_generate", info.health_generate, methods=["GET"])
    app.add_api_route("/v1/models", info.models, methods=["GET"])
    app.add_api_route("/v1/models/{model:path}", info.model, methods=["GET"])
    app.add_api_route("/abort_request", info.abort_request, methods=["POST"])
    app.add_api_route("/pause_generation", info.pause_generation, methods=["POST"])
    app.add_api_route("/continue_generation", info.continue_generation, methods=["POST"])
    for path in ("/model_info", "/get_model_info"):
        app.add_api_route(path, info.model_info, methods=["GET"])
    for path in ("/server_info", "/get_server_info"):
        app.add_api_route(path, info.server_info, methods=["GET"])
    app.add_api_route("/get_load", info.get_load, methods=["GET"])
    app.add_api_route("/flush_cache", info.flush_cache, methods=["GET", "POST"])
    # response_model documents the body (an object) that the JSONResponse carries
    app.add_api_route(
        "/debug/check_integrity", info.check_integrity, methods=["GET"], response_model=dict
    )
    if args.enable_metrics:
        from sglang.srt.entrypoints.metrics import Metrics

        manager.metrics = Metrics(served_model_name(args))
        app.add_api_route("/metrics", info.metrics, methods=["GET"])


def _add_exception_handlers(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, _on_validation_error)
    app.add_exception_handler(ValueError, _on_value_error)
    app.add_exception_handler(HTTPException, _on_http_error)
    app.add_exception_handler(Exception, _on_unexpected_error)


async def _on_validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    return error_response(400, f"invalid request: {first_error(exc)}")


async def _on_value_error(request: Request, exc: Exception) -> JSONResponse:
    return error_response(getattr(exc, "status_code", 400), str(exc))


async def _on_http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HTTPException)
    return error_response(exc.status_code, str(exc.detail))


async def _on_unexpected_error(request: Request, exc: Exception) -> JSONResponse:
    logger.exception("unexpected error on %s", request.url.path)
    return error_response(500, "internal server error")


def _document_parsed_bodies(app: FastAPI, bodies: dict[str, type[BaseModel]]) -> None:
    """Put the request bodies that handlers parse themselves into the app's OpenAPI schema, so
    that /docs and schema-driven clients see them as if FastAPI had parsed them."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
            refs, defs = models_json_schema(
                [(model, "validation") for model in bodies.values()],
                ref_template="#/components/schemas/{model}",
            )
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            components.update(defs.get("$defs", {}))
            for path, model in bodies.items():
                body = {"schema": refs[(model, "validation")]}
                schema["paths"][path]["post"]["requestBody"] = {
                    "required": True,
                    "content": {"application/json": body},
                }
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


async def _warm_up(args: ServerArgs) -> None:
    """One tiny generation through the whole stack, then the "ready" log line."""
    import httpx

    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    url = f"http://{args.host}:{args.port}"
    async with httpx.AsyncClient(timeout=600) as client:
        for _ in range(100):
            try:
                await client.get(f"{url}/health")
                break
            except httpx.HTTPError:
                await asyncio.sleep(0.1)
        resp = await client.post(
            f"{url}/generate",
            json={"text": "warm up", "sampling_params": {"max_new_tokens": 1}},
            headers=headers,
        )
    if resp.status_code != 200:
        logger.error("warm-up request failed: %s %s", resp.status_code, resp.text)
        return
    logger.info("The server is fired up and ready to roll! (ready on %s)", url)
