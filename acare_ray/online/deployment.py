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
- Health: a checkpoint with golden cases (``golden.json``, :mod:`acare_ray.scoring.golden`) must
  score them as recorded when it loads, or the replica never starts; ``check_health`` scores
  them again (a model without them: one tiny pair) on the model thread; Serve restarts a
  replica whose check fails, and ``/health`` says down meanwhile.
- Auth: the keys come from ``api_key_env`` (comma or newline separated, whitespace stripped);
  a replica with no key refuses to start unless ``allow_unauthenticated`` is true.
- Several models: ``models`` names checkpoints (a base model, fine-tuned ones); a request picks
  one by name (:mod:`acare_ray.online.models`). Each replica loads them on demand with Serve's
  model multiplexing, at most ``max_resident_models`` at a time (least recently used unloaded
  first, once no request holds it); the default model is loaded when the replica starts. A
  batch may hold requests for several models; it scores each model's requests apart.

Run it with ``acare serve --config serve_configs/local.yaml``, or with the Serve CLI:
``serve run acare_ray.online.deployment:build_app model=PATH`` / ``serve run
serve_configs/gpu.yaml`` / ``serve deploy ...``. ``serve build acare_ray.online.deployment:app``
writes a config for the default model.
"""

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

from ray import serve
from ray.serve import Application

from acare_ray.online.admission import Admission, Overloaded
from acare_ray.online.app_args import (
    DEFAULT_BATCH_WAIT_TIMEOUT_S,
    DEFAULT_MAX_BATCH_SIZE,
    AppArgs,
    ReplicaSettings,
)
from acare_ray.online.autoscaling import REFUSED, WAIT_SHARE_METRIC
from acare_ray.online.batch_queue import BatchStats, Pending, batch_slots
from acare_ray.online.errors import ClientError
from acare_ray.online.http import create_api
from acare_ray.online.metrics import BatchRecord, ServeMetrics
from acare_ray.online.models import (
    Served,
    checkpoint_version,
)
from acare_ray.online.replica_models import ModelSlot, ReplicaModels
from acare_ray.online.service import Limits, RerankService, ScoringJob
from acare_ray.scoring import Cancelled, ScoredSearch, Scorer
from acare_ray.scoring.golden import read_golden

logger = logging.getLogger(__name__)


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
        from acare_ray.ranking.checkpoint_settings import read_calibration, read_fusion

        config = AppArgs.model_validate(args)
        self.api_keys = config.api_keys()  # before loading: no key, no replica
        catalog = config.catalog()
        # What `fusion: auto` means for each model: the setting fitted for its checkpoint, read
        # once (a bad stored setting stops the replica before any model loads).
        fitted = {name: read_fusion(source.model) for name, source in catalog.sources.items()}
        self.search_routes = _search_routes(config, sessions, max_documents=config.max_documents)
        self.limits = Limits(
            max_documents=config.max_documents,
            max_body_bytes=config.max_body_bytes,
            auto_truncate=config.auto_truncate,
            max_request_tokens=config.max_request_tokens,
            body_read_timeout_s=config.body_read_timeout_s,
        )

        def build(name: str) -> Served:
            source = catalog.sources[name]
            scorer = Scorer.from_settings(source.model, config.scorer, source.revision)
            # A checkpoint with golden cases must score them as recorded, or never serve; its
            # calibration (per mode) makes the 0..1 relevance a probability.
            service = RerankService(
                scorer,
                name,
                self.limits,
                read_golden(source.model),
                read_calibration(source.model),
            )
            # x-acare-model-version on every deployment, so a rollout's switch is visible;
            # a one-model deployment's bodies and /v1/models card stay as they were.
            version = checkpoint_version(source)
            return Served(name, service, fitted[name], version, source=source)

        # The default model loads now: a replica that cannot load it never starts.
        default = build(catalog.default)
        # Until the start's reconfigure: the model admission's first measurement runs on.
        self._starting_service: RerankService | None = default.service
        self.models = ReplicaModels(
            catalog,
            build,
            config.max_resident_models,
            default,
            scorer_for=lambda slot: lambda job, client: self.score(job, client, slot),
        )
        self._batch_lock = asyncio.Lock()
        self.settings = ReplicaSettings()
        self.stats = BatchStats()
        self.metrics = ServeMetrics()
        self._healthy = True
        self.admission = Admission(
            self.settings.admission_deadline_s,
            self.settings.admission_prior_tokens_per_s,
            client_share=self.settings.client_share,
        )
        self._autoscaling_report = (time.monotonic(), 0)
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
        service, self._starting_service = self._starting_service, None
        if service is not None and settings.admission_measure_at_start:
            # Serve reconfigures a replica before it turns ready: it starts from its own
            # measured throughput, not the prior (which errs low: a replica that was just added
            # would refuse work it can do until its first real batch).
            try:
                tokens, seconds = service.measure_throughput()
            except ClientError as err:  # limits too tight for one document: keep the prior
                logger.warning("admission keeps its prior: no request to measure (%s)", err)
            else:
                self.admission.batch_finished(tokens, seconds)

    def __serve_build_asgi_app__(self):
        return create_api(self)  # the routes call this replica (http.Replica)

    def healthy(self) -> bool:
        """Whether ``/health`` answers ok: the last health check passed."""
        return self._healthy

    def add_routes(self, api: Any, serving: Any) -> None:
        """``/v1/search`` and ``/v1/sessions`` on the default model (when configured)."""
        if self.search_routes is not None:
            self.search_routes(api, serving)

    async def check_health(self) -> None:
        """Serve's health check: one tiny forward pass on the model thread (after the running
        batch); raises, so Serve replaces the replica, if the model cannot score."""
        loop = asyncio.get_running_loop()
        slot = self.models.any_resident()
        if slot is None:  # between unloading one model and loading the next: nothing to probe
            return
        slot.hold()
        try:
            assert slot.served is not None
            await loop.run_in_executor(self.executor, slot.served.service.probe)
        except Exception:
            self._healthy = False
            raise
        finally:
            slot.drop()
        self._healthy = True

    def record_autoscaling_stats(self) -> dict[str, float]:
        """What this replica tells the autoscaling policy (:mod:`acare_ray.online.autoscaling`):
        admission refusals per second since the last report, and the expected wait for new work
        as a share of the admission deadline. Serve calls it every ``metrics_interval_s``."""
        now = time.monotonic()
        refused = self.admission.refused
        last_time, last_refused = self._autoscaling_report
        self._autoscaling_report = (now, refused)
        rate = (refused - last_refused) / max(now - last_time, 1e-3)
        deadline = self.admission.deadline_s
        wait = self.admission.expected_wait_s() / deadline if deadline > 0 else 0.0
        return {REFUSED: rate, WAIT_SHARE_METRIC: wait}

    def status(self) -> dict[str, Any]:
        context = serve.get_replica_context()
        return {
            "replica": context.replica_id.unique_id if context else None,
            "batching": self.settings.batching(),
            "request_deadline_s": self.settings.request_deadline_s,
            "batches": vars(self.stats).copy(),
            "admission": self.admission.snapshot(),
            "models": self.models.snapshot(),
        }

    def screen(self, client: str | None = None) -> Overloaded | None:
        """Refuse a rerank request before reading it while the replica is over its deadline or
        its client already holds its whole share (429)."""
        decision = self.admission.screen(client)
        if decision.admitted:
            return None
        refusal = decision.refusal(self.admission.deadline_s)
        # Refused before the body (and its model field) is read: counted under the default.
        self.metrics.refused(self.models.catalog.default, refusal.status)
        return refusal

    def _release(self, pending: Pending) -> None:
        if not pending.released:
            pending.released = True
            self.admission.done(pending.job.bound, pending.client)
            if pending.model is not None:
                pending.model.drop()

    async def score(self, job: ScoringJob, client: str, model: ModelSlot) -> ScoredSearch:
        """Score ``job`` (prepared by ``model``'s tokenizer) with ``model``; the model stays
        loaded until the batch holding the job has really stopped."""
        decision = self.admission.admit(job.bound, client)
        if not decision.admitted:
            refusal = decision.refusal(self.admission.deadline_s)
            self.metrics.refused(model.name, refusal.status)
            raise refusal
        slot = self.settings.max_batch_tokens / self.settings.max_batch_size
        model.hold()
        pending = Pending(job, slot, client, model=model)
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
        if isinstance(result, Exception):
            raise result
        return result

    @serve.batch(
        max_batch_size=DEFAULT_MAX_BATCH_SIZE,
        batch_wait_timeout_s=DEFAULT_BATCH_WAIT_TIMEOUT_S,
        batch_size_fn=batch_slots,
    )
    async def _score_batch(self, items: list[Pending]) -> list[Any]:
        # Serve splits a batch by the serve_multiplexed_model_id header and runs the parts
        # concurrently; admission measures one batch at a time on the one model thread, so
        # the parts take turns.
        async with self._batch_lock:
            return await self._score_batch_now(items)

    async def _score_batch_now(self, items: list[Pending]) -> list[Any]:
        loop = asyncio.get_running_loop()
        live = [item for item in items if not item.cancelled.is_set()]
        for item in items:
            item.started = True
        for item in items:
            if item.cancelled.is_set():  # cancelled while queued: no work to do
                self._release(item)
        # Batches never mix models: one batch queue per replica, its requests grouped by the
        # loaded model they were prepared for and each group scored apart. Not one queue per
        # model: their batches would compete for the one model thread, and admission would
        # measure the waiting as model time. A request names its model in the body, so the
        # proxy cannot split by model unless the header is sent too.
        groups: dict[int, list[Pending]] = {}
        for item in live:
            groups.setdefault(id(item.model), []).append(item)
        tokens = sum(item.job.bound for item in live)
        started = time.monotonic()
        self.admission.batch_started(tokens, started)

        def score_groups() -> dict[int, Any]:
            """On the model thread: each model's requests in one scorer call of their own."""
            out: dict[int, Any] = {}
            for group in groups.values():
                model = group[0].model
                assert model is not None and model.served is not None  # held until released

                def cancel(group: list[Pending] = group) -> bool:
                    return all(item.cancelled.is_set() for item in group)

                try:
                    scored = model.served.service.score([item.job for item in group], cancel)
                except Exception as err:  # Cancelled included: only this group stops
                    scored = [err] * len(group)
                out.update({id(item): r for item, r in zip(group, scored)})
            return out

        try:
            by_item = await loop.run_in_executor(self.executor, score_groups)
        except Exception as err:
            by_item = {id(item): err for item in live}
        finally:
            # The model thread has stopped: only now is this batch's work off the replica.
            for item in live:
                self._release(item)
        outcomes = list(by_item.values())
        if any(isinstance(r, Cancelled) for r in outcomes):
            self.stats.cancelled += 1
        # A batch that failed (or was cancelled) measured no throughput.
        failed = all(isinstance(r, Exception) for r in outcomes)
        seconds = time.monotonic() - started
        self.admission.batch_finished(0 if failed else tokens, seconds)
        for group in groups.values():  # one batch record per model it held
            jobs = [item.job for item in group]
            group_tokens = sum(job.tokens for job in jobs)
            self.metrics.batch(
                BatchRecord(
                    model=group[0].model.name,
                    waits=tuple(started - item.enqueued for item in group),
                    pairs=sum(len(job.documents) for job in jobs),
                    tokens=group_tokens,
                    seconds=seconds,
                    fill=group_tokens / self.settings.max_batch_tokens,
                )
            )
        self.stats.record(len(items))
        results = [by_item.get(id(item), Cancelled("cancelled before scoring")) for item in items]
        return [r if isinstance(r, Exception) else replace(r, batch=len(items)) for r in results]


def _search_routes(config: AppArgs, sessions: Any, max_documents: int):
    """The ``/v1/search`` routes when ``search`` is configured (else None)."""
    if config.search is None:
        return None
    from acare_ray.online.search_routes import HandleSessions, SearchSettings, search_routes
    from acare_ray.online.serving import client_of

    settings = SearchSettings.model_validate(config.search)
    context = serve.get_replica_context()
    return search_routes(
        settings.first_stage(),
        HandleSessions(sessions),
        settings,
        max_documents=max_documents,
        client_of=client_of,
        replica=context.replica_id.unique_id if context else None,
    )


def build_app(args: AppArgs) -> Application:
    """Application builder for ``serve run`` / ``serve deploy`` / a Serve config's ``args``;
    with ``search`` set, the app also holds its :class:`~acare_ray.online.session_store.SessionStore`."""
    if not isinstance(args, AppArgs):
        args = AppArgs.model_validate(args or {})
    if args.search is None:
        return Reranker.bind(args.model_dump())
    from acare_ray.online.search_routes import SearchSettings
    from acare_ray.online.session_store import SessionStore

    limits = SearchSettings.model_validate(args.search).session_limits()
    return Reranker.bind(args.model_dump(), SessionStore.bind(vars(limits).copy()))


# ``serve build`` / ``serve run acare_ray.online.deployment:app``: local, unauthenticated.
app = build_app(AppArgs(allow_unauthenticated=True))
