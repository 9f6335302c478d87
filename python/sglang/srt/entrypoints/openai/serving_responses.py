"""OpenAI's Responses API as SGLang serves it: ``POST /v1/responses`` (whole or streamed as
typed events), ``GET /v1/responses/{id}``, and ``previous_response_id`` chaining over stored
responses. Input items (text and ``input_image`` parts) become chat messages, so a response
runs exactly as the chat completion of those messages would, the per-image cache included."""

from __future__ import annotations

import json
import time
from collections import OrderedDict
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from sglang.srt.entrypoints.http_utils import collect_all, error_response, parse_body
from sglang.srt.entrypoints.middleware import error_body
from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest, _Body
from sglang.srt.entrypoints.openai.serving_base import served_model_name
from sglang.srt.entrypoints.openai.serving_chat import OpenAIServingChat, render_chat
from sglang.srt.managers.tokenizer_manager import RequestError, StreamEvent, TokenizerManager
from sglang.srt.server_args import ServerArgs

STORED_RESPONSES = 1024  # the newest ones, for GET and previous_response_id
_PART_TYPES = {"input_text": "text", "output_text": "text", "text": "text"}


class ResponsesRequest(_Body):
    model: str | None = None
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    previous_response_id: str | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stream: bool = False
    store: bool = True
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = "auto"
    parallel_tool_calls: bool = True
    text: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    user: str | None = None


class ResponsesHandler:
    body_model = ResponsesRequest

    def __init__(self, manager: TokenizerManager, args: ServerArgs) -> None:
        self.manager = manager
        self.chat = OpenAIServingChat(manager, args)
        self.args = args
        self.model_name = served_model_name(args)
        # response id -> (the conversation it answered, its response body)
        self.stored: OrderedDict[str, tuple[list[dict[str, Any]], dict[str, Any]]] = OrderedDict()

    async def handle(self, request: Request) -> Response:
        body = await parse_body(request, ResponsesRequest)
        if body.tools:
            raise RequestError("tools are not supported on /v1/responses by this server")
        messages = self._conversation(body)
        chat_body = ChatCompletionRequest.model_validate(
            {
                "messages": messages,
                "max_tokens": body.max_output_tokens,
                "temperature": body.temperature,
                "top_p": body.top_p,
                "response_format": _response_format(body.text),
            }
        )
        chat = render_chat(self.manager, chat_body, self.args)
        tokenized = await self.chat.tokenize(chat_body, chat)
        stream = self.manager.generate(tokenized)
        head = self._head(body, f"resp_{tokenized.rid}")
        if body.stream:
            events = self._events(stream, head, body, messages)
            return StreamingResponse(_sse(events), media_type="text/event-stream")
        (final,) = await collect_all([stream], request)
        response = self._finished(head, final)
        self._store(body, messages, response)
        return JSONResponse(response)

    async def retrieve(self, response_id: str) -> Response:
        stored = self.stored.get(response_id)
        if stored is None:
            return error_response(404, f"no stored response {response_id!r}")
        return JSONResponse(stored[1])

    def _conversation(self, body: ResponsesRequest) -> list[dict[str, Any]]:
        """The chat messages this response answers: the stored conversation it follows (its
        answer included), then the instructions and the input items."""
        history: list[dict[str, Any]] = []
        if body.previous_response_id is not None:
            stored = self.stored.get(body.previous_response_id)
            if stored is None:
                raise RequestError(f"previous_response_id {body.previous_response_id!r} is unknown")
            history = [m for m in stored[0] if m["role"] != "system"]
            history.append({"role": "assistant", "content": _output_text(stored[1])})
        system = [{"role": "system", "content": body.instructions}] if body.instructions else []
        items = body.input if isinstance(body.input, list) else [body.input]
        return system + history + [_message(item) for item in items]

    def _head(self, body: ResponsesRequest, rid: str) -> dict[str, Any]:
        return {
            "id": rid,
            "object": "response",
            "created_at": int(time.time()),
            "model": self.model_name,
            "status": "in_progress",
            "output": [],
            "instructions": body.instructions,
            "previous_response_id": body.previous_response_id,
            "max_output_tokens": body.max_output_tokens,
            "temperature": body.temperature,
            "top_p": body.top_p,
            "tools": [],
            "tool_choice": body.tool_choice,
            "parallel_tool_calls": body.parallel_tool_calls,
            "text": body.text or {"format": {"type": "text"}},
            "metadata": body.metadata or {},
            "store": body.store,
            "error": None,
            "incomplete_details": None,
            "usage": None,
        }

    def _finished(self, head: dict[str, Any], final: StreamEvent) -> dict[str, Any]:
        meta = final.meta
        length = final.finish_reason is not None and final.finish_reason.kind == "length"
        return {
            **head,
            "status": "incomplete" if length else "completed",
            "incomplete_details": {"reason": "max_output_tokens"} if length else None,
            "output": [_message_item(head["id"], final.text, "completed")],
            "usage": {
                "input_tokens": meta["prompt_tokens"],
                "input_tokens_details": {"cached_tokens": meta["cached_tokens"]},
                "output_tokens": meta["completion_tokens"],
                "output_tokens_details": {"reasoning_tokens": meta["reasoning_tokens"]},
                "total_tokens": meta["prompt_tokens"] + meta["completion_tokens"],
            },
        }

    def _store(
        self, body: ResponsesRequest, messages: list[dict[str, Any]], response: dict[str, Any]
    ) -> None:
        if not body.store:
            return
        self.stored[response["id"]] = (messages, response)
        while len(self.stored) > STORED_RESPONSES:
            self.stored.popitem(last=False)

    async def _events(
        self,
        stream: AsyncIterator[StreamEvent],
        head: dict[str, Any],
        body: ResponsesRequest,
        messages: list[dict[str, Any]],
    ) -> AsyncIterator[dict[str, Any]]:
        """The typed events of a streamed response, in OpenAI's order."""
        item = _message_item(head["id"], "", "in_progress")
        where = {"item_id": item["id"], "output_index": 0, "content_index": 0}
        yield {"type": "response.created", "response": head}
        yield {"type": "response.in_progress", "response": head}
        yield {"type": "response.output_item.added", "output_index": 0, "item": item}
        part = {"type": "output_text", "text": "", "annotations": []}
        yield {"type": "response.content_part.added", **where, "part": part}
        final = None
        async for event in stream:
            if event.delta:
                yield {"type": "response.output_text.delta", **where, "delta": event.delta,
                       "logprobs": []}  # fmt: skip
            final = event
        assert final is not None  # a stream ends with its finished event
        response = self._finished(head, final)
        done_item = response["output"][0]
        text = final.text
        yield {"type": "response.output_text.done", **where, "text": text, "logprobs": []}
        yield {"type": "response.content_part.done", **where, "part": {**part, "text": text}}
        yield {"type": "response.output_item.done", "output_index": 0, "item": done_item}
        self._store(body, messages, response)
        yield {"type": "response.completed", "response": response}


async def _sse(events: AsyncIterator[dict[str, Any]]) -> AsyncIterator[bytes]:
    """``event:`` and ``data:`` lines per event, each numbered; an error event if the request
    fails midway."""
    number = 0
    try:
        async for event in events:
            event["sequence_number"] = number
            number += 1
            yield f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode()
    except RequestError as exc:
        error = {
            "type": "error",
            "sequence_number": number,
            **error_body(exc.status_code, str(exc)),
        }
        yield f"event: error\ndata: {json.dumps(error)}\n\n".encode()


def _message(item: Any) -> dict[str, Any]:
    """One input item (a string, or a message with text and ``input_image`` parts) as a chat
    message."""
    if isinstance(item, str):
        return {"role": "user", "content": item}
    if not isinstance(item, dict) or item.get("type", "message") != "message":
        kind = item.get("type") if isinstance(item, dict) else type(item).__name__
        raise RequestError(f"input items of type {kind!r} are not supported")
    content = item.get("content", "")
    if isinstance(content, list):
        content = [_part(p) for p in content]
    return {"role": item.get("role", "user"), "content": content}


def _part(part: dict[str, Any]) -> dict[str, Any]:
    kind = part.get("type")
    if kind in _PART_TYPES:
        return {"type": "text", "text": part.get("text", "")}
    if kind == "input_image":
        url = part.get("image_url")
        if isinstance(url, dict):
            url = url.get("url")
        if not isinstance(url, str):
            raise RequestError("an input_image part needs image_url (file_id is not supported)")
        return {"type": "image_url", "image_url": {"url": url}}
    raise RequestError(f"content parts of type {kind!r} are not supported")


def _response_format(text: dict[str, Any] | None) -> dict[str, Any] | None:
    """``text.format`` (the Responses API's structured output) as chat's ``response_format``."""
    fmt = (text or {}).get("format") or {}
    if fmt.get("type") == "json_schema":
        schema = {"name": fmt.get("name", "schema"), "schema": fmt.get("schema")}
        return {"type": "json_schema", "json_schema": schema}
    if fmt.get("type") == "json_object":
        return {"type": "json_object"}
    return None


def _message_item(response_id: str, text: str, status: str) -> dict[str, Any]:
    return {
        "type": "message",
        "id": f"msg_{response_id.removeprefix('resp_')}",
        "status": status,
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


def _output_text(response: dict[str, Any]) -> str:
    return "".join(
        part["text"]
        for item in response["output"]
        if item["type"] == "message"
        for part in item["content"]
        if part["type"] == "output_text"
    )
