"""Health, model and server information, cache control: the routes that serve no generation
(but ``/health_generate``, a one-token probe)."""

from __future__ import annotations

import json
import os
import uuid
from typing import Any, Literal

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel

from sglang.srt.entrypoints.default_model import description
from sglang.srt.entrypoints.http_utils import error_response, parse_body
from sglang.srt.entrypoints.openai.serving_base import served_model_name
from sglang.srt.managers.inputs import GenerateInput
from sglang.srt.managers.tokenizer_manager import TokenizerManager
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.server_args import ServerArgs


class AbortRequestBody(BaseModel):
    rid: str = ""
    abort_all: bool = False


class PauseGenerationBody(BaseModel):
    # SGLang's "retract" (running requests back to the queue, their KV freed) is not served.
    mode: Literal["abort", "in_place"] = "abort"


class InfoHandler:
    def __init__(self, manager: TokenizerManager, args: ServerArgs) -> None:
        self.manager = manager
        self.args = args
        self.model_name = served_model_name(args)

    def _unavailable(self) -> Response | None:
        if self.manager.alive:
            return None
        return error_response(503, self.manager.fatal_error or "unavailable")

    async def health(self) -> Response:
        return self._unavailable() or Response(status_code=200)

    async def ready(self) -> Response:
        return self._unavailable() or JSONResponse({"status": "ready"})

    async def health_generate(self) -> Response:
        params = SamplingParams.from_dict({"max_new_tokens": 1})
        tokenized = await self.manager.tokenize(
            GenerateInput(uuid.uuid4().hex, "ping", None, [], params)
        )
        tokenized.pooling = self.manager.pooling is not None  # an embedding server's probe
        async for _ in self.manager.generate(tokenized):
            pass
        return Response(status_code=200)

    async def models(self) -> dict[str, Any]:
        return {"object": "list", "data": [self._model_card()]}

    async def model(self, model: str) -> Response:
        """``GET /v1/models/{model}`` (the openai client's ``models.retrieve``)."""
        if model != self.model_name:
            body = {
                "error": {
                    "message": f"The model '{model}' does not exist",
                    "type": "invalid_request_error",
                    "param": "model",
                    "code": "model_not_found",
                }
            }
            return JSONResponse(body, status_code=404)
        return JSONResponse(self._model_card())

    def _model_card(self) -> dict[str, Any]:
        return {
            "id": self.model_name,
            "object": "model",
            "created": 0,
            "owned_by": "sglang",
            "root": self.args.model_path,
            "max_model_len": self.manager.context_length,
        }

    async def abort_request(self, request: Request) -> Response:
        """SGLang's ``POST /abort_request`` with ``{"rid": ...}`` or ``{"abort_all": true}``."""
        body = await parse_body(request, AbortRequestBody)
        await self.manager.abort_request(body.rid, body.abort_all)
        return Response(status_code=200)

    async def pause_generation(self, request: Request) -> JSONResponse:
        body = await parse_body(request, PauseGenerationBody)
        await self.manager.pause_generation(body.mode)
        return JSONResponse({"message": "Generation paused successfully.", "status": "ok"})

    async def continue_generation(self) -> JSONResponse:
        await self.manager.continue_generation()
        return JSONResponse({"message": "Generation continued successfully.", "status": "ok"})

    async def model_info(self) -> dict[str, Any]:
        return {
            "model_path": self.args.model_path,
            "tokenizer_path": self.args.model_path,
            "is_generation": self.manager.pooling is None,
            "model_type": self.manager.model_type,
            "architectures": _architectures(self.args.model_path),
            "has_image_understanding": self.manager.is_multimodal,
            "description": description(self.args.model_path),
        }

    async def server_info(self) -> dict[str, Any]:
        return await self.manager.rpc("server_info")

    async def get_load(self) -> list[dict[str, Any]]:
        """One entry per data-parallel rank; sglang-router polls it for load-aware routing."""
        return [await self.manager.rpc("load")]

    async def flush_cache(self) -> Response:
        if not await self.manager.rpc("flush_cache"):
            return Response("Cache not flushed: requests are running.\n", status_code=400)
        return Response("Cache flushed.\n", status_code=200)

    async def check_integrity(self) -> JSONResponse:
        """KV pool, radix tree and embedding cache invariants (for tests and operators)."""
        try:
            await self.manager.rpc("check_integrity")
        except RuntimeError as exc:
            return JSONResponse({"ok": False, "error": str(exc)}, status_code=500)
        return JSONResponse({"ok": True})

    async def metrics(self) -> Response:
        info = await self.manager.rpc("server_info")
        body, content_type = self.manager.metrics.render(info)
        return Response(body, media_type=content_type)


def _architectures(model_path: str | None) -> list[str]:
    """The checkpoint's ``architectures`` (sglang-router reads them from /model_info)."""
    config = os.path.join(model_path or "", "config.json")
    if not os.path.isfile(config):
        return []
    with open(config) as f:
        return json.load(f).get("architectures") or []
