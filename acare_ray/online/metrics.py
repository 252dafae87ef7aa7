"""Application metrics of the Serve app, exported on Ray's Prometheus endpoint.

Recorded with Ray Serve's metrics API (``ray.serve.metrics``) in each replica; Ray's metrics
agent on every node serves them at ``http://<node>:<metrics-export-port>/metrics`` with a
``ray_`` prefix, a counter with a ``_total`` suffix, a histogram as ``_bucket`` / ``_count`` /
``_sum`` (Ray rebuilds a histogram's ``_sum`` from bucket midpoints: use the counters for
totals). Serve adds its own ``deployment``, ``replica`` and ``application`` labels.

===============================  =========  =================================  =============================================
exported name                    type       labels                             what
===============================  =========  =================================  =============================================
``ray_acare_requests_total``     counter    route, status_class, mode, model   HTTP requests the replica answered
``ray_acare_request_seconds``    histogram  route, model                       time in the replica's app per request
``ray_acare_documents_total``    counter    mode, model                        documents scored (answered requests)
``ray_acare_tokens_total``       counter    mode, model                        tokens scored (the ``x-acare-tokens`` usage)
``ray_acare_truncated_total``    counter    mode, model                        documents cut to fit (answered requests)
``ray_acare_refusals_total``     counter    reason, model                      admission refusals: 503 ``deadline``, 429
                                                                               ``client_share``
``ray_acare_queue_wait_seconds`` histogram  model                              admission to batch start, per request
``ray_acare_batches_total``      counter    model                              batches run on the model thread
``ray_acare_batch_requests``     histogram  model                              requests per batch
``ray_acare_batch_pairs``        histogram  model                              (query, document) pairs per batch
``ray_acare_batch_tokens``       histogram  model                              tokens per batch (``ScoringJob.tokens``)
``ray_acare_batch_seconds``      histogram  model                              model time per batch (scoring latency)
``ray_acare_batch_fill``         histogram  model                              batch tokens / ``max_batch_tokens``
===============================  =========  =================================  =============================================

Label values come from small fixed sets, never from request text: ``route`` is the app's route
template (``/v1/rerank``; ``other`` for a path the app does not serve), ``status_class``
``2xx`` / ``4xx`` / ``5xx``, ``mode`` ``M0``-``M3`` (``none`` when the request was refused
before its mode was known), ``model`` the served model name, ``reason`` ``deadline`` or
``client_share``.

:class:`ServeMetrics` holds the Ray metrics (build it inside a replica); :class:`RequestMetrics`
is the ASGI middleware that counts requests. Both take any object with :class:`Recorder`'s
methods, so the HTTP app can be built and tested without Ray.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

# Where the routes leave the request's mode for the request counter (``scope["state"]``).
MODE_STATE = "acare_mode"
MODEL_STATE = "acare_model"  # the model that answered (a configured name: bounded)
NO_MODE = "none"
OTHER_ROUTE = "other"
REFUSAL_REASONS = {503: "deadline", 429: "client_share"}

_SECONDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
_POWERS_OF_TWO = tuple(float(2**i) for i in range(0, 13))  # 1 .. 4096
_TOKENS = tuple(float(2**i) for i in range(6, 21))  # 64 .. 1M


@dataclass(frozen=True)
class MetricSpec:
    """One metric: ``name`` as recorded (Ray exports it as ``ray_<name>``, a counter with
    ``_total``), its kind, label keys, description and histogram bucket boundaries."""

    name: str
    kind: str  # counter | histogram
    labels: tuple[str, ...]
    description: str
    boundaries: tuple[float, ...] = ()

    def exported(self) -> tuple[str, ...]:
        """The sample names this metric has in a Prometheus scrape."""
        base = f"ray_{self.name}"
        if self.kind == "counter":
            return (f"{base}_total",)
        if self.kind == "histogram":
            return (f"{base}_bucket", f"{base}_count", f"{base}_sum")
        return (base,)


METRICS: tuple[MetricSpec, ...] = (
    MetricSpec(
        "acare_requests",
        "counter",
        ("route", "status_class", "mode", "model"),
        "HTTP requests answered by the replica's app.",
    ),
    MetricSpec(
        "acare_request_seconds",
        "histogram",
        ("route", "model"),
        "Seconds a request spent in the replica's app.",
        _SECONDS,
    ),
    MetricSpec("acare_documents", "counter", ("mode", "model"), "Documents scored."),
    MetricSpec("acare_tokens", "counter", ("mode", "model"), "Tokens scored (usage)."),
    MetricSpec("acare_truncated", "counter", ("mode", "model"), "Documents cut to fit."),
    MetricSpec(
        "acare_refusals",
        "counter",
        ("reason", "model"),
        "Requests refused by admission: deadline (503) or client_share (429).",
    ),
    MetricSpec(
        "acare_queue_wait_seconds",
        "histogram",
        ("model",),
        "Seconds from admission to the start of the request's batch.",
        _SECONDS,
    ),
    MetricSpec("acare_batches", "counter", ("model",), "Batches run on the model thread."),
    MetricSpec(
        "acare_batch_requests", "histogram", ("model",), "Requests per batch.", _POWERS_OF_TWO
    ),
    MetricSpec(
        "acare_batch_pairs",
        "histogram",
        ("model",),
        "(query, document) pairs per batch.",
        _POWERS_OF_TWO,
    ),
    MetricSpec("acare_batch_tokens", "histogram", ("model",), "Tokens per batch.", _TOKENS),
    MetricSpec(
        "acare_batch_seconds", "histogram", ("model",), "Model seconds per batch.", _SECONDS
    ),
    MetricSpec(
        "acare_batch_fill",
        "histogram",
        ("model",),
        "Batch tokens over max_batch_tokens.",
        (0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0),
    ),
)


# Ray Serve's own metrics the dashboard reads (replica count), not recorded by the app.
SERVE_METRICS = frozenset({"ray_serve_deployment_replica_healthy"})


def exported_names() -> frozenset[str]:
    """Every sample name the app's metrics have in a scrape (``ray_acare_...``)."""
    return frozenset(name for spec in METRICS for name in spec.exported())


@dataclass(frozen=True)
class BatchRecord:
    """One batch run on the model thread, for one model: each request's wait from admission
    to the batch's start (seconds), the (query, document) pairs and tokens it scored, its model
    seconds and its tokens over ``max_batch_tokens``."""

    model: str
    waits: tuple[float, ...]
    pairs: int
    tokens: int
    seconds: float
    fill: float


def status_class(status: int) -> str:
    return f"{status // 100}xx"


class Recorder(Protocol):
    """What the app and the deployment record; :class:`ServeMetrics` is the real one."""

    def request(self, model: str, route: str, status: int, mode: str, seconds: float) -> None: ...

    def scored(
        self, model: str, mode: str, documents: int, tokens: int, truncated: int
    ) -> None: ...

    def refused(self, model: str, status: int) -> None: ...

    def batch(self, record: BatchRecord) -> None: ...


class ServeMetrics:
    """The :data:`METRICS` as ``ray.serve.metrics`` objects; create it inside a replica."""

    def __init__(self) -> None:
        from ray.serve import metrics

        self._m: dict[str, Any] = {}
        for spec in METRICS:
            if spec.kind == "histogram":
                self._m[spec.name] = metrics.Histogram(
                    spec.name, spec.description, list(spec.boundaries), tag_keys=spec.labels
                )
            else:
                self._m[spec.name] = metrics.Counter(
                    spec.name, spec.description, tag_keys=spec.labels
                )

    def request(self, model: str, route: str, status: int, mode: str, seconds: float) -> None:
        tags = {"route": route, "model": model}
        self._m["acare_requests"].inc(
            1, {**tags, "status_class": status_class(status), "mode": mode}
        )
        self._m["acare_request_seconds"].observe(seconds, tags)

    def scored(self, model: str, mode: str, documents: int, tokens: int, truncated: int) -> None:
        tags = {"mode": mode, "model": model}
        self._m["acare_documents"].inc(documents, tags)
        self._m["acare_tokens"].inc(tokens, tags)
        if truncated:
            self._m["acare_truncated"].inc(truncated, tags)

    def refused(self, model: str, status: int) -> None:
        reason = REFUSAL_REASONS.get(status, str(status))
        self._m["acare_refusals"].inc(1, {"reason": reason, "model": model})

    def batch(self, record: BatchRecord) -> None:
        tags = {"model": record.model}
        for wait in record.waits:
            self._m["acare_queue_wait_seconds"].observe(wait, tags)
        self._m["acare_batches"].inc(1, tags)
        self._m["acare_batch_requests"].observe(len(record.waits), tags)
        self._m["acare_batch_pairs"].observe(record.pairs, tags)
        self._m["acare_batch_tokens"].observe(record.tokens, tags)
        self._m["acare_batch_seconds"].observe(record.seconds, tags)
        self._m["acare_batch_fill"].observe(record.fill, tags)


class RequestMetrics:
    """ASGI middleware (outside the auth gate) counting every HTTP request by route template,
    status class and mode, and timing it; a route raising an exception counts as 5xx."""

    def __init__(self, app: Any, recorder: Recorder, model: str, paths: Iterable[str]) -> None:
        self.app = app
        self.recorder = recorder
        self.model = model
        self.paths = frozenset(paths)

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.monotonic()
        status: int | None = None

        async def send_status(message: dict) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            # No response started: the route raised (Starlette answers 500 outside).
            state = scope.get("state", {})
            mode = state.get(MODE_STATE, NO_MODE)
            model = state.get(MODEL_STATE, self.model)
            self.recorder.request(
                model, self._route(scope), status or 500, mode, time.monotonic() - started
            )

    def _route(self, scope: dict) -> str:
        """The matched route's template, else the path when the app serves it (a request
        refused before routing), else ``other``: never a path a client made up."""
        route = getattr(scope.get("route"), "path", None)
        if route in self.paths:
            return route
        path, root = scope.get("path", ""), scope.get("root_path", "")
        if root and path.startswith(root):
            path = path[len(root) :] or "/"
        return path if path in self.paths else OTHER_ROUTE
