"""The FastAPI app: routes, the request gate (bearer key, body size) and error bodies.

:func:`create_api` builds the app around a :class:`RerankService` and a ``score`` coroutine
(in Serve, the deployment's ``@serve.batch`` method), so the HTTP layer stays thin and the
same app can be built without Ray.

Errors: every client mistake is a 4xx with a JSON body ``{"message": ...}`` naming the field
(``documents[3]: Input should be a valid string``): 401 missing/wrong bearer key, 413 body or
document too large / too many documents, 422 invalid body. Overload is a 503 with
``Retry-After``: ``score`` raises :class:`~acare_ray.online.admission.Overloaded` when the work
queued ahead would start the request after the admission deadline, and the optional ``screen``
refuses a rerank request the same way before its body is read while the replica is over its
deadline already (see :mod:`acare_ray.online.admission`).

Every answered rerank request carries its usage in ``x-acare-tokens`` (the tokens scored).
"""

from __future__ import annotations

import asyncio
import hmac
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

from acare_ray.online.admission import Overloaded
from acare_ray.online.api import (
    COHERE_V2_DEFAULT_MAX_TOKENS_PER_DOC,
    CohereRerankRequest,
    RerankResponse,
    TeiRank,
    TeiRerankRequest,
    cohere_response,
    tei_response,
)
from acare_ray.online.service import ClientError, RerankService, ScoringJob, Search

CREATED = int(time.time())
OPEN_PATHS = frozenset({"/health", "/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json"})
RERANK_PATHS = frozenset({"/v1/rerank", "/v2/rerank", "/rerank"})


@dataclass(frozen=True)
class Scored:
    """Scores of one job (log-odds, input order) and how many requests its batch held."""

    scores: np.ndarray
    batch_requests: int = 1


ScoreFn = Callable[[ScoringJob], Awaitable[Scored]]
ScreenFn = Callable[[], Overloaded | None]


def _json_error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"message": message}, status_code=status, headers=headers)


class Gate:
    """ASGI middleware run before any body parsing: bearer key check, overload screen, then
    body size limit.

    The size is checked against ``Content-Length`` up front and counted while the body
    streams in, so a chunked upload cannot bypass it. ``/health`` and the docs stay open.
    ``screen`` (if given) may refuse a rerank request as :class:`Overloaded` before it is read.
    """

    def __init__(
        self,
        app: ASGIApp,
        api_key: str | None,
        max_body_bytes: int,
        screen: ScreenFn | None = None,
    ) -> None:
        self.app = app
        self.api_key = api_key
        self.max_body_bytes = max_body_bytes
        self.screen = screen

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        if self.api_key and _route_path(scope) not in OPEN_PATHS and not self._authorized(headers):
            response = _json_error(
                401,
                "Authorization: a valid 'Bearer <key>' header is required",
                {"www-authenticate": "Bearer"},
            )
            await response(scope, receive, send)
            return
        if self.screen is not None and _route_path(scope) in RERANK_PATHS:
            refusal = self.screen()
            if refusal is not None:
                await _overloaded_response(refusal)(scope, receive, send)
                return
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self.max_body_bytes:
            await _json_error(413, self._too_large(int(declared)))(scope, receive, send)
            return
        received = 0

        async def receive_limited():
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_body_bytes:
                    raise HTTPException(413, self._too_large(received))
            return message

        await self.app(scope, receive_limited, send)

    def _too_large(self, size: int) -> str:
        return f"body: {size} bytes is over the limit of {self.max_body_bytes} bytes"

    def _authorized(self, headers: Headers) -> bool:
        scheme, _, token = headers.get("authorization", "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(
            token.strip().encode(), self.api_key.encode()
        )


def _route_path(scope: Scope) -> str:
    """The path inside the app (Serve mounts an app under its route prefix as ``root_path``)."""
    path, root = scope.get("path", ""), scope.get("root_path", "")
    if root and path.startswith(root):
        return path[len(root) :] or "/"
    return path


def _field_path(loc: tuple[Any, ...]) -> str:
    parts = list(loc[1:] if loc and loc[0] == "body" else loc)
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "body"


async def _validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
    problems = []
    for error in exc.errors():
        field = _field_path(tuple(error.get("loc", ())))
        message = str(error.get("msg", "invalid")).removeprefix("Value error, ")
        # Whole-body checks (model validators) already name the field in their message.
        whole_body = field == "body" and error.get("type") == "value_error"
        problems.append(
            {"field": field, "message": message if whole_body else f"{field}: {message}"}
        )
    text = "; ".join(p["message"] for p in problems)
    return JSONResponse({"message": text, "errors": problems}, status_code=422)


def _overloaded_response(exc: Overloaded) -> JSONResponse:
    headers = {
        "retry-after": str(exc.retry_after_s),
        "x-acare-expected-wait-s": f"{exc.expected_wait_s:.3f}",
    }
    return _json_error(503, exc.message, headers)


async def _overloaded(_: Request, exc: Overloaded) -> JSONResponse:
    return _overloaded_response(exc)


async def _client_error(_: Request, exc: ClientError) -> JSONResponse:
    return _json_error(exc.status, exc.message)


async def _http_error(_: Request, exc: HTTPException) -> JSONResponse:
    return _json_error(exc.status_code, str(exc.detail), getattr(exc, "headers", None))


def create_api(
    service: RerankService,
    score: ScoreFn,
    *,
    api_key: str | None = None,
    status: Callable[[], dict[str, Any]] | None = None,
    screen: ScreenFn | None = None,
) -> FastAPI:
    """The HTTP app; ``score`` scores one prepared job (batched by the caller if it wants) or
    raises :class:`Overloaded`; ``screen`` refuses work before a request body is read."""
    model = service.model_name
    api = FastAPI(
        title="acare_ray reranker",
        version="1",
        description=(
            "Agent-context-aware reranking. Cohere-compatible `/v1/rerank` and `/v2/rerank`, "
            "TEI-compatible `/rerank`; every endpoint also takes `original_question`, "
            "`reasoning` and `mode`. Scores are sigmoid(log-odds) unless `raw_scores` is set."
        ),
    )
    api.add_middleware(
        Gate, api_key=api_key, max_body_bytes=service.limits.max_body_bytes, screen=screen
    )
    api.add_exception_handler(RequestValidationError, _validation_error)
    api.add_exception_handler(ClientError, _client_error)
    api.add_exception_handler(Overloaded, _overloaded)
    api.add_exception_handler(HTTPException, _http_error)

    async def run(search: Search, response: Response) -> tuple[ScoringJob, np.ndarray, int]:
        """Prepare, score and count one search: (job, log-odds, tokens scored)."""
        job = await asyncio.to_thread(service.prepare, search)
        response.headers["x-acare-mode"] = job.mode.value
        if job.truncated:
            response.headers["x-acare-truncated"] = ",".join(map(str, job.truncated))
        if not job.documents:
            response.headers["x-acare-tokens"] = "0"
            return job, np.empty(0, dtype=np.float32), 0
        scored = await score(job)
        tokens = await asyncio.to_thread(service.tokens_scored, job)
        response.headers["x-acare-batch-requests"] = str(scored.batch_requests)
        response.headers["x-acare-tokens"] = str(tokens)
        return job, scored.scores, tokens

    async def cohere(body: CohereRerankRequest, response: Response, version: str):
        default = COHERE_V2_DEFAULT_MAX_TOKENS_PER_DOC if version == "2" else None
        job, scores, tokens = await run(body.search(default), response)
        return cohere_response(
            body,
            job,
            scores,
            request_id=str(uuid.uuid4()),
            version=version,
            model=model,
            tokens=tokens,
        )

    @api.post("/v1/rerank", response_model=RerankResponse, response_model_exclude_none=True)
    async def rerank_v1(body: CohereRerankRequest, response: Response) -> RerankResponse:
        """Cohere v1 rerank, plus `original_question`, `reasoning`, `mode`."""
        return await cohere(body, response, "1")

    @api.post("/v2/rerank", response_model=RerankResponse, response_model_exclude_none=True)
    async def rerank_v2(body: CohereRerankRequest, response: Response) -> RerankResponse:
        """Cohere v2 rerank (`max_tokens_per_doc` defaults to 4096), plus the context fields."""
        return await cohere(body, response, "2")

    @api.post("/rerank", response_model=list[TeiRank], response_model_exclude_none=True)
    async def rerank_tei(body: TeiRerankRequest, response: Response) -> list[TeiRank]:
        """text-embeddings-inference rerank, plus the context fields. Sorted by score; the
        tokens scored are in the `x-acare-tokens` header."""
        _, scores, _ = await run(body.search(), response)
        return tei_response(body, scores)

    @api.get("/health")
    async def health() -> dict[str, Any]:
        """Liveness, the batching settings and the admission state (no auth)."""
        return {"status": "ok", "model": model, **(status() if status else {})}

    @api.get("/v1/models")
    async def models() -> dict[str, Any]:
        """The served model, in OpenAI (`data`) and Cohere (`models`) list shapes."""
        card = service.describe()
        return {
            "object": "list",
            "data": [{"object": "model", "owned_by": "acare_ray", "created": CREATED, **card}],
            "models": [
                {
                    "name": card["id"],
                    "endpoints": ["rerank"],
                    "context_length": card["max_length"],
                }
            ],
        }

    return api
