"""``POST /v1/search`` and ``/v1/sessions/{id}``: the routes the Serve app adds when a first stage
is configured (application args ``search:``, :class:`SearchSettings`).

A search: the first stage's top ``first_stage_k`` for the sub-query -> the reranker scores them
with the agent's context (through the serving object every rerank route calls, admitted and
batched like any rerank request) ->
:class:`~acare_ray.online.fusion_fields.RankedFirstStage` (the request's ``fusion``, by default the setting fitted for the
served checkpoint) -> documents the session has not been shown yet first (the
session's memory and the request's ``seen_ids``), each group in that order -> the first
``top_k``, which the session then remembers as seen.

Session memory lives in one :class:`SessionStore` replica per application, reached by every
reranker replica through its deployment handle (docs/agents.md, "Session memory").
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import KW_ONLY, dataclass
from typing import Any, Protocol

from fastapi import FastAPI, Path, Request, Response
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from acare_ray.online.errors import ClientError
from acare_ray.online.fusion_fields import FusionSetting, RankedFirstStage
from acare_ray.online.protocols.common import AgentFields
from acare_ray.online.service import RerankInput
from acare_ray.online.serving import RerankOutcome, RerankServing
from acare_ray.ranking.fusion import Fused
from acare_ray.search.first_stage import (
    BM25FirstStage,
    FirstStage,
    FirstStageHit,
    HttpFirstStage,
    UpstreamError,
)
from acare_ray.search.sessions import SessionLimits

MAX_SESSION_ID = 256
MAX_SEEN_IDS = 10_000
DEFAULT_TOP_K = 10


class SearchSettings(BaseModel):
    """The ``search:`` application argument: a first stage (``index`` or ``upstream_url``,
    exactly one) and the session memory's bounds."""

    model_config = ConfigDict(extra="forbid")

    index: str | None = Field(None, description="Index folder written by `acare index`.")
    upstream_url: str | None = Field(
        None, description="Upstream search API (acare_ray.search.first_stage's adapter shape)."
    )
    upstream_api_key_env: str | None = Field(
        None, description="Environment variable with the upstream API's bearer key."
    )
    upstream_timeout_s: float = Field(10.0, gt=0)
    first_stage_k: int = Field(100, ge=1, description="Candidates reranked per search (default).")
    max_top_k: int = Field(100, ge=1, description="Largest top_k a request may ask for.")
    session_ttl_s: float = Field(3600.0, gt=0, description="Forget a session unused this long.")
    max_sessions_per_client: int = Field(1000, ge=1)
    max_clients: int = Field(1000, ge=1)
    max_seen: int = Field(10_000, ge=1, description="Ids remembered per session (oldest go).")

    @model_validator(mode="after")
    def _one_first_stage(self) -> SearchSettings:
        if (self.index is None) == (self.upstream_url is None):
            raise ValueError("search: set exactly one of index and upstream_url")
        return self

    def session_limits(self) -> SessionLimits:
        return SessionLimits(
            ttl_s=self.session_ttl_s,
            max_sessions_per_client=self.max_sessions_per_client,
            max_clients=self.max_clients,
            max_seen=self.max_seen,
        )

    def first_stage(self) -> FirstStage:
        if self.index is not None:
            return BM25FirstStage(self.index)
        key = os.environ.get(self.upstream_api_key_env) if self.upstream_api_key_env else None
        return HttpFirstStage(self.upstream_url, key or None, self.upstream_timeout_s)


class Sessions(Protocol):
    """Where session memory lives, as the routes see it (all calls awaited)."""

    async def seen(self, client: str, session_id: str) -> list[str]: ...

    async def remember(self, client: str, session_id: str, doc_ids: list[str]) -> None: ...

    async def forget(self, client: str, session_id: str) -> bool: ...


class HandleSessions:
    """The app's :class:`SessionStore` deployment, through its handle."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle

    async def seen(self, client: str, session_id: str) -> list[str]:
        return await self.handle.seen.remote(client, session_id)

    async def remember(self, client: str, session_id: str, doc_ids: list[str]) -> None:
        await self.handle.remember.remote(client, session_id, doc_ids)

    async def forget(self, client: str, session_id: str) -> bool:
        return await self.handle.forget.remote(client, session_id)


class SearchRequest(AgentFields):
    """``POST /v1/search`` body."""

    query: str = Field(
        description="The agent's search query (the sub-query); the first stage reads it."
    )
    session_id: str | None = Field(
        None,
        min_length=1,
        max_length=MAX_SESSION_ID,
        description="Results already returned to this session come after unseen ones; the "
        "results of this search are remembered for it.",
    )
    seen_ids: list[str] | None = Field(
        None,
        max_length=MAX_SEEN_IDS,
        description="Doc ids the agent has seen (for clients that keep their own memory).",
    )
    top_k: int | None = Field(
        None, ge=1, description=f"Results to return (default {DEFAULT_TOP_K}, at most max_top_k)."
    )
    first_stage_k: int | None = Field(
        None, ge=1, description="Candidates from the first stage (server default if absent)."
    )
    max_tokens_per_doc: int | None = Field(
        None, ge=1, description="Cut each candidate to this many tokens before scoring."
    )
    fusion: FusionSetting = Field(
        None,
        description="none | rrf[:k=60,weight=0.5] | linear[:alpha=0.5] | auto (default: the "
        "setting fitted for the served checkpoint, none if it has none): how the reranker's "
        "scores are fused with the first stage's.",
    )

    @field_validator("query")
    @classmethod
    def _query_has_text(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("query is empty")
        return value


class SearchResultHit(BaseModel):
    doc_id: str
    title: str | None = None
    text: str
    score: float = Field(description="The reranker's log-odds.")
    relevance_score: float = Field(
        description="0..1: the checkpoint's calibration of score for the mode, else sigmoid(score)."
    )
    first_stage_rank: int = Field(description="1-based rank in the first stage's list.")
    first_stage_score: float | None = None
    fused_score: float | None = Field(
        None, description="The fused value the order follows (absent when fusion is none)."
    )
    seen: bool = Field(description="Returned to this session (or listed in seen_ids) before.")


class SearchUsage(BaseModel):
    input_tokens: int = Field(description="Tokens the reranker scored.")
    search_units: int = 1
    first_stage: str
    candidates: int = Field(description="Documents the first stage returned and the model scored.")
    first_stage_ms: float
    rerank_ms: float
    session_ms: float = Field(description="Time spent reading and writing session memory.")


class SearchResponse(BaseModel):
    id: str
    session_id: str | None = None
    mode: str
    fusion: str = Field(description="The fusion setting used (text form).")
    results: list[SearchResultHit] = Field(
        description="Unseen documents first, each group best first."
    )
    usage: SearchUsage
    warnings: list[str] | None = None


class ForgetResponse(BaseModel):
    session_id: str
    deleted: bool


class SessionView(BaseModel):
    session_id: str
    seen_ids: list[str] = Field(description="Doc ids returned to the session, oldest first.")


def unseen_first(order: Sequence[int], doc_ids: Sequence[str], seen: set[str]) -> list[int]:
    """``order`` with the unseen documents first, each group keeping its order."""
    return [i for i in order if doc_ids[i] not in seen] + [i for i in order if doc_ids[i] in seen]


def _ms_since(started: float) -> float:
    return (time.perf_counter() - started) * 1000


def _hits(
    candidates: Sequence[FirstStageHit],
    result: RerankOutcome,
    fused: Fused | None,
    served: Sequence[int],
    seen: set[str],
) -> list[SearchResultHit]:
    """The ``served`` candidates as response hits, each with its log-odds and the relevance
    the serving object made (``fused``: None when fusion is none)."""
    return [
        SearchResultHit(
            doc_id=candidates[i].doc_id,
            title=candidates[i].title,
            text=candidates[i].text,
            score=float(result.scores[i]),
            relevance_score=float(result.values[i]),
            first_stage_rank=candidates[i].rank,
            first_stage_score=candidates[i].score,
            fused_score=float(fused.values[i]) if fused is not None else None,
            seen=candidates[i].doc_id in seen,
        )
        for i in served
    ]


def _rerank_request(body: SearchRequest, candidates: Sequence[FirstStageHit]) -> RerankInput:
    """What the reranker scores for a search: its first stage's candidates in the agent's
    context."""
    return RerankInput(
        query=body.query,
        documents=[c.rerank_text for c in candidates],
        original_question=body.original_question,
        reasoning=body.reasoning,
        mode=body.mode,
        max_tokens_per_doc=body.max_tokens_per_doc,
        documents_field="first_stage",
        instruction=body.instruction,
    )


@dataclass(frozen=True)
class SearchRoutes:
    """The search and session routes, added to an app by calling this with the app and the
    serving object :func:`acare_ray.online.http.create_api` hands it."""

    first_stage: FirstStage
    sessions: Sessions
    settings: SearchSettings
    _: KW_ONLY
    max_documents: int
    client_of: Callable[[Request], str]
    replica: str | None = None

    def sizes(self, body: SearchRequest) -> tuple[int, int]:
        """``(top_k, first_stage_k)`` of a request, its defaults filled in; ClientError when
        either is over its bound."""
        settings = self.settings
        top_k = body.top_k or min(DEFAULT_TOP_K, settings.max_top_k)
        if top_k > settings.max_top_k:
            raise ClientError(422, "top_k", f"is {top_k}, at most {settings.max_top_k}")
        k = body.first_stage_k or settings.first_stage_k
        if k > self.max_documents:
            raise ClientError(
                413, "first_stage_k", f"is {k}, at most {self.max_documents} (max_documents)"
            )
        return top_k, k

    async def search(
        self, body: SearchRequest, request: Request, response: Response, serving: RerankServing
    ) -> SearchResponse:
        """First stage -> rerank with the agent's context -> unseen documents first."""
        top_k, k = self.sizes(body)
        client = self.client_of(request)
        if self.replica:
            response.headers["x-acare-replica"] = self.replica
        started = time.perf_counter()
        try:
            candidates = await asyncio.to_thread(self.first_stage.search, body.query, k)
        except UpstreamError as err:
            raise ClientError(502, "first_stage", str(err)) from None
        first_ms = _ms_since(started)
        started = time.perf_counter()
        seen = set(body.seen_ids or ())
        if body.session_id is not None:
            seen.update(await self.sessions.seen(client, body.session_id))
        session_ms = _ms_since(started)
        started = time.perf_counter()
        result = await serving.rerank(
            _rerank_request(body, candidates),
            request,
            first_stage=RankedFirstStage(
                [c.score for c in candidates], [c.rank for c in candidates], body.fusion
            ),
        )
        rerank_ms = _ms_since(started)
        response.headers.update(result.headers())
        fused = result.fused
        assert fused is not None  # a RankedFirstStage always fuses
        doc_ids = [c.doc_id for c in candidates]
        served = unseen_first([int(i) for i in fused.fused.order], doc_ids, seen)[:top_k]
        enabled = fused.fused if fused.config.enabled else None
        hits = _hits(candidates, result, enabled, served, seen)
        if body.session_id is not None and hits:
            started = time.perf_counter()
            await self.sessions.remember(client, body.session_id, [h.doc_id for h in hits])
            session_ms += _ms_since(started)
        warnings = None
        if result.truncated:
            warnings = [f"{len(result.truncated)} candidates truncated to {result.limit} tokens"]
        return SearchResponse(
            id=str(uuid.uuid4()),
            session_id=body.session_id,
            mode=result.mode.value,
            fusion=fused.config.label,
            results=hits,
            usage=SearchUsage(
                input_tokens=result.tokens,
                first_stage=self.first_stage.name,
                candidates=len(candidates),
                first_stage_ms=round(first_ms, 3),
                rerank_ms=round(rerank_ms, 3),
                session_ms=round(session_ms, 3),
            ),
            warnings=warnings,
        )

    def __call__(self, api: FastAPI, serving: RerankServing) -> None:
        sessions, client_of = self.sessions, self.client_of

        @api.post("/v1/search", response_model=SearchResponse, response_model_exclude_none=True)
        async def search(body: SearchRequest, request: Request, response: Response):
            """First stage -> rerank with the agent's context -> unseen documents first."""
            return await self.search(body, request, response, serving)

        session_path = Path(min_length=1, max_length=MAX_SESSION_ID)

        @api.get("/v1/sessions/{session_id}", response_model=SessionView)
        async def view_session(request: Request, session_id: str = session_path):
            """The doc ids this client's session has been shown."""
            return SessionView(
                session_id=session_id, seen_ids=await sessions.seen(client_of(request), session_id)
            )

        @api.delete("/v1/sessions/{session_id}", response_model=ForgetResponse)
        async def forget_session(request: Request, session_id: str = session_path):
            """Forget this client's session (idempotent: `deleted` says whether it existed)."""
            deleted = await sessions.forget(client_of(request), session_id)
            return ForgetResponse(session_id=session_id, deleted=deleted)


# The name the app builders call: SearchRoutes(...) is the function that adds the routes.
search_routes = SearchRoutes
