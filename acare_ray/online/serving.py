"""The serving object every rerank route calls: one request, one way through.

:class:`RerankServing` takes a request already parsed into a :class:`RerankInput` through

    model name -> prepare -> score -> fuse -> relevance

and answers one :class:`RerankOutcome`, the only result type between the scorer's
:class:`~acare_ray.scoring.ScoredSearch` and a protocol's response
(:mod:`acare_ray.online.protocols`). Each step happens here once per request:

- the model is picked once (the body's ``model``, else the routing header, else the default);
- :meth:`RerankService.prepare <acare_ray.online.service.RerankService.prepare>` resolves the
  mode and tokenizes the context once (the scorer reuses those ids), and checks the documents;
- the model's own ``score`` (the replica's batcher, or :func:`inline_score`) scores the job;
- the request's first stage, if any, is fused with the log-odds (:class:`Fusable`);
- the 0..1 relevance follows one rule on every route: the checkpoint's calibration for the
  mode where it has one, else sigmoid, or the log-odds themselves when the request asks for
  raw values. :meth:`RerankOutcome.headers` says which (``x-acare-relevance``) as the body does.

What a response says about the request beside its results (model, version, mode, cut fields,
truncated documents, tokens, batch, relevance, fusion) comes from :meth:`RerankOutcome.headers`, so
every route answers the same headers.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Protocol

import numpy as np
from starlette.requests import Request

from acare_ray.online.fusion_fields import FusedScores
from acare_ray.online.metrics import MODE_STATE, MODEL_STATE, Recorder
from acare_ray.online.models import ModelRouter, Served, header_model
from acare_ray.online.service import RerankInput, RerankService, ScoringJob, scoring_refusal
from acare_ray.ranking.fusion import FusionConfig
from acare_ray.scoring import Mode, ScoredSearch, rank_order

# Header values behind common ingresses must stay well below their 4-8 KB header limits.
MAX_TRUNCATED_LISTED = 100
# Where the Gate leaves the client's identity for the routes (admission's fair share).
CLIENT_STATE = "acare_client"


def client_of(request: Request) -> str:
    """The client identity the gate found for ``request`` (admission, sessions)."""
    return request.scope.get("state", {}).get(CLIENT_STATE, "anonymous")


class Fusable(Protocol):
    """A request's first stage: what fusing the served log-odds with it gives (None: the
    request has none, and is answered by log-odds alone)."""

    def fused(self, scores: np.ndarray, fitted: FusionConfig | None) -> FusedScores | None:
        """``scores``: log-odds in input order; ``fitted``: the answering checkpoint's setting."""


@dataclass(frozen=True)
class RerankOutcome:
    """One request reranked: what every protocol's response is made from.

    ``scores``: log-odds, input order; ``values``: what each document answers (0..1 relevance
    or raw log-odds), made as ``relevance`` says (``calibrated``, ``sigmoid``, ``raw``);
    ``fused``: the fusion with the request's first stage (None without one); ``tokens``: what
    the model computed (the usage answered); ``truncated``: indices of documents cut to
    ``limit`` tokens; ``cut_fields``: the request fields cut to their caps, each with its cap;
    ``batch_requests``: how many requests the batch that scored it held."""

    model: str
    mode: Mode
    scores: np.ndarray
    values: np.ndarray
    relevance: str
    tokens: int = 0
    fused: FusedScores | None = None
    limit: int = 0
    truncated: tuple[int, ...] = ()
    cut_fields: tuple[tuple[str, int], ...] = ()
    version: str | None = None
    named: bool = False
    batch_requests: int | None = None

    def order(self, top_n: int | None = None) -> np.ndarray:
        """Document indices best first: the fused order where fused, else by log-odds with
        equal scores in input order; the first ``top_n`` (all when None)."""
        return rank_order(self.scores, top_n) if self.fused is None else self.fused.top(top_n)

    def truncation_warnings(self, field: str) -> list[str] | None:
        """Which documents (called ``field`` by the request) and context fields were cut, so
        truncation is never silent; None when nothing was."""
        warnings = [f"{name} cut to its cap of {cap} tokens" for name, cap in self.cut_fields]
        if self.truncated:
            listed = ", ".join(f"{field}[{i}]" for i in self.truncated[:20])
            more = len(self.truncated) - 20
            warnings.append(
                f"truncated to {self.limit} tokens: {listed}"
                + (f" and {more} more" if more > 0 else "")
            )
        return warnings or None

    def headers(self) -> dict[str, str]:
        """What the response says about the request beside its body (every route the same)."""
        out = {"x-acare-mode": self.mode.value, "x-acare-tokens": str(self.tokens)}
        if self.named:  # a catalog of several models names the one that answered
            out["x-acare-model"] = self.model
        if self.version is not None:  # every deployment: which checkpoint answered
            out["x-acare-model-version"] = self.version
        if self.cut_fields:  # the query or its context cut to a cap: said, never silent
            out["x-acare-cut-fields"] = ",".join(name for name, _ in self.cut_fields)
        if self.truncated:
            listed = ",".join(map(str, self.truncated[:MAX_TRUNCATED_LISTED]))
            more = len(self.truncated) - MAX_TRUNCATED_LISTED
            out["x-acare-truncated"] = listed + (f",+{more}" if more > 0 else "")
            out["x-acare-truncated-count"] = str(len(self.truncated))
        if self.batch_requests is not None:
            out["x-acare-batch-requests"] = str(self.batch_requests)
        out["x-acare-relevance"] = self.relevance
        if self.fused is not None:
            out["x-acare-fusion"] = self.fused.config.label
        return out


def merge_outcomes(parts: Sequence[RerankOutcome], rows: Sequence[Sequence[int]]) -> RerankOutcome:
    """One :class:`RerankOutcome` of several scored on the same model with the same context fields
    (vLLM's pairs, grouped by query): ``rows[k]`` are the input positions of ``parts[k]``'s
    documents. Tokens add up; truncation is said at the input positions; nothing is fused."""
    count = sum(len(r) for r in rows)
    scores = np.empty(count, dtype=np.float64)
    values = np.empty(count, dtype=np.float64)
    truncated: list[int] = []
    cut: dict[str, int] = {}
    for part, at in zip(parts, rows):
        scores[list(at)] = part.scores
        values[list(at)] = part.values
        truncated += [at[i] for i in part.truncated]
        cut.update(part.cut_fields)
    batches = [p.batch_requests for p in parts if p.batch_requests is not None]
    return replace(
        parts[0],
        scores=scores,
        values=values,
        tokens=sum(p.tokens for p in parts),
        fused=None,
        truncated=tuple(sorted(truncated)),
        cut_fields=tuple(cut.items()),
        batch_requests=max(batches) if batches else None,
    )


def relevance_values(
    service: RerankService, scores: np.ndarray, mode: Mode, raw: bool = False
) -> tuple[np.ndarray, str]:
    """The one relevance rule: the model's 0..1 relevance of ``scores`` (calibrated for
    ``mode`` where the checkpoint has a calibration, else sigmoid), or the log-odds themselves
    when ``raw``; with how they were made (``calibrated``, ``sigmoid``, ``raw``)."""
    if raw:
        return np.asarray(scores, dtype=np.float64), "raw"
    values, calibrated = service.relevance(scores, mode)
    return values, "calibrated" if calibrated else "sigmoid"


def inline_score(service: RerankService):
    """A model's ``score`` without batching or admission (the MCP server's app; tests): each
    job scored alone on a worker thread; a job the service answers with an error raises it."""

    async def score(job: ScoringJob, client: str) -> ScoredSearch:
        (out,) = await asyncio.to_thread(service.score, [job])
        if isinstance(out, Exception):
            raise out
        return out

    return score


@dataclass(frozen=True)
class RerankServing:
    """The serving object of an app: ``models`` (which model answers, loaded while it does)
    and ``metrics`` (what was scored, when the app records it); see the module docstring."""

    models: ModelRouter
    metrics: Recorder | None = None

    @property
    def default(self) -> str:
        """The model a request answers on when it names none."""
        return self.models.catalog.default

    def model_for(self, body_model: str | None, request: Request) -> str:
        """The model a request names: its body's ``model``, else its routing header (the two
        must agree), else the default; :class:`ClientError` (404 listing the names) if unknown."""
        return self.models.catalog.name_for(body_model, header_model(request.headers))

    async def rerank(
        self,
        search: RerankInput,
        request: Request,
        *,
        model: str | None = None,
        first_stage: Fusable | None = None,
        raw: bool = False,
    ) -> RerankOutcome:
        """``search`` reranked on ``model`` (default: :attr:`default`), fused with
        ``first_stage`` and given its relevance (``raw``: the log-odds); the model stays
        loaded until the request is answered (its tokenizer prepared the job)."""
        async with self.models.use(model or self.default) as served:
            return await self._rerank(served, search, request, first_stage, raw)

    async def _rerank(
        self,
        served: Served,
        search: RerankInput,
        request: Request,
        first_stage: Fusable | None,
        raw: bool,
    ) -> RerankOutcome:
        service = served.service
        job = await asyncio.to_thread(service.prepare, search)
        state = request.scope.setdefault("state", {})
        state[MODE_STATE], state[MODEL_STATE] = job.mode.value, served.name
        scored = await self._score(served, job, search, request)
        values, made = relevance_values(service, scored.scores, job.mode, raw)
        return RerankOutcome(
            model=served.name,
            mode=job.mode,
            scores=scored.scores,
            values=values,
            relevance=made,
            tokens=scored.tokens,
            fused=None
            if first_stage is None
            else first_stage.fused(scored.scores, served.fitted_fusion),
            limit=job.limit,
            truncated=job.truncated,
            cut_fields=job.cut_fields,
            version=served.version,
            named=self.models.catalog.strict,
            batch_requests=scored.batch if job.documents else None,
        )

    async def _score(
        self, served: Served, job: ScoringJob, search: RerankInput, request: Request
    ) -> ScoredSearch:
        if not job.documents:
            return ScoredSearch(np.empty(0, dtype=np.float32), 0)
        if served.score is None:
            raise RuntimeError(f"model {served.name!r} has no way to score")
        try:
            scored = await served.score(job, client_of(request))
        except ValueError as err:  # the scorer refused the job: the client's field, as sent
            raise scoring_refusal(search, err) from None
        if self.metrics is not None:
            self.metrics.scored(
                served.name, job.mode.value, len(job.documents), scored.tokens, len(job.truncated)
            )
        return scored
