"""The FastAPI app: the request gate (bearer key, body size), error bodies, the info routes,
and the replica the routes call (the rerank routes themselves: :mod:`acare_ray.online.routes`).

:func:`create_api` builds the app around one :class:`Replica` object the routes call: the
served models (each with its own ``score`` coroutine; in Serve, the deployment's batching
method), the app-wide limits and keys, and the replica's hooks (status, screen, health, more
routes). In Serve the ``Reranker`` deployment is that object; :class:`OneModel` wraps one
:class:`RerankService` without Ray (:func:`single_model_api`), so the HTTP layer stays thin
and the same app can be built without Ray.

Errors: every client mistake is a 4xx with a JSON body ``{"message": ...}`` naming the field
(``documents[3]: Input should be a valid string``), bounded in length whatever it quotes: 401
missing/wrong bearer key, 408 body not received within ``body_read_timeout_s``, 413 body or
document too large / too many documents (refused while the body is validated, before any
document is looked at) / request over ``max_request_tokens``, 422 invalid body. Overload is a
503 with ``Retry-After``: ``score`` raises :class:`~acare_ray.online.admission.Overloaded` when
the work queued ahead would start the request after the admission deadline, and the optional
``screen`` refuses a rerank request the same way before its body is read while the replica is
over its deadline already; a client over its fair share gets 429
(:class:`~acare_ray.online.admission.RateLimited`) the same way.

Public without a key: ``GET /health`` (``{"status": "ok"}`` or 503 ``{"status": "down"}``,
nothing else) and the OpenAPI docs. Everything else, ``GET /v1/status`` (model, replica,
batching, admission) included, needs the key when one is configured.

Every answered rerank request carries its usage in ``x-acare-tokens`` (the tokens scored).
With several models (:mod:`acare_ray.online.models`) a request picks one by name (404 listing
the names when unknown), and ``x-acare-model`` says which answered; ``x-acare-model-version``
(every deployment, when the model has one) says which checkpoint.
"""

from __future__ import annotations

import asyncio
import hmac
import importlib.metadata
import time
from collections.abc import Callable
from typing import Any, Protocol

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

from acare_ray.online.admission import Overloaded
from acare_ray.online.errors import ClientError, bounded
from acare_ray.online.metrics import Recorder, RequestMetrics
from acare_ray.online.models import ModelRouter, ScoreFn, StaticModels, UnknownModel
from acare_ray.online.protocols.tei import EmptyTexts, tei_error_fields
from acare_ray.online.routes import rerank_routes
from acare_ray.online.service import Limits, RerankService
from acare_ray.online.serving import CLIENT_STATE, RerankServing
from acare_ray.ranking.fusion import FusionConfig

CREATED = int(time.time())
OPEN_PATHS = frozenset({"/health", "/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json"})
RERANK_PATHS = frozenset(
    {"/v1/rerank", "/v2/rerank", "/rerank", "/v1/search", "/score", "/v1/score"}
)
ScreenFn = Callable[[str], Overloaded | None]


def parse_keys(value: str | None) -> tuple[str, ...]:
    """API keys from a secret's text: separated by commas or newlines, whitespace stripped
    (a key file written with a trailing newline is the same key), empty entries dropped."""
    if not value:
        return ()
    return tuple(k.strip() for k in value.replace(",", "\n").splitlines() if k.strip())


def _json_error(
    status: int, message: str, headers: dict[str, str] | None = None, path: str = ""
) -> JSONResponse:
    text = bounded(message)
    body = {"message": text, **tei_error_fields(path, status, text)}
    return JSONResponse(body, status_code=status, headers=headers)


class Gate:
    """ASGI middleware run before any body parsing: bearer key check, overload screen, then
    body size limit and body-read deadline.

    The size is checked against ``Content-Length`` up front and counted while the body
    streams in, so a chunked upload cannot bypass it; the whole body must arrive within
    ``body_read_timeout_s`` (else 408), so a slow sender cannot hold a request open.
    ``/health`` and the docs stay open. ``screen`` (if given) may refuse a rerank request as
    :class:`Overloaded` before it is read. The client's identity (which key, or its address
    when no key is configured) goes to the routes in ``scope["state"]``.
    """

    def __init__(
        self,
        app: ASGIApp,
        api_keys: tuple[str, ...],
        max_body_bytes: int,
        screen: ScreenFn | None = None,
        body_read_timeout_s: float = 30.0,
    ) -> None:
        self.app = app
        self.api_keys = api_keys
        self.max_body_bytes = max_body_bytes
        self.screen = screen
        self.body_read_timeout_s = body_read_timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        client = self._client(scope, headers)
        if self.api_keys and _route_path(scope) not in OPEN_PATHS and client is None:
            response = _json_error(
                401,
                "Authorization: a valid 'Bearer <key>' header is required",
                {"www-authenticate": "Bearer"},
                _route_path(scope),
            )
            await response(scope, receive, send)
            return
        identity = client or "anonymous"
        scope.setdefault("state", {})[CLIENT_STATE] = identity
        if self.screen is not None and _route_path(scope) in RERANK_PATHS:
            refusal = self.screen(identity)
            if refusal is not None:
                await _overloaded_response(refusal, _route_path(scope))(scope, receive, send)
                return
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self.max_body_bytes:
            refusal = _json_error(413, self._too_large(int(declared)), path=_route_path(scope))
            await refusal(scope, receive, send)
            return
        received = 0
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.body_read_timeout_s
        body_done = False

        async def receive_limited():
            nonlocal received, body_done
            if body_done:  # after the body: disconnect notices, no deadline
                return await receive()
            try:
                message = await asyncio.wait_for(receive(), max(deadline - loop.time(), 0.0))
            except asyncio.TimeoutError:
                raise HTTPException(
                    408, f"body: not received within {self.body_read_timeout_s:g} s"
                ) from None
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_body_bytes:
                    raise HTTPException(413, self._too_large(received))
                body_done = not message.get("more_body", False)
            else:
                body_done = True
            return message

        await self.app(scope, receive_limited, send)

    def _too_large(self, size: int) -> str:
        return f"body: {size} bytes is over the limit of {self.max_body_bytes} bytes"

    def _client(self, scope: Scope, headers: Headers) -> str | None:
        """``key:<n>`` for the n-th configured key (``None`` if keys are configured and none
        matches), else ``addr:<client host>``."""
        if not self.api_keys:
            peer = scope.get("client") or ("unknown", 0)
            return f"addr:{peer[0]}"
        scheme, _, token = headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer":
            return None
        given = token.strip().encode()
        found = None
        for i, key in enumerate(self.api_keys):  # compare with every key: no timing hint
            if hmac.compare_digest(given, key.encode()):
                found = f"key:{i}"
        return found


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


async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    problems = []
    status = 422
    for error in exc.errors()[:20]:
        field = bounded(_field_path(tuple(error.get("loc", ()))), 100)
        message = bounded(str(error.get("msg", "invalid")).removeprefix("Value error, "))
        # Whole-body checks (model validators) already name the field in their message.
        whole_body = field == "body" and error.get("type") == "value_error"
        if error.get("type") == "too_long" and field in ("documents", "texts"):
            status = 413  # max_documents, enforced while the body is validated
        problems.append(
            {"field": field, "message": message if whole_body else f"{field}: {message}"}
        )
    text = bounded("; ".join(p["message"] for p in problems), 1000)
    tei = tei_error_fields(_route_path(request.scope), status, text)
    return JSONResponse({"message": text, "errors": problems, **tei}, status_code=status)


def _overloaded_response(exc: Overloaded, path: str = "") -> JSONResponse:
    headers = {
        "retry-after": str(exc.retry_after_s),
        "x-acare-expected-wait-s": f"{exc.expected_wait_s:.3f}",
    }
    return _json_error(exc.status, exc.message, headers, path)


async def _overloaded(request: Request, exc: Overloaded) -> JSONResponse:
    return _overloaded_response(exc, _route_path(request.scope))


async def _client_error(request: Request, exc: ClientError) -> JSONResponse:
    path = _route_path(request.scope)
    if isinstance(exc, UnknownModel):  # its body lists the available models in full
        body = {"message": bounded(exc.message), **exc.body()}
        return JSONResponse(body | tei_error_fields(path, exc.status, body["message"]), exc.status)
    if isinstance(exc, EmptyTexts):
        body = {"message": exc.message, **tei_error_fields(path, 400, "`texts` cannot be empty")}
        return JSONResponse(body, status_code=400)
    return _json_error(exc.status, exc.message, path=path)


async def _http_error(request: Request, exc: HTTPException) -> JSONResponse:
    headers = getattr(exc, "headers", None)
    return _json_error(exc.status_code, str(exc.detail), headers, _route_path(request.scope))


def _package_version() -> str:
    try:
        return importlib.metadata.version("acare_ray")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree, not installed
        return "0+unknown"


def _model_dtype(service: RerankService) -> str:
    """The loaded weights' dtype name (``float32``, ``bfloat16``)."""
    model = getattr(service.scorer.backend, "hf_model", None)
    weight = next(model.parameters(), None) if model is not None else None
    return str(weight.dtype).removeprefix("torch.") if weight is not None else "unknown"


def _info_routes(
    api: FastAPI,
    router: ModelRouter,
    auth: bool,
    status: Callable[[], dict[str, Any]],
    healthy: Callable[[], bool],
    limits: Limits,
) -> None:
    """``/health`` (open), ``/v1/status``, ``/v1/models`` and TEI's ``/info``."""

    @api.get("/health")
    async def health() -> JSONResponse:
        """Up or down, nothing else (no auth): 200 `{"status": "ok"}`, or 503
        `{"status": "down"}` when the replica's last model check failed."""
        up = healthy()
        return JSONResponse({"status": "ok" if up else "down"}, status_code=200 if up else 503)

    @api.get("/info")
    async def tei_info() -> dict[str, Any]:
        """text-embeddings-inference's `/info` (what `tei-client` reads before it reranks): the
        default model as a reranker, its input length and this app's limits. Needs the key
        when one is configured. `max_concurrent_requests` is null: Serve's proxy bounds it."""
        name = router.catalog.default
        async with router.use(name) as served:
            card = served.service.describe()
            dtype = _model_dtype(served.service)
            version = served.version
        batching = status().get("batching", {})
        return {
            "model_id": name,
            "model_sha": version,
            "model_dtype": dtype,
            "served_model_name": name,
            "model_type": {"reranker": {"id2label": {"0": "LABEL_0"}, "label2id": {"LABEL_0": 0}}},
            "max_concurrent_requests": None,
            "max_input_length": card["max_length"],
            "max_batch_tokens": batching.get("max_batch_tokens"),
            "max_batch_requests": batching.get("max_batch_size"),
            "max_client_batch_size": limits.max_documents,
            "auto_truncate": limits.auto_truncate,
            "tokenization_workers": 1,
            "version": _package_version(),
            "sha": None,
            "docker_label": None,
        }

    @api.get("/v1/status")
    async def replica_status() -> dict[str, Any]:
        """The served model, this replica, auth, batching settings and admission state (needs
        the key when one is configured)."""
        catalog = router.catalog
        sources = {name: source.model for name, source in catalog.sources.items()}
        return {"model": catalog.default, "sources": sources, "auth": auth} | status()

    @api.get("/v1/models")
    async def list_models() -> dict[str, Any]:
        """The served models, in OpenAI (`data`) and Cohere (`models`) list shapes; a request
        picks one by its `model` field or the `serve_multiplexed_model_id` header."""
        cards = router.cards()
        return {
            "object": "list",
            "data": [
                {"object": "model", "owned_by": "acare_ray", "created": CREATED, **card}
                for card in cards
            ],
            "models": [
                {
                    "name": card["id"],
                    "endpoints": ["rerank"],
                    "context_length": card.get("max_length"),
                }
                for card in cards
            ],
        }


class Replica(Protocol):
    """The one object the app's routes call (the Serve replica, or :class:`OneModel`): the
    served models, the app-wide limits and API keys, and the replica's own hooks."""

    models: ModelRouter
    limits: Limits
    api_keys: tuple[str, ...]
    metrics: Recorder | None

    def status(self) -> dict[str, Any]:
        """What ``/v1/status`` reports about the replica."""

    def screen(self, client: str) -> Overloaded | None:
        """A refusal before the body is read (over the deadline, the client's share), or None."""

    def healthy(self) -> bool:
        """Whether ``/health`` answers ok (the last model check passed)."""

    def add_routes(self, api: FastAPI, serving: RerankServing) -> None:
        """More routes that rerank through ``serving`` (``/v1/search``, the sessions)."""


class OneModel:
    """A :class:`Replica` around one :class:`RerankService`, scored by ``score(job, client)``
    (batched by the caller if it wants; may raise :class:`Overloaded`): the app of the MCP
    server and of the tests. ``api_key``: one key or several (each a client of its own for
    fairness); ``fitted_fusion``: what ``fusion: auto`` means
    (:mod:`acare_ray.online.fusion_fields`); ``extra_routes(app, serving)`` adds routes;
    ``metrics`` records requests and what they scored (:mod:`acare_ray.online.metrics`)."""

    def __init__(
        self,
        service: RerankService,
        score: ScoreFn | None,
        *,
        api_key: str | tuple[str, ...] | None = None,
        status: Callable[[], dict[str, Any]] | None = None,
        screen: ScreenFn | None = None,
        healthy: Callable[[], bool] | None = None,
        fitted_fusion: FusionConfig | None = None,
        extra_routes: Callable[[FastAPI, RerankServing], None] | None = None,
        metrics: Recorder | None = None,
    ) -> None:
        self.models = StaticModels.single(service, fitted_fusion, score)
        self.limits = service.limits
        self.api_keys = parse_keys(api_key) if isinstance(api_key, str) else tuple(api_key or ())
        self.metrics = metrics
        self._status, self._screen, self._healthy = status, screen, healthy
        self._extra_routes = extra_routes

    def status(self) -> dict[str, Any]:
        return self._status() if self._status else {}

    def screen(self, client: str) -> Overloaded | None:
        return self._screen(client) if self._screen else None

    def healthy(self) -> bool:
        return self._healthy() if self._healthy else True

    def add_routes(self, api: FastAPI, serving: RerankServing) -> None:
        if self._extra_routes is not None:
            self._extra_routes(api, serving)


def single_model_api(service: RerankService, score: ScoreFn | None, **options: Any) -> FastAPI:
    """The app of one model: :func:`create_api` of a :class:`OneModel` (options as there)."""
    return create_api(OneModel(service, score, **options))


def create_api(replica: Replica) -> FastAPI:
    """The HTTP app; every route reads ``replica`` (:class:`Replica`): a request picks one of
    ``replica.models`` by name and is scored by that model's own ``score``."""
    models, limits, keys = replica.models, replica.limits, replica.api_keys
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
        Gate,
        api_keys=keys,
        max_body_bytes=limits.max_body_bytes,
        screen=replica.screen,
        body_read_timeout_s=limits.body_read_timeout_s,
    )
    api.add_exception_handler(RequestValidationError, _validation_error)
    api.add_exception_handler(ClientError, _client_error)
    api.add_exception_handler(Overloaded, _overloaded)
    api.add_exception_handler(HTTPException, _http_error)
    metrics = replica.metrics
    serving = RerankServing(models, metrics)
    replica.add_routes(api, serving)
    rerank_routes(api, serving, limits.max_documents)
    _info_routes(api, models, bool(keys), replica.status, replica.healthy, limits)
    if metrics is not None:  # outermost: sees what the gate refuses too
        paths = {getattr(route, "path", "") for route in api.routes}
        api.add_middleware(
            RequestMetrics, recorder=metrics, model=models.catalog.default, paths=paths
        )
    return api
