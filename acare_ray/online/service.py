"""The online reranker's work, independent of HTTP and of Ray.

Every endpoint shape (Cohere v1/v2, TEI) converts its body to a :class:`RerankInput`;
:meth:`RerankService.prepare` validates it against the model (fields, mode, limits, document
truncation, token cost) and returns a :class:`ScoringJob`; :meth:`RerankService.score` scores
any number of jobs in one :meth:`Scorer.score_many` call (each job's prefix shared by its own
documents). Scores are the scorer's raw log-odds (see :mod:`acare_ray.scoring.scorer`);
:meth:`RerankService.relevance` turns them into the 0..1 relevance the APIs answer (the
checkpoint's calibration for the mode, else sigmoid).

Client mistakes raise :class:`ClientError` with the HTTP status and the request field at fault;
a :class:`ValueError` the scorer raises later is turned into one by :func:`scoring_refusal`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from scipy.special import expit

from acare_ray.online.errors import ClientError
from acare_ray.scoring import (
    AUTO,
    AgentContext,
    CancelFn,
    FieldError,
    Mode,
    ScoredSearch,
    Scorer,
    TokenLayout,
    parse_mode,
    score_resolved_isolated,
)
from acare_ray.scoring.golden import GoldenCase, verify
from acare_ray.scoring.untrusted import Document, TokenizedDocument

if TYPE_CHECKING:
    from acare_ray.ranking.calibration import Calibration

# The scoring core names a search's inputs as AgentContext does; a request as its endpoint does.
_REQUEST_FIELD = {
    "sub_query": "query",
    "question": "original_question",
    "reasoning": "reasoning",
    "instruction": "instruction",
}


def scoring_refusal(search: RerankInput, err: ValueError) -> ClientError:
    """The 422 for a :class:`ValueError` the scorer raised on ``search``'s job, naming the
    request field at fault the way the client sent it (``texts[1]`` on TEI where the core says
    ``documents[1]``, ``query`` where it says ``sub_query``), read from the core's
    :class:`~acare_ray.scoring.FieldError`; an error that names no field is put on the
    documents."""
    if not isinstance(err, FieldError):
        return ClientError(422, search.documents_field, str(err))
    if err.field == "context":  # the prompt beside the documents: the query and its context
        return ClientError(422, "query", f"with its context: {err.detail}")
    if err.field == "documents":
        index = "" if err.index is None else f"[{err.index}]"
        return ClientError(422, search.documents_field + index, err.detail)
    return ClientError(422, _REQUEST_FIELD.get(err.field, err.field), err.detail)


@dataclass(frozen=True)
class Limits:
    """Per-request limits. ``auto_truncate``: cut documents that do not fit (else refuse, 413).

    ``max_request_tokens``: the most tokens one request may cost by its upper bound
    (:meth:`RerankService.token_bound`, known before anything is tokenized); more is a 413.
    ``body_read_timeout_s``: the time a client gets to send a whole request body (else 408).
    """

    max_documents: int = 1000
    max_body_bytes: int = 16 * 2**20
    auto_truncate: bool = True
    max_request_tokens: int = 1_048_576
    body_read_timeout_s: float = 30.0


@dataclass(frozen=True)
class RerankInput:
    """One rerank request in transport-neutral form.

    ``truncate``: ``None`` follows the server's ``auto_truncate``; ``False`` refuses documents
    longer than the model's room (413). ``keep_end`` truncates from the left (keeps the end).
    ``documents_field`` is the caller's name for the documents (``texts`` on TEI), used in errors.
    ``instruction`` replaces the prompt's ``<Instruct>:`` line (causal backend; None: default).
    """

    query: str
    documents: Sequence[str]
    original_question: str | None = None
    reasoning: str | None = None
    mode: str = AUTO
    max_tokens_per_doc: int | None = None
    truncate: bool | None = None
    keep_end: bool = False
    documents_field: str = "documents"
    instruction: str | None = None


@dataclass(frozen=True)
class ScoringJob:
    """A validated request: the context restricted to ``mode``'s fields and documents as scored.

    ``tokens`` is about what the model will compute for it (the unit of the batch scheduler and
    of admission: exact for the prompt prefix and for documents long enough to be tokenized
    here, estimated from bytes for the others, see :mod:`acare_ray.scoring.tokens`);
    ``context_tokens`` the exact size of the prompt part beside the documents; ``limit`` the
    per-document token limit applied; ``truncated`` the indices of documents cut to it.
    ``bound`` is an upper bound of ``tokens`` computed before any tokenization
    (:meth:`RerankService.token_bound`): what admission and the per-request cap count.
    ``cut_fields``: the request fields (``query``, ``original_question``, ``reasoning``) their
    token caps cut, each with its cap, for the response to say so. ``tokenized``: per document,
    the ids ``prepare`` made for it (None where it made none, or cut the document), which the
    scorer uses instead of tokenizing it again (:meth:`scored_documents`).
    """

    context: AgentContext
    mode: Mode
    documents: tuple[str, ...]
    tokens: int = 0
    limit: int = 0
    truncated: tuple[int, ...] = field(default=())
    context_tokens: int = 0
    bound: int = 0
    cut_fields: tuple[tuple[str, int], ...] = field(default=())
    tokenized: tuple[TokenizedDocument | None, ...] = field(default=())

    def scored_documents(self) -> list[Document]:
        """The documents as the scorer gets them: each with the ids ``prepare`` made for it,
        if it made them (:attr:`tokenized`), so it is not tokenized again."""
        made = self.tokenized or (None,) * len(self.documents)
        return [t if t is not None else doc for doc, t in zip(self.documents, made)]


def _check_encodable(field: str, text: str | None) -> None:
    """Tokenizers need valid Unicode; JSON can smuggle in lone surrogates (``"\\ud800"``)."""
    if text is None:
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise ClientError(422, field, f"is not valid Unicode ({err.reason})") from None


class RerankService:
    """Holds a loaded :class:`Scorer` and the limits; see the module docstring."""

    def __init__(
        self,
        scorer: Scorer,
        model_name: str,
        limits: Limits | None = None,
        golden: Sequence[GoldenCase] | None = None,
        calibration: Mapping[str, Calibration] | None = None,
    ) -> None:
        self.scorer = scorer
        self.model_name = model_name
        self.limits = limits or Limits()
        # Per mode, the checkpoint's relevance calibration (acare_ray.ranking.calibration); a mode
        # without one answers sigmoid(log-odds).
        self.calibration = dict(calibration or {})
        # The checkpoint's golden cases (acare_ray.scoring.golden): checked now, so a model that
        # does not score as it was saved never serves, and again in every health probe.
        self.golden = list(golden or ())
        if self.golden:
            verify(scorer, self.golden, model_name)
        self.layout = TokenLayout(scorer)
        self._lead_bytes = len(self.layout.lead.encode("utf-8"))
        # The prompt's own tokens per mode (template, instruction, field labels), measured once
        # with one-character fields; a request's context is at most these plus its field bytes.
        probe = AgentContext("x", question="x", reasoning="x")
        self._template_tokens = {
            mode: self.layout.context_tokens(probe.for_mode(mode), mode) for mode in Mode
        }

    def token_bound(self, search: RerankInput, mode: Mode) -> int:
        """An upper bound of the tokens ``search`` costs, from byte lengths alone.

        A token covers at least one UTF-8 byte (byte-level BPE) or one character (WordPiece),
        so a text of ``b`` bytes is at most ``b`` tokens; a document is also at most its
        per-document limit (``max_tokens_per_doc``, the model's ``max_length``) and the context
        at most ``max_length``. Costed the backend's way (:meth:`TokenLayout.cost`) and never
        more than a full ``max_length`` per document beside the context.
        """
        fields = [search.query, search.instruction or ""]
        if mode.uses_question:
            fields.append(search.original_question or "")
        if mode.uses_reasoning:
            fields.append(search.reasoning or "")
        max_length = self.layout.max_length
        context = min(
            self._template_tokens[mode] + sum(len(f.encode("utf-8")) for f in fields), max_length
        )
        limit = min(search.max_tokens_per_doc or max_length, max_length)
        documents = [
            min(self._lead_bytes + len(d.encode("utf-8")), limit) for d in search.documents
        ]
        if not documents:
            return 0
        return min(self.layout.cost(context, documents), context + max_length * len(documents))

    def prepare(self, search: RerankInput) -> ScoringJob:
        """Validate ``search`` and fit its documents; raises :class:`ClientError`."""
        name = search.documents_field
        if len(search.documents) > self.limits.max_documents:
            raise ClientError(
                413,
                name,
                f"{len(search.documents)} documents, at most {self.limits.max_documents} per request",
            )
        for i, doc in enumerate(search.documents):
            if not doc.strip():
                raise ClientError(422, f"{name}[{i}]", "is empty")
            _check_encodable(f"{name}[{i}]", doc)
        for field_name in ("query", "original_question", "reasoning", "instruction"):
            _check_encodable(field_name, getattr(search, field_name))
        context, mode = self._context(search)
        bound = self.token_bound(search, mode)
        if bound > self.limits.max_request_tokens:
            raise ClientError(
                413,
                name,
                f"this request may cost up to {bound} tokens, at most "
                f"{self.limits.max_request_tokens} per request: send fewer or shorter "
                "documents (or a smaller max_tokens_per_doc)",
            )
        try:
            context_tokens = self.layout.context_tokens(context, mode)
        except ValueError as err:
            raise ClientError(413, "query", f"with its context: {err}") from None
        room = self.layout.room(context_tokens)
        limit = min(room, search.max_tokens_per_doc or room)
        fitted = self.layout.fit(search.documents, limit, keep_end=search.keep_end)
        texts, kept = fitted.texts, fitted.kept
        # A document tokenized here goes to the scorer with its ids (tokenized once); one cut
        # here goes as its kept text, which the scorer tokenizes (at most `limit` tokens).
        tokenized = [
            t if text is doc else None
            for doc, text, t in zip(search.documents, texts, fitted.tokenized)
        ]
        if limit == room and not search.keep_end:
            # Only the model's room binds: leave the cut to the scorer, which keeps exactly the
            # first `room` tokens, so a served score equals Scorer.score on the same pair (the
            # offline jobs and in-process callers). The word-boundary cut is for an explicit
            # max_tokens_per_doc or keeping the end, which the scorer cannot do itself.
            texts, tokenized = list(search.documents), fitted.tokenized
            kept = [
                min(o, room) if e else k for o, k, e in zip(fitted.original, kept, fitted.exact)
            ]
        truncate = self.limits.auto_truncate if search.truncate is None else search.truncate
        if not truncate:
            for i, count in enumerate(fitted.original):
                if count > room:
                    # Only a prefix of a very long text is tokenized: its count is a bound.
                    size = str(count) if fitted.whole[i] else f"at least {count}"
                    raise ClientError(
                        413,
                        f"{name}[{i}]",
                        f"is {size} tokens, only {room} fit beside the query "
                        "(send truncate=true to cut it)",
                    )
        return ScoringJob(
            context=context,
            mode=mode,
            documents=tuple(texts),
            tokenized=tuple(tokenized),
            tokens=self.layout.cost(context_tokens, kept),
            limit=limit,
            truncated=tuple(i for i, (n, k) in enumerate(zip(fitted.original, kept)) if n > k),
            context_tokens=context_tokens,
            bound=bound,
            cut_fields=tuple(
                (_REQUEST_FIELD[name], cap)
                for name, cap in self.layout.cut_fields(context, mode).items()
            ),
        )

    def _context(self, search: RerankInput) -> tuple[AgentContext, Mode]:
        try:
            requested = parse_mode(search.mode)
        except ValueError as err:
            raise ClientError(422, "mode", str(err)) from None
        if search.instruction is not None and not self.layout.instruction_line:
            raise ClientError(
                422,
                "instruction",
                f"the served model ({self.scorer.backend.name}) has no instruction line",
            )
        try:
            context = AgentContext(
                search.query,
                question=search.original_question,
                reasoning=search.reasoning,
                instruction=search.instruction,
            )
        except FieldError as err:  # the field the core names, as the request names it
            raise scoring_refusal(search, err) from None
        if requested == AUTO:
            mode = context.richest_mode
        else:
            mode = requested
            if missing := context.missing_field(mode):
                raise ClientError(
                    422,
                    _REQUEST_FIELD[missing],
                    f"mode {mode.value} reads it, but it is missing or empty",
                )
        return context.for_mode(mode), mode

    def score(
        self, jobs: Sequence[ScoringJob], cancel: CancelFn | None = None
    ) -> list[ScoredSearch | Exception]:
        """Per job its log-odds (documents in input order) and the tokens the model computed
        (the usage a response reports), all jobs in one scorer call in the mode each was
        prepared for.

        Jobs are validated already; should the scorer still fail one (any exception, an
        out-of-memory error retried at a smaller batch first: :func:`score_isolated`), only
        that job gets the exception. ``cancel`` is checked before every forward pass; when it
        says stop, :class:`~acare_ray.scoring.backend.Cancelled` is raised.
        """
        searches = [(job.context, job.mode, job.scored_documents()) for job in jobs]
        return score_resolved_isolated(self.scorer, searches, cancel=cancel)

    def measure_throughput(
        self, documents: int = 16, document_bytes: int = 1000
    ) -> tuple[int, float]:
        """``(tokens, seconds)`` of one synthetic M3 request of ``documents`` documents of about
        ``document_bytes`` bytes of plain English each, scored through :meth:`prepare` and
        :meth:`score` as a request is, after one untimed two-document warm-up (first-call
        costs). ``tokens`` is the request's ``bound``, the unit admission counts. Fewer
        documents where this service's limits (``max_documents``, ``max_request_tokens``) would
        refuse that many; :class:`ClientError` if even one is refused."""
        documents = max(1, min(documents, self.limits.max_documents))
        search = _synthetic_search(documents, document_bytes)
        while documents > 1 and (
            self.token_bound(search, Mode.M3) > self.limits.max_request_tokens
        ):
            documents //= 2
            search = _synthetic_search(documents, document_bytes)
        warm = self.prepare(replace(search, documents=search.documents[:2]))
        self.score([warm])
        job = self.prepare(search)
        started = time.perf_counter()
        (scored,) = self.score([job])
        seconds = time.perf_counter() - started
        if isinstance(scored, Exception):
            raise scored
        return job.bound, seconds

    def relevance(self, scores: np.ndarray, mode: Mode) -> tuple[np.ndarray, bool]:
        """The 0..1 relevance of ``scores`` read in ``mode``: the checkpoint's calibration for
        that mode when it has one (True), else sigmoid (False). Never changes an order."""
        calibration = self.calibration.get(Mode(mode).value)
        if calibration is None:
            return expit(np.asarray(scores, dtype=np.float64)), False
        return calibration.apply(scores), True

    def probe(self) -> None:
        """The replica's health: the golden cases score as the checkpoint recorded (raises
        :class:`GoldenMismatchError` naming the case and both numbers), or, for a model without
        them, one tiny forward pass gives a finite score."""
        if self.golden:
            verify(self.scorer, self.golden, self.model_name)
            return
        scores = self.scorer.score(AgentContext("health"), ["ok"], Mode.M0)
        if scores.shape != (1,) or not np.isfinite(scores).all():
            raise RuntimeError(f"health probe scored {scores!r}")

    def describe(self) -> dict:
        """What ``/v1/models`` reports about the loaded model."""
        return {
            "id": self.model_name,
            "backend": self.scorer.backend.name,
            "max_length": self.layout.max_length,
            "modes": [m.value for m in Mode] + [AUTO],
        } | public_source(self.scorer.source)


_WORDS = (
    "the",
    "river",
    "town",
    "market",
    "bridge",
    "council",
    "harbour",
    "winter",
    "railway",
    "museum",
    "library",
    "station",
    "village",
    "church",
    "school",
    "farmer",
    "painter",
    "novel",
    "election",
    "treaty",
    "mountain",
    "valley",
    "island",
    "festival",
    "engine",
    "company",
    "founder",
    "century",
    "district",
    "province",
)


def _synthetic_search(documents: int, document_bytes: int) -> RerankInput:
    """A request shaped like an agent's search (question, reasoning, a short query and
    ``documents`` passages of ``document_bytes`` bytes), its text plain words."""

    def text(seed: int, size: int) -> str:
        words, n, i = [], 0, seed
        while n < size:
            word = _WORDS[(i * 7 + seed) % len(_WORDS)]
            words.append(word)
            n += len(word) + 1
            i += 1
        return " ".join(words)[:size]

    return RerankInput(
        query=text(1, 40),
        documents=[text(10 + i, document_bytes) for i in range(documents)],
        original_question=text(2, 120),
        reasoning=text(3, 400),
        mode="M3",
    )


def is_local_path(model: str) -> bool:
    """Whether ``model`` names a folder on this machine (else a Hub id or an alias)."""
    return model.startswith(("/", ".", "~")) or Path(model).expanduser().exists()


def public_source(source: str | None) -> dict[str, str]:
    """``{"source": ...}`` for a Hub id; nothing for a local folder (paths stay behind
    ``/v1/status``)."""
    return {"source": source} if source and not is_local_path(source) else {}
