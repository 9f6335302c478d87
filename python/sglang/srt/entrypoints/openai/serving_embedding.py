"""``POST /v1/embeddings``: OpenAI's ``input`` (a string, strings, token ids, lists of them),
SGLang's multimodal list (``[{"text", "image", "video"}, ...]``) or vLLM's chat ``messages``
-> prompt-only pooling requests -> pooled vectors (float or base64), with usage."""

from __future__ import annotations

import base64
import struct
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from sglang.srt.entrypoints.http_utils import parse_body
from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest
from sglang.srt.entrypoints.openai.protocol_retrieval import EmbeddingRequest
from sglang.srt.entrypoints.openai.retrieval import (
    chat_input,
    check_serves_pooling,
    piece_input,
    piece_of,
    pooling_usage,
    run_pooling,
)
from sglang.srt.entrypoints.openai.serving_base import served_model_name
from sglang.srt.layers.pooler import embedding_output
from sglang.srt.managers.inputs import GenerateInput
from sglang.srt.managers.tokenizer_manager import RequestError, TokenizerManager
from sglang.srt.server_args import ServerArgs


class EmbeddingHandler:
    body_model = EmbeddingRequest

    def __init__(self, manager: TokenizerManager, args: ServerArgs) -> None:
        self.manager = manager
        self.args = args
        self.model_name = served_model_name(args)

    async def handle(self, request: Request) -> Response:
        body = await parse_body(request, EmbeddingRequest)
        config = check_serves_pooling(self.manager)
        hidden_size = self.manager.processor.adapter.text_config.hidden_size
        config.check_dimensions(body.dimensions, hidden_size)
        events = await run_pooling(self.manager, self._inputs(body), request)
        data = [
            {
                "object": "embedding",
                "index": i,
                "embedding": encode(
                    embedding_output(e.embedding or [], config, body.dimensions),
                    body.encoding_format,
                ),
            }
            for i, e in enumerate(events)
        ]
        usage = pooling_usage(events)
        return JSONResponse(
            {"object": "list", "data": data, "model": self.model_name, "usage": usage}
        )

    def _inputs(self, body: EmbeddingRequest) -> list[GenerateInput]:
        if (body.input is None) == (body.messages is None):
            raise RequestError("give exactly one of 'input' and 'messages'")
        if body.messages is not None:
            chat = ChatCompletionRequest(
                messages=body.messages,
                mm_processor_kwargs=body.mm_processor_kwargs,
                chat_template_kwargs=body.chat_template_kwargs,
                continue_final_message=body.continue_final_message,
            )
            return [chat_input(self.manager, self.args, chat, body.add_generation_prompt)]
        return [
            piece_input(self.manager, self.args, piece_of(value), body.mm_processor_kwargs)
            for value in input_values(body.input)
        ]


def input_values(value: Any) -> list[Any]:
    """The inputs of one ``input``: a string or a list of token ids is one input."""
    if isinstance(value, str):
        return [value]
    if not value:
        raise RequestError("the input cannot be empty")
    if all(isinstance(t, int) for t in value):
        return [value]
    return list(value)


def encode(vector: list[float], encoding_format: str) -> list[float] | str:
    """float: the list; base64: little-endian float32 bytes, as OpenAI sends them."""
    if encoding_format == "float":
        return vector
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")
