"""The rerankers an agent-bench session can call, behind one small protocol.

A reranker gets one search (:class:`RerankRequest`: the sub-query, the agent's original question
and reasoning, the candidates in first-stage order with their first-stage scores) and returns
the indices of its best ``top_n`` candidates, best first. Implementations:

- :class:`FirstStageOrder`: BM25 order (the baseline, ``--reranker none``);
- :class:`OracleReranker`: the step's supporting paragraph first, then BM25 order (tests, and an
  upper bound);
- :class:`ScorerReranker`: an in-process :class:`~acare_ray.scoring.scorer.Scorer` in one mode;
- :class:`EndpointReranker`: any Cohere-compatible ``POST {url}/v2/rerank`` with the ACARe
  fields ``original_question``, ``reasoning`` and ``mode`` as extra body fields.

Both model rerankers take an optional fusion (a fused system, named ``<mode>+<setting>``): in
process, :func:`acare_ray.ranking.fusion.fuse` of the scorer's log-odds with the request's first-stage
scores; at an endpoint, the request's ``first_stage_scores`` and ``fusion`` go in the body and
the server fuses (docs/online.md).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from acare_ray.ranking.fusion import FusionConfig, fuse
from acare_ray.scoring import AgentContext, Scorer


@dataclass(frozen=True)
class RerankRequest:
    """One agent search. ``task_id`` and ``step`` (0-based) identify it (the oracle uses them).

    ``documents`` come in first-stage (BM25) order; ``first_stage_scores`` are their BM25
    scores (empty when unknown: then the order alone is the first stage)."""

    query: str
    question: str
    reasoning: str
    documents: tuple[str, ...]
    doc_ids: tuple[str, ...]
    task_id: str = ""
    step: int = 0
    first_stage_scores: tuple[float, ...] = ()


class AgentReranker(Protocol):
    """What an agent-bench session calls to order one search's candidates (not the Serve
    deployment :class:`acare_ray.online.deployment.Reranker`)."""

    name: str

    def rerank(self, request: RerankRequest, top_n: int) -> list[int]:
        """Indices into ``request.documents`` of the best ``top_n`` (or fewer), best first."""
        ...


def rerank_counted(
    reranker: AgentReranker, request: RerankRequest, top_n: int
) -> tuple[list[int], int]:
    """``(indices, tokens scored)``: a reranker that runs a model says what it scored through
    its own ``rerank_counted``; one that has none (BM25 order, the oracle) scored 0 tokens."""
    counted = getattr(reranker, "rerank_counted", None)
    if counted is None:
        return reranker.rerank(request, top_n), 0
    return counted(request, top_n)


def check_order(order: Sequence[int], n_documents: int, top_n: int, who: str) -> list[int]:
    """``order`` as ints, or ValueError when it repeats, leaves range or exceeds ``top_n``."""
    out = [int(i) for i in order]
    if len(set(out)) != len(out) or any(not 0 <= i < n_documents for i in out):
        raise ValueError(f"{who} returned invalid indices {out} for {n_documents} documents")
    if len(out) > top_n:
        raise ValueError(f"{who} returned {len(out)} results, more than top_n={top_n}")
    return out


class FirstStageOrder:
    """No reranking: the first-stage (BM25) order."""

    name = "bm25"

    def rerank(self, request: RerankRequest, top_n: int) -> list[int]:
        return list(range(min(top_n, len(request.documents))))


class OracleReranker:
    """The step's supporting paragraph first (when it is a candidate), then BM25 order."""

    name = "oracle"

    def __init__(self, gold: Mapping[tuple[str, int], str]) -> None:
        self.gold = dict(gold)  # (task_id, step) -> canonical doc id

    def rerank(self, request: RerankRequest, top_n: int) -> list[int]:
        target = self.gold.get((request.task_id, request.step))
        first = [i for i, d in enumerate(request.doc_ids) if d == target]
        rest = [i for i in range(len(request.documents)) if i not in first]
        return (first + rest)[:top_n]


class ScorerReranker:
    """An in-process :class:`~acare_ray.scoring.scorer.Scorer` in ``mode`` (M0..M3 or auto); with an
    enabled ``fusion``, its log-odds fused with the request's first stage (name
    ``<mode>+<fusion label>``).

    Calls are serialised by ``lock`` (one model, and Hugging Face tokenizers are not safe to
    share between threads); each search is scored alone, so scores do not depend on which other
    sessions are in flight. Share one lock between rerankers that share a scorer.
    """

    def __init__(
        self,
        scorer: Scorer,
        mode: str = "auto",
        lock: threading.Lock | None = None,
        fusion: FusionConfig | None = None,
    ):
        self.scorer = scorer
        self.mode = mode
        self.fusion = fusion if fusion is not None and fusion.enabled else None
        self.name = f"{mode}+{self.fusion.label}" if self.fusion else mode
        self.lock = lock or threading.Lock()

    def rerank(self, request: RerankRequest, top_n: int) -> list[int]:
        return self.rerank_counted(request, top_n)[0]

    def rerank_counted(self, request: RerankRequest, top_n: int) -> tuple[list[int], int]:
        """The ranking and the prompt tokens the scorer ran for it (its ``stats.real_tokens``)."""
        if not request.documents:
            return [], 0
        context = AgentContext(
            sub_query=request.query, question=request.question, reasoning=request.reasoning
        )
        with self.lock:
            stats = getattr(self.scorer, "stats", None)
            before = stats.real_tokens if stats is not None else 0
            if self.fusion is None:
                ranking = self.scorer.rank(context, list(request.documents), self.mode, top_k=top_n)
                indices = ranking.indices
            else:
                scores = self.scorer.score(context, list(request.documents), self.mode)
            tokens = (stats.real_tokens - before) if stats is not None else 0
        if self.fusion is not None:
            first_stage = list(request.first_stage_scores) or None
            indices = fuse(scores, self.fusion, first_stage).order[:top_n]
        return [int(i) for i in indices], int(tokens)


def fusion_setting(text: str | None) -> str | None:
    """A fused system's setting: ``auto`` kept (the endpoint's fitted one), another setting as
    its canonical label, None for no fusion (``None``, ``none``, or a setting that is none)."""
    if text is None or text.strip() == "none":
        return None
    if text.strip() == "auto":
        return "auto"
    config = FusionConfig.parse(text)
    return config.label if config.enabled else None


class EndpointError(RuntimeError):
    """The endpoint refused a search or kept failing."""


class EndpointReranker:
    """``POST {url}/v2/rerank`` (Cohere v2 body + ``original_question``, ``reasoning``, ``mode``)
    through :class:`acare_ray.clients.http_client.AcareClient`.

    With ``fusion`` (a setting's text form, or ``auto`` for the server's fitted one) the body
    also carries the request's ``first_stage_scores`` (or ``first_stage_order: true`` when it
    has none) and ``fusion``, and the system is named ``<mode>+<fusion>``.

    503 and 429 answers (an overloaded server asking to come back later) are retried after
    their ``Retry-After`` (default 1 s) for as long as ``retry_budget_s`` allows, counted from
    the search's first attempt, as an agent harness waits on a busy service; connection errors
    and 500/502/408 answers (a replica that died holding the request) are retried after 1 s, at
    most ``retries`` times. Any other error status, or a search still
    refused when its budget runs out, raises :class:`EndpointError` with the body. ``refused``
    counts the 503/429 answers received. One client is shared by all threads.
    """

    def __init__(
        self,
        url: str,
        mode: str = "auto",
        model: str = "acare",
        api_key: str | None = None,
        timeout_s: float = 120.0,
        retries: int = 5,
        retry_budget_s: float = 600.0,
        fusion: str | None = None,
    ) -> None:
        from acare_ray.clients.http_client import AcareClient

        self.client = AcareClient(
            url, api_key, timeout_s=timeout_s, retries=retries, retry_budget_s=retry_budget_s
        )
        self.url = self.client.base_url + "/v2/rerank"
        self.mode = mode
        self.fusion = fusion_setting(fusion)
        self.name = f"{mode}+{self.fusion}" if self.fusion else mode
        self.model = model

    @property
    def refused(self) -> int:
        return self.client.refused

    @property
    def server_errors(self) -> int:
        """500/502/408 answers resent (a replica that died holding the search)."""
        return self.client.server_errors

    def body(self, request: RerankRequest, top_n: int) -> dict[str, Any]:
        from acare_ray.clients.http_client import rerank_body

        return rerank_body(
            request.query,
            list(request.documents),
            original_question=request.question,
            reasoning=request.reasoning,
            mode=self.mode,
            top_n=top_n,
            model=self.model,
        ) | (self.first_stage(request) if self.fusion else {})

    def first_stage(self, request: RerankRequest) -> dict[str, Any]:
        """The fusion fields of a fused system's body."""
        if request.first_stage_scores:
            first: dict[str, Any] = {"first_stage_scores": list(request.first_stage_scores)}
        else:
            first = {"first_stage_order": True}
        return first | {"fusion": self.fusion}

    def rerank(self, request: RerankRequest, top_n: int) -> list[int]:
        return self.rerank_counted(request, top_n)[0]

    def rerank_counted(self, request: RerankRequest, top_n: int) -> tuple[list[int], int]:
        """The ranking and the tokens the endpoint reports (``meta.tokens.input_tokens``; 0 when
        it reports none)."""
        from acare_ray.clients.http_client import AcareError, parse_rerank

        if not request.documents:
            return [], 0
        try:
            answer = parse_rerank(
                self.client.request(
                    "POST", "/v2/rerank", self.body(request, top_n), idempotent=True
                )
            )
        except AcareError as err:
            raise EndpointError(str(err)) from err
        return [hit.index for hit in answer.hits], answer.tokens

    def close(self) -> None:
        self.client.close()
