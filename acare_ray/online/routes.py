"""The rerank routes of the protocols: each parses its body (:mod:`acare_ray.online.protocols`),
calls the serving object once (:class:`~acare_ray.online.serving.RerankServing`) and shapes its
:class:`~acare_ray.online.serving.RerankOutcome` as its protocol answers.

- ``/v1/rerank`` (Cohere v1, vLLM, Jina) and ``/v2/rerank`` (Cohere v2);
- ``/rerank`` (text-embeddings-inference);
- ``/score`` and ``/v1/score`` (vLLM's score API).

Each app's bodies hold at most its ``max_documents`` documents (``maxItems`` in OpenAPI), so
too many documents is refused while the body is validated, before any is looked at. The body
types are built per app for that, so this module leaves annotations unpostponed (no ``from
__future__ import annotations``): FastAPI reads each route's body type as the class built here.
"""

import asyncio
import time
import uuid
from typing import Annotated

from fastapi import FastAPI, Request, Response
from pydantic import BaseModel, Field, create_model

from acare_ray.online.errors import ClientError
from acare_ray.online.protocols.cohere import (
    COHERE_V2_DEFAULT_MAX_TOKENS_PER_DOC,
    CohereRerankRequest,
    RerankResponse,
    cohere_response,
)
from acare_ray.online.protocols.tei import EmptyTexts, TeiRank, TeiRerankRequest, tei_response
from acare_ray.online.protocols.vllm import (
    ScoreRequest,
    ScoreResponse,
    V1RerankRequest,
    score_response,
)
from acare_ray.online.serving import RerankOutcome, RerankServing, merge_outcomes


def with_max_items(model: type[BaseModel], field: str, limit: int) -> type[BaseModel]:
    """``model`` whose list ``field`` holds at most ``limit`` items (``maxItems`` in OpenAPI),
    so ``max_documents`` is enforced while the body is validated."""
    info = model.model_fields[field]
    annotation = Annotated[info.annotation, Field(max_length=limit)]
    return create_model(
        model.__name__,
        __base__=model,
        __doc__=model.__doc__,
        **{field: (annotation, Field(description=info.description))},
    )


def _answer(response: Response, result: RerankOutcome) -> None:
    response.headers.update(result.headers())


def rerank_routes(api: FastAPI, serving: RerankServing, max_documents: int) -> None:
    """Add the protocols' rerank routes to ``api``, each body holding at most
    ``max_documents`` documents."""
    CohereBody = with_max_items(CohereRerankRequest, "documents", max_documents)  # noqa: N806
    V1Body = with_max_items(V1RerankRequest, "documents", max_documents)  # noqa: N806
    TeiBody = with_max_items(TeiRerankRequest, "texts", max_documents)  # noqa: N806
    exclude_none = {"response_model_exclude_none": True}

    @api.post("/v1/rerank", response_model=RerankResponse, **exclude_none)
    async def rerank_v1(body: V1Body, request: Request, response: Response) -> RerankResponse:
        """Cohere v1 rerank (and vLLM's and Jina's), plus `original_question`, `reasoning`,
        `mode`."""
        result = await serving.rerank(
            body.search(),
            request,
            model=serving.model_for(body.model, request),
            first_stage=body,
            raw=body.use_activation is False,
        )
        _answer(response, result)
        return cohere_response(body, result, request_id=str(uuid.uuid4()), version="1")

    @api.post("/v2/rerank", response_model=RerankResponse, **exclude_none)
    async def rerank_v2(body: CohereBody, request: Request, response: Response) -> RerankResponse:
        """Cohere v2 rerank (`max_tokens_per_doc` defaults to 4096), plus the context fields."""
        result = await serving.rerank(
            body.search(COHERE_V2_DEFAULT_MAX_TOKENS_PER_DOC),
            request,
            model=serving.model_for(body.model, request),
            first_stage=body,
        )
        _answer(response, result)
        return cohere_response(body, result, request_id=str(uuid.uuid4()), version="2")

    @api.post("/rerank", response_model=list[TeiRank], **exclude_none)
    async def rerank_tei(body: TeiBody, request: Request, response: Response) -> list[TeiRank]:
        """text-embeddings-inference rerank, plus the context fields. Sorted by score; the
        tokens scored are in the `x-acare-tokens` and TEI's `x-compute-tokens` headers. As in
        TEI, `model` and `top_n` are accepted and ignored, and empty `texts` is a 400."""
        began = time.perf_counter()
        if not body.texts:
            raise EmptyTexts()
        result = await serving.rerank(
            body.search(),
            request,
            model=serving.model_for(None, request),
            first_stage=body,
            raw=body.raw_scores,
        )
        _answer(response, result)
        elapsed_ms = str(round(1e3 * (time.perf_counter() - began)))
        response.headers["x-compute-tokens"] = str(result.tokens)
        response.headers["x-compute-characters"] = str(body.characters())
        response.headers["x-compute-time"] = response.headers["x-total-time"] = elapsed_ms
        return tei_response(body, result)

    async def score_vllm(body: ScoreRequest, request: Request, response: Response) -> ScoreResponse:
        """vLLM's score API: one query against several texts, or pairs; scores in input order,
        sigmoid(log-odds) unless `use_activation` is false. Plus the context fields, which
        apply to every pair. A run of pairs with the same query is scored as one search."""
        searches, rows = body.searches()  # the pairs grouped: no text is tokenized yet
        count = sum(map(len, rows))
        if count > max_documents:  # as on the rerank routes: bounded before any work
            field = searches[0].documents_field
            raise ClientError(413, field, f"has {count} texts; at most {max_documents} per request")
        model = serving.model_for(body.model, request)
        raw = body.use_activation is False
        parts = await asyncio.gather(
            *(serving.rerank(s, request, model=model, raw=raw) for s in searches)
        )
        result = merge_outcomes(parts, rows)
        _answer(response, result)
        return score_response(result)

    api.post("/score", response_model=ScoreResponse)(score_vllm)
    api.post("/v1/score", response_model=ScoreResponse)(score_vllm)
