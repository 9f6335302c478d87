"""SGLang's ``POST /v1/tokenize`` and ``/v1/detokenize`` (also without ``/v1``): a prompt or
chat messages to token ids, token ids to text, with the tokenizer the server runs."""

from __future__ import annotations

from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from pydantic import model_validator

from sglang.srt.entrypoints.http_utils import parse_body
from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest, ChatMessage, Tool, _Body
from sglang.srt.entrypoints.openai.serving_chat import OpenAIServingChat, active_tools, render_chat
from sglang.srt.managers.tokenizer_manager import RequestError, TokenizerManager
from sglang.srt.server_args import ServerArgs


class TokenizeRequest(_Body):
    model: str | None = None
    prompt: str | list[str] | None = None
    messages: list[ChatMessage] | None = None
    tools: list[Tool] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    continue_final_message: bool = False
    add_special_tokens: bool = True

    @model_validator(mode="after")
    def _one_input(self) -> TokenizeRequest:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("exactly one of 'prompt' or 'messages' must be provided")
        return self


class DetokenizeRequest(_Body):
    model: str | None = None
    tokens: list[int] | list[list[int]]
    skip_special_tokens: bool = True


class TokenizeHandler:
    body_model = TokenizeRequest

    def __init__(self, manager: TokenizerManager, args: ServerArgs) -> None:
        self.manager = manager
        self.args = args
        self.chat = OpenAIServingChat(manager, args)

    async def handle(self, request: Request) -> Response:
        body = await parse_body(request, TokenizeRequest)
        if body.messages is not None:
            tokens: list[int] | list[list[int]] = await self._chat_ids(body)
            count: int | list[int] = len(tokens)
        elif isinstance(body.prompt, str):
            tokens = self._encode(body.prompt, body.add_special_tokens)
            count = len(tokens)
        else:
            tokens = [self._encode(p, body.add_special_tokens) for p in body.prompt or []]
            count = [len(ids) for ids in tokens]
        return JSONResponse({"tokens": tokens, "count": count, "max_model_len": self._max_len()})

    def _encode(self, text: str, add_special_tokens: bool) -> list[int]:
        return self.manager.tokenizer.encode(text, add_special_tokens=add_special_tokens)

    async def _chat_ids(self, body: TokenizeRequest) -> list[int]:
        """The ids a chat completion over these messages would prefill: the chat template, and
        each image's placeholder run at its full length."""
        chat_body = ChatCompletionRequest(
            messages=body.messages,
            tools=body.tools,
            chat_template_kwargs=body.chat_template_kwargs,
            continue_final_message=body.continue_final_message,
            max_tokens=1,
        )
        chat = render_chat(self.manager, chat_body, self.args, active_tools(chat_body))
        return list((await self.chat.tokenize(chat_body, chat)).input_ids)

    def _max_len(self) -> int:
        """SGLang's ``max_model_len``: the tokenizer's ``model_max_length`` where it is a real
        bound, else the context length."""
        value = getattr(self.manager.tokenizer, "model_max_length", None)
        if isinstance(value, int) and 0 < value < 2**63:
            return value
        return self.manager.context_length


class DetokenizeHandler:
    body_model = DetokenizeRequest

    def __init__(self, manager: TokenizerManager, args: ServerArgs) -> None:
        self.manager = manager

    async def handle(self, request: Request) -> Response:
        body = await parse_body(request, DetokenizeRequest)
        batched = bool(body.tokens) and isinstance(body.tokens[0], list)
        rows: list[list[int]] = body.tokens if batched else [body.tokens]  # type: ignore[list-item]
        vocab = len(self.manager.tokenizer)
        for ids in rows:
            bad = [t for t in ids if not 0 <= t < vocab]
            if bad:
                raise RequestError(f"token id {bad[0]} is outside the vocabulary [0, {vocab})")
        decode = self.manager.tokenizer.decode
        texts = [decode(ids, skip_special_tokens=body.skip_special_tokens) for ids in rows]
        return JSONResponse({"text": texts if batched else texts[0]})
