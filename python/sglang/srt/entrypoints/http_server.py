"""FastAPI app: OpenAI-compatible and SGLang endpoints over the tokenizer manager."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ValidationError
from pydantic.json_schema import models_json_schema
from starlette.exceptions import HTTPException

from sglang.srt.core.io_struct import token_ids_per_request
from sglang.srt.entrypoints import openai_extras as oai
from sglang.srt.entrypoints.middleware import ApiKeyMiddleware, BodyLimitMiddleware, error_body
from sglang.srt.entrypoints.protocol import (
    UNIMPLEMENTED_CHAT_FIELDS,
    UNIMPLEMENTED_COMPLETION_FIELDS,
    UNIMPLEMENTED_GENERATE_FIELDS,
    ChatCompletionRequest,
    CompletionRequest,
    GenerateRequest,
    reject_unimplemented,
    sampling_dict,
)
from sglang.srt.entrypoints.reasoning_parser import ReasoningParser, prompt_opens_reasoning
from sglang.srt.function_call import get_tool_call_parser
from sglang.srt.managers.inputs import GenerateInput, split_generate_inputs
from sglang.srt.managers.tokenizer_manager import RequestError, StreamEvent, TokenizerManager
from sglang.srt.server_args import ServerArgs

logger = logging.getLogger(__name__)

BodyModel = TypeVar("BodyModel", bound=BaseModel)

OPEN_PATHS = {"/health", "/health_generate", "/ready", "/metrics"}


def create_app(manager: TokenizerManager, args: ServerArgs, warm_up: bool = False) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await manager.start()
        task = asyncio.create_task(_warm_up(args)) if warm_up else None
        yield
        if task is not None:
            task.cancel()
        manager.close()

    app = FastAPI(title="sglang-vitcache", version="0.1.0", lifespan=lifespan)
    model_name = args.served_model_name or args.model_path or "default"
    tool_parser = get_tool_call_parser(args.tool_call_parser)

    # The last added is the outermost: the API key is checked before any body is read.
    app.add_middleware(BodyLimitMiddleware, max_bytes=args.max_request_body_mb * 2**20)
    if args.api_key:
        app.add_middleware(ApiKeyMiddleware, api_key=args.api_key, open_paths=OPEN_PATHS)

    @app.exception_handler(RequestValidationError)
    async def on_validation_error(request: Request, exc: RequestValidationError):
        return _error(400, f"invalid request: {_first_error(exc)}")

    @app.exception_handler(ValueError)
    async def on_value_error(request: Request, exc: ValueError):
        return _error(getattr(exc, "status_code", 400), str(exc))

    @app.exception_handler(HTTPException)
    async def on_http_error(request: Request, exc: HTTPException):
        return _error(exc.status_code, str(exc.detail))

    @app.exception_handler(Exception)
    async def on_unexpected_error(request: Request, exc: Exception):
        logger.exception("unexpected error on %s", request.url.path)
        return _error(500, "internal server error")

    # Health and info ---------------------------------------------------------------------------
    def unavailable() -> Response | None:
        if manager.alive:
            return None
        return _error(503, manager.fatal_error or "unavailable")

    @app.get("/health")
    async def health() -> Response:
        return unavailable() or Response(status_code=200)

    @app.get("/ready")
    async def ready() -> Response:
        return unavailable() or JSONResponse({"status": "ready"})

    @app.get("/health_generate")
    async def health_generate() -> Response:
        inp = GenerateInput(uuid.uuid4().hex, "ping", None, [], _params({"max_new_tokens": 1}))
        tokenized = await manager.tokenize(inp)
        async for _ in manager.generate(tokenized):
            pass
        return Response(status_code=200)

    @app.get("/v1/models")
    async def models() -> dict:
        return {
            "object": "list",
            "data": [
                {
                    "id": model_name,
                    "object": "model",
                    "created": 0,
                    "owned_by": "sglang",
                    "root": args.model_path,
                    "max_model_len": manager.context_length,
                }
            ],
        }

    @app.get("/model_info")
    @app.get("/get_model_info")
    async def model_info() -> dict:
        return {
            "model_path": args.model_path,
            "tokenizer_path": args.model_path,
            "is_generation": True,
            "model_type": manager.model_type,
            "architectures": _architectures(args.model_path),
            "has_image_understanding": manager.is_multimodal,
        }

    @app.get("/server_info")
    @app.get("/get_server_info")
    async def server_info() -> dict:
        return await manager.rpc("server_info")

    @app.get("/get_load")
    async def get_load() -> list[dict]:
        """One entry per data-parallel rank; sglang-router polls it for load-aware routing."""
        return [await manager.rpc("load")]

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache() -> Response:
        ok = await manager.rpc("flush_cache")
        if not ok:
            return Response("Cache not flushed: requests are running.\n", status_code=400)
        return Response("Cache flushed.\n", status_code=200)

    @app.get("/debug/check_integrity")
    async def check_integrity() -> dict:
        """KV pool, radix tree and embedding cache invariants (for tests and operators)."""
        try:
            await manager.rpc("check_integrity")
        except RuntimeError as exc:
            return JSONResponse({"ok": False, "error": str(exc)}, status_code=500)
        return {"ok": True}

    if args.enable_metrics:
        from sglang.srt.entrypoints.metrics import Metrics

        manager.metrics = Metrics()

        @app.get("/metrics")
        async def metrics() -> Response:
            info = await manager.rpc("server_info")
            body, content_type = manager.metrics.render(info)
            return Response(body, media_type=content_type)

    # SGLang native -----------------------------------------------------------------------------
    @app.post("/generate")
    async def generate(request: Request) -> Response:
        body = await _parse(request, GenerateRequest)
        reject_unimplemented(body, UNIMPLEMENTED_GENERATE_FIELDS)
        inputs, batched = split_generate_inputs(
            body.text,
            body.sampling_params,
            body.input_ids,
            body.image_data,
            body.rid,
            body.video_data,
            body.mm_processor_kwargs,
        )
        token_ids = token_ids_per_request(body.token_ids_logprob, len(inputs))
        tokenized = await asyncio.gather(*(manager.tokenize(inp) for inp in inputs))
        for t, ids in zip(tokenized, token_ids):
            top = body.top_logprobs_num if body.return_logprob else None
            t.ask_logprobs(top, body.logprob_start_len, ids)
            t.return_text_in_logprobs = body.return_text_in_logprobs
        streams = (await oai.start_choices(manager, tokenized, args)).streams
        batched = batched or len(streams) > len(tokenized)  # n > 1 answers with a list
        if body.stream:
            return _sse(_generate_chunks(streams, batched), request)
        finals = await _collect_all(streams, request)
        outs = [_generate_output(event) for event in finals]
        return JSONResponse(outs if batched else outs[0])

    # OpenAI ------------------------------------------------------------------------------------
    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        body = await _parse(request, CompletionRequest)
        reject_unimplemented(body, UNIMPLEMENTED_COMPLETION_FIELDS)
        max_new = body.max_tokens
        prompt = body.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], int):
            prompt, ids = None, [prompt]
        elif isinstance(prompt, list) and prompt and isinstance(prompt[0], list):
            prompt, ids = None, prompt
        else:
            ids = None
        prompts = [prompt] if isinstance(prompt, str) else prompt
        params = oai.extra_sampling(body, sampling_dict(body, max_new))
        inputs, _ = split_generate_inputs(prompts, params, ids, None)
        tokenized = await asyncio.gather(*(manager.tokenize(inp) for inp in inputs))
        for t in tokenized:
            t.ask_logprobs(body.logprobs, 0 if body.echo else -1)  # echo: the prompt's too
        choices = await oai.start_choices(manager, tokenized, args)
        echoes = [
            manager.tokenizer.decode(tokenized[p].input_ids) if prompts is None else prompts[p]
            for p in choices.prompt_of
        ] if body.echo else [""] * len(choices.streams)  # fmt: skip
        fmt = None
        if body.logprobs is not None:
            fmt = oai.LogprobFormatter(
                manager.token_text, body.skip_special_tokens, manager.skipped_ids
            )
        head = _head(f"cmpl-{uuid.uuid4().hex}", "text_completion", model_name, args)
        if body.stream:
            usage = _stream_usage(body, choices, args)
            merged = _merge(choices.streams)
            return _sse(
                oai.completion_chunks(merged, head, echoes, fmt, body.logprobs or 0, usage),
                request,
            )
        finals = await _collect_all(choices.streams, request)
        return JSONResponse(
            {
                **head,
                "choices": [
                    oai.completion_choice(i, e, echoes[i], fmt, body.logprobs or 0)
                    for i, e in enumerate(finals)
                ],
                "usage": oai.usage(finals, choices, args),
            }
        )

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        body = await _parse(request, ChatCompletionRequest)
        reject_unimplemented(body, UNIMPLEMENTED_CHAT_FIELDS)
        max_new = body.max_completion_tokens
        max_new = body.max_tokens if max_new is None else max_new
        sampling = sampling_dict(body, max_new)
        if max_new is None:
            sampling["max_new_tokens"] = manager.context_length
        tools = oai.active_tools(body)
        prompt, images, videos, video_options = _render_chat(manager, body, args, tools)
        sampling = oai.extra_sampling(body, sampling, tool_parser)
        bos = manager.tokenizer.bos_token
        inp = GenerateInput(
            uuid.uuid4().hex,
            prompt,
            None,
            images,
            _params(sampling),
            add_special_tokens=not (bos and prompt.startswith(bos)),
            videos=videos,
            video_options=video_options,
        )
        tokenized = await manager.tokenize(inp)
        tokenized.ask_logprobs((body.top_logprobs or 0) if body.logprobs else None)
        choices = await oai.start_choices(manager, [tokenized], args)
        fmt = oai.ChatFormat(
            tool_parser if tools else None,
            oai.LogprobFormatter(manager.token_text, body.skip_special_tokens, manager.skipped_ids)
            if body.logprobs
            else None,
            _reasoning_parsers(args, body, prompt),
        )
        rid = f"chatcmpl-{tokenized.rid}"
        if body.stream:
            head = _head(rid, "chat.completion.chunk", model_name, args)
            usage = _stream_usage(body, choices, args)
            merged = _merge(choices.streams)
            return _sse(oai.chat_chunks(merged, head, len(choices.streams), fmt, usage), request)
        finals = await _collect_all(choices.streams, request)
        return JSONResponse(
            {
                **_head(rid, "chat.completion", model_name, args),
                "choices": [oai.chat_choice(i, e, fmt) for i, e in enumerate(finals)],
                "usage": oai.usage(finals, choices, args),
            }
        )

    _document_parsed_bodies(app)
    return app


# Helpers -------------------------------------------------------------------------------------
def _params(params: dict[str, Any]):
    from sglang.srt.sampling.sampling_params import SamplingParams

    return SamplingParams.from_dict(params)


def _render_chat(
    manager: TokenizerManager,
    body: ChatCompletionRequest,
    args: ServerArgs,
    tools: list[dict] | None = None,
) -> tuple[str, list[str], list[str], list[dict[str, Any]]]:
    """Chat template over messages whose image and video parts become the template's image and
    video entries; returns the prompt, the image and video references in order and each
    video's sampling options (the request's ``mm_processor_kwargs``, then the part's own)."""
    images: list[str] = []
    videos: list[str] = []
    video_options: list[dict[str, Any]] = []
    if body.mm_processor_kwargs is not None and not isinstance(body.mm_processor_kwargs, dict):
        raise RequestError("mm_processor_kwargs must be an object")
    messages = []
    for msg in body.messages:
        content: Any = msg.content or ""
        if isinstance(content, list):
            parts = []
            for part in content:
                if part.type == "text":
                    parts.append({"type": "text", "text": part.text})
                elif part.type == "video_url":
                    videos.append(part.video_url.url)
                    video_options.append(
                        {**(body.mm_processor_kwargs or {}), **part.video_url.options()}
                    )
                    parts.append({"type": "video"})
                else:
                    images.append(part.image_url.url)
                    parts.append({"type": "image"})
            content = parts
            if msg.role == "tool":  # templates print a tool result as text
                content = "".join(p["text"] for p in parts if p["type"] == "text")
        messages.append({"role": msg.role, "content": content, **_tool_fields(msg)})
    tokenizer = manager.tokenizer
    template = _chat_template(args)
    if template is None and not getattr(tokenizer, "chat_template", None):
        raise RequestError("the model has no chat template; use /v1/completions or /generate")
    kwargs = body.chat_template_kwargs or {}
    reserved = sorted(set(kwargs) & _RESERVED_TEMPLATE_ARGS)
    if reserved:
        raise RequestError(f"chat_template_kwargs may not set {', '.join(reserved)}")
    extra = {**kwargs, "tools": tools} if tools else kwargs
    try:
        prompt = tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True, chat_template=template, **extra
        )
    except Exception as exc:  # the template's own checks (roles, tool messages) fail here
        raise RequestError(f"the chat template cannot render these messages: {exc}") from exc
    return prompt, images, videos, video_options


_RESERVED_TEMPLATE_ARGS = {
    "messages", "conversation", "tokenize", "add_generation_prompt", "chat_template",
    "return_dict", "return_tensors", "continue_final_message", "tools", "documents",
}  # fmt: skip


def _reasoning_parsers(
    args: ServerArgs, body: ChatCompletionRequest, prompt: str
) -> Callable[[], ReasoningParser] | None:
    """With --reasoning-parser (and the request not opting out), a maker of per-choice parsers
    that start inside the reasoning block when the rendered prompt opened it (thinking on)."""
    name = args.reasoning_parser
    if name is None or not body.separate_reasoning:
        return None
    opened = prompt_opens_reasoning(prompt, name)
    return lambda: ReasoningParser(name, in_reasoning=opened)


def _tool_fields(msg: Any) -> dict[str, Any]:
    """Tool calls of an assistant turn (arguments as objects, as templates expect) and the id of
    a tool result."""
    out: dict[str, Any] = {}
    if msg.tool_calls:
        out["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.function.name,
             "arguments": _arguments(c.function.arguments)}}
            for c in msg.tool_calls
        ]  # fmt: skip
    if msg.tool_call_id is not None:
        out["tool_call_id"] = msg.tool_call_id
    if msg.name is not None:
        out["name"] = msg.name
    return out


def _arguments(arguments: str | dict | None) -> Any:
    if not isinstance(arguments, str):
        return arguments or {}
    try:
        return json.loads(arguments)
    except json.JSONDecodeError:
        return arguments


def _architectures(model_path: str | None) -> list[str]:
    """The checkpoint's ``architectures`` (sglang-router reads them from /model_info)."""
    config = os.path.join(model_path or "", "config.json")
    if not os.path.isfile(config):
        return []
    with open(config) as f:
        return json.load(f).get("architectures") or []


def _chat_template(args: ServerArgs) -> str | None:
    if not args.chat_template:
        return None
    if args.chat_template.endswith(".jinja"):
        with open(args.chat_template) as f:
            return f.read()
    return args.chat_template


async def _collect_all(
    streams: list[AsyncIterator[StreamEvent]], request: Request
) -> list[StreamEvent]:
    """Run the streams to completion; abort them all if the client goes away."""
    tasks = [asyncio.create_task(oai.last_event(s)) for s in streams]
    watcher = asyncio.create_task(_wait_disconnect(request))
    try:
        pending: set[asyncio.Task] = set(tasks)
        while pending:
            done, _ = await asyncio.wait(pending | {watcher}, return_when=asyncio.FIRST_COMPLETED)
            if watcher in done:
                raise RequestError("client disconnected", status_code=499)
            for task in done:
                task.result()  # surface a failed request now
            pending -= done
        return [t.result() for t in tasks]
    finally:
        watcher.cancel()
        for task in tasks:
            task.cancel()  # a cancelled stream aborts its request in the scheduler
        await asyncio.gather(*tasks, return_exceptions=True)


async def _wait_disconnect(request: Request) -> None:
    while not await request.is_disconnected():
        await asyncio.sleep(0.2)


def _sse(chunks: AsyncIterator[dict | str], request: Request) -> StreamingResponse:
    async def body() -> AsyncIterator[bytes]:
        try:
            async for chunk in chunks:
                if await request.is_disconnected():
                    return
                data = chunk if isinstance(chunk, str) else json.dumps(chunk)
                yield f"data: {data}\n\n".encode()
        except RequestError as exc:
            yield f"data: {json.dumps(error_body(exc.status_code, str(exc)))}\n\n".encode()
        yield b"data: [DONE]\n\n"

    return StreamingResponse(body(), media_type="text/event-stream")


async def _merge(
    streams: list[AsyncIterator[StreamEvent]],
) -> AsyncIterator[tuple[int, StreamEvent]]:
    """Interleave several request streams as their events arrive."""
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(i: int, stream: AsyncIterator[StreamEvent]) -> None:
        try:
            async for event in stream:
                await queue.put((i, event, None))
        except Exception as exc:  # surfaced to the consumer
            await queue.put((i, None, exc))
        await queue.put((i, None, None))

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    open_streams = len(streams)
    try:
        while open_streams:
            i, event, exc = await queue.get()
            if exc is not None:
                raise exc
            if event is None:
                open_streams -= 1
                continue
            yield i, event
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _generate_chunks(
    streams: list[AsyncIterator[StreamEvent]], batched: bool
) -> AsyncIterator[dict]:
    async for i, event in _merge(streams):
        out = _generate_output(event)
        if batched:
            out["index"] = i
        yield out


def _generate_output(event: StreamEvent) -> dict:
    return {"text": event.text, "output_ids": event.output_ids, "meta_info": event.meta}


def _head(rid: str, kind: str, model: str, args: ServerArgs) -> dict[str, Any]:
    return {
        "id": rid,
        "object": kind,
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": oai.system_fingerprint(args),
    }


def _stream_usage(body: Any, choices: oai.Choices, args: ServerArgs) -> Any:
    """The usage callback of a stream that asked for ``stream_options.include_usage``."""
    if not (body.stream_options and body.stream_options.include_usage):
        return None
    return lambda finals: oai.usage(finals, choices, args)


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse(error_body(status, message), status_code=status)


# Endpoints that parse their own body with ``_parse``, which FastAPI's schema cannot see.
PARSED_BODIES: dict[str, type[BaseModel]] = {
    "/generate": GenerateRequest,
    "/v1/completions": CompletionRequest,
    "/v1/chat/completions": ChatCompletionRequest,
}


def _document_parsed_bodies(app: FastAPI) -> None:
    """Put the request bodies of ``PARSED_BODIES`` into the app's OpenAPI schema, so that /docs
    and schema-driven clients see them as if FastAPI had parsed them."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
            refs, defs = models_json_schema(
                [(model, "validation") for model in PARSED_BODIES.values()],
                ref_template="#/components/schemas/{model}",
            )
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            components.update(defs.get("$defs", {}))
            for path, model in PARSED_BODIES.items():
                body = {"schema": refs[(model, "validation")]}
                schema["paths"][path]["post"]["requestBody"] = {
                    "required": True,
                    "content": {"application/json": body},
                }
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


async def _parse(request: Request, model: type[BodyModel]) -> BodyModel:
    """The body parsed and validated in one pass by pydantic's JSON parser. FastAPI's own body
    handling (``json.loads``, then validation of the Python objects) took ~40 ms of a 7.4 MB
    chat with eight 720p images; this takes ~5."""
    try:
        return model.model_validate_json(await request.body())
    except ValidationError as exc:
        raise RequestValidationError(exc.errors(include_url=False)) from None


def _first_error(exc: RequestValidationError) -> str:
    errors = exc.errors()
    if not errors:
        return "malformed body"
    err = errors[0]
    where = ".".join(str(p) for p in err.get("loc", ()) if p != "body")
    return f"{where}: {err.get('msg')}" if where else str(err.get("msg"))


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
