"""``POST /v1/score`` (vLLM's request and response) and ``POST /v1/rerank`` (vLLM's, Cohere's
and Jina's requests; vLLM's / Cohere's ``results``). A reranker checkpoint (a classification
head, or the logits of the tokens it names) scores each (query, document) prompt as a
cross-encoder; an embedding model scores the cosine of the two pooled vectors."""

from __future__ import annotations

import time
import uuid
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from sglang.srt.entrypoints.http_utils import parse_body
from sglang.srt.entrypoints.openai.protocol_retrieval import (
    MultimodalContent,
    RerankRequest,
    ScoreRequest,
)
from sglang.srt.entrypoints.openai.retrieval import (
    Piece,
    check_serves_pooling,
    pair_input,
    piece_input,
    piece_of,
    pooling_usage,
    run_pooling,
)
from sglang.srt.entrypoints.openai.serving_base import served_model_name
from sglang.srt.layers.pooler import cosine_score, embedding_output, relevance_score
from sglang.srt.managers.tokenizer_manager import RequestError, TokenizerManager
from sglang.srt.server_args import ServerArgs


class _ScoringHandler:
    def __init__(self, manager: TokenizerManager, args: ServerArgs) -> None:
        self.manager = manager
        self.args = args
        self.model_name = served_model_name(args)

    async def score_pairs(
        self,
        pairs: list[tuple[Piece, Piece]],
        instruct: str | None,
        mm_kwargs: dict[str, Any] | None,
        request: Request,
    ) -> tuple[list[float], dict[str, int]]:
        """One score per (query, document) pair, and the usage of the call."""
        config = check_serves_pooling(self.manager)
        if not pairs:
            raise RequestError("there is nothing to score: give at least one document")
        if config.is_cross_encoder:
            inputs = [
                pair_input(self.manager, self.args, q, d, instruct, mm_kwargs) for q, d in pairs
            ]
            events = await run_pooling(self.manager, inputs, request)
            return [relevance_score(e.embedding or []) for e in events], pooling_usage(events)
        pieces: list[Piece] = []  # each distinct piece embedded once
        index: dict[int, int] = {}
        for piece in (p for pair in pairs for p in pair):
            if id(piece) not in index:
                index[id(piece)] = len(pieces)
                pieces.append(piece)
        inputs = [piece_input(self.manager, self.args, p, mm_kwargs) for p in pieces]
        events = await run_pooling(self.manager, inputs, request)
        vectors = [embedding_output(e.embedding or [], config, None) for e in events]
        scores = [cosine_score(vectors[index[id(q)]], vectors[index[id(d)]]) for q, d in pairs]
        return scores, pooling_usage(events)


class ScoreHandler(_ScoringHandler):
    body_model = ScoreRequest

    async def handle(self, request: Request) -> Response:
        body = await parse_body(request, ScoreRequest)
        first = _first_given(body.text_1, body.queries, body.data_1)
        second = _first_given(body.text_2, body.documents, body.data_2)
        if first is None or second is None:
            raise RequestError("give text_1 and text_2 (or queries and documents)")
        pairs = score_pairs(_queries(first), _documents(second))
        scores, usage = await self.score_pairs(
            pairs, body.instruct, body.mm_processor_kwargs, request
        )
        data = [{"index": i, "object": "score", "score": s} for i, s in enumerate(scores)]
        return JSONResponse(
            {
                "id": f"score-{uuid.uuid4().hex}",
                "object": "list",
                "created": int(time.time()),
                "model": self.model_name,
                "data": data,
                "usage": usage,
            }
        )


class RerankHandler(_ScoringHandler):
    body_model = RerankRequest

    async def handle(self, request: Request) -> Response:
        body = await parse_body(request, RerankRequest)
        query = piece_of(body.query)
        documents = _documents(body.documents)
        pairs = [(query, d) for d in documents]
        scores, usage = await self.score_pairs(
            pairs, body.instruct, body.mm_processor_kwargs, request
        )
        order = sorted(range(len(scores)), key=lambda i: -scores[i])
        if body.top_n:
            order = order[: body.top_n]
        results = []
        for i in order:
            result: dict[str, Any] = {"index": i, "relevance_score": scores[i]}
            if body.return_documents:
                result["document"] = documents[i].document()
            results.append(result)
        return JSONResponse(
            {
                "id": f"rerank-{uuid.uuid4().hex}",
                "model": self.model_name,
                "results": results,
                "usage": usage,
            }
        )


def _first_given(*values: Any) -> Any:
    return next((v for v in values if v is not None), None)


def _queries(value: Any) -> list[Piece]:
    """A query side: one input (vLLM's content form is one query) or a list of inputs."""
    if value == []:
        return []
    if isinstance(value, list) and _is_input_list(value):
        return [piece_of(v) for v in value]
    return [piece_of(value)]


def _documents(value: Any) -> list[Piece]:
    """A document side: one input, a list of inputs, or vLLM's content (one per part)."""
    if isinstance(value, MultimodalContent):
        return [piece_of([part]) for part in value.content]
    return _queries(value)


def _is_input_list(value: list) -> bool:
    """A list of inputs, not one input given as content parts or token ids."""
    return not all(hasattr(v, "type") for v in value) and not all(isinstance(v, int) for v in value)


def score_pairs(queries: list[Piece], documents: list[Piece]) -> list[tuple[Piece, Piece]]:
    """vLLM's pairing: one query against every document, or the i-th with the i-th."""
    if len(queries) == 1:
        return [(queries[0], d) for d in documents]
    if len(queries) != len(documents):
        raise RequestError(
            f"{len(queries)} queries and {len(documents)} documents: give one query, or as many "
            "queries as documents"
        )
    return list(zip(queries, documents))
