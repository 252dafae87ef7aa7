"""Arrow schemas of the three tables and row validation for the offline jobs.

The tables are described in docs/architecture.md, section 4. The first-stage order of a
search's candidates and the tie rule of every ranking are :mod:`acare_ray.ranking.fusion`'s.

Rows reach the validators from Ray Data batches, so a row is any mapping whose values may be
Python objects (``pyarrow.Table.to_pylist``), numpy arrays / numpy scalars, or pandas' ``NaN``
for a null string or float. A bad row raises :class:`RowError`, whose message names the row and
the field: ``search_id=abc: candidates[3].text is empty``. Document length is not checked here;
the scorer truncates.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from acare_ray.ranking.fusion import FusionConfig, fuse
from acare_ray.scoring import AgentContext, Mode

CANDIDATE = pa.struct(
    [
        ("doc_id", pa.string()),
        ("text", pa.string()),
        ("first_stage_score", pa.float64()),
        ("relevance", pa.int32()),
        ("first_stage_rank", pa.int32()),
    ]
)
"""A candidate. ``first_stage_score`` / ``first_stage_rank`` (1-based) are optional; the
first-stage order is rank, then score, then list position (:func:`acare_ray.ranking.fusion.first_stage_ranks`),
so a list already in first-stage order needs neither."""
DOCUMENT = pa.struct([("doc_id", pa.string()), ("text", pa.string())])
RANKED = pa.struct(
    [
        ("doc_id", pa.string()),
        ("score", pa.float32()),
        ("rank", pa.int32()),
        ("fused", pa.float64()),
    ]
)
"""A ranked candidate: ``score`` is the raw log-odds (always), ``rank`` 1-based, ``fused`` the
fused value when the row's ``fusion`` is set (null otherwise); the rank follows ``fused`` then."""

SEARCHES = pa.schema(
    [
        ("search_id", pa.string()),
        ("session_id", pa.string()),
        ("sub_query", pa.string()),
        ("question", pa.string()),
        ("reasoning", pa.string()),
        ("candidates", pa.list_(CANDIDATE)),
        ("answer", pa.string()),
        ("supporting_docs", pa.list_(pa.string())),
        ("judge_ok", pa.bool_()),
        ("instruction", pa.string()),
    ]
)
"""One row per agent search. Required: ``search_id``, ``sub_query``, non-empty ``candidates``.
``answer``, ``supporting_docs`` and ``judge_ok`` (False = failed trajectory) serve relabeling.
``instruction`` (optional, untrusted text) replaces the prompt's ``<Instruct>:`` line for this
search (causal backend; null: the mode's default)."""

RERANK_OUTPUT = pa.schema(
    [
        ("search_id", pa.string()),
        ("mode", pa.string()),
        ("ranking", pa.list_(RANKED)),
        ("error", pa.string()),
        ("fusion", pa.string()),
    ]
)
"""One row per input row, always; a bad row has an ``error`` and an empty ``ranking``.
``fusion``: the fusion setting's label (``rrf:k=60,weight=0.5``), null when none."""

TRAINING_GROUPS = pa.schema(
    [
        ("group_id", pa.string()),
        ("session_id", pa.string()),
        ("sub_query", pa.string()),
        ("question", pa.string()),
        ("reasoning", pa.string()),
        ("positive", DOCUMENT),
        ("negatives", pa.list_(DOCUMENT)),
        ("instruction", pa.string()),
    ]
)
"""One LCE group: the positive and its negatives. ``session_id`` is the train/validation split
key, so one question never sits on both sides."""


class RowError(ValueError):
    """A row that cannot be used; the message names the row and the field."""


@dataclass(frozen=True)
class Candidate:
    """A document of a search. ``relevance`` None means unjudged. ``agent_rank``: the
    position the agent's own search tool gave it (imported traces), None when absent."""

    doc_id: str
    text: str
    first_stage_score: float | None = None
    relevance: int | None = None
    first_stage_rank: int | None = None
    agent_rank: int | None = None


@dataclass(frozen=True)
class Search:
    search_id: str
    session_id: str | None
    context: AgentContext
    candidates: tuple[Candidate, ...]
    answer: str | None = None
    supporting_docs: tuple[str, ...] | None = None
    judge_ok: bool | None = None


@dataclass(frozen=True)
class Group:
    """A training group; ``positive`` and ``negatives`` carry only ``doc_id`` and ``text``."""

    group_id: str
    session_id: str
    context: AgentContext
    positive: Candidate
    negatives: tuple[Candidate, ...]


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float | np.floating) and math.isnan(value))


class _Row:
    """Field access with errors prefixed by the row's identity."""

    def __init__(self, row: Mapping[str, Any], key: str, index: int | None) -> None:
        if not isinstance(row, Mapping):
            where = f"row {index}" if index is not None else "row"
            raise RowError(f"{where}: expected a mapping, got {type(row).__name__}")
        self.row = row
        where = f"row {index}" if index is not None else f"{key}=<missing>"
        ident = row.get(key)
        if _missing(ident):
            raise RowError(f"{where}: {key} is missing")
        if not isinstance(ident, str):
            raise RowError(f"{where}: {key} must be a string, got {type(ident).__name__}")
        if not ident.strip():
            raise RowError(f"{where}: {key} is empty")
        self.ident = str(ident)
        self.prefix = f"{key}={ident}"

    def error(self, field: str, problem: str) -> RowError:
        return RowError(f"{self.prefix}: {field} {problem}")

    def text(self, value: Any, field: str, required: bool) -> str | None:
        if _missing(value):
            if required:
                raise self.error(field, "is missing")
            return None
        if not isinstance(value, str):
            raise self.error(field, f"must be a string, got {type(value).__name__}")
        if required and not value.strip():
            raise self.error(field, "is empty")
        return str(value)

    def field(self, name: str, required: bool = False) -> str | None:
        return self.text(self.row.get(name), name, required)

    def items(self, value: Any, field: str) -> list[Any]:
        if _missing(value):
            raise self.error(field, "is missing")
        if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Sequence | np.ndarray):
            raise self.error(field, f"must be a list, got {type(value).__name__}")
        return list(value)

    def document(self, value: Any, field: str) -> Candidate:
        if not isinstance(value, Mapping):
            raise self.error(field, f"must be a struct, got {type(value).__name__}")
        doc_id = self.text(value.get("doc_id"), f"{field}.doc_id", required=True)
        text = self.text(value.get("text"), f"{field}.text", required=True)
        score, rel = self._labels(value, field)
        first_rank = self._integer(value, field, "first_stage_rank", positive=True)
        agent_rank = self._integer(value, field, "agent_rank", positive=True)
        return Candidate(doc_id, text, score, rel, first_rank, agent_rank)

    def _integer(
        self, value: Mapping[str, Any], field: str, name: str, positive: bool = False
    ) -> int | None:
        item = value.get(name)
        if _missing(item):
            return None
        integral = isinstance(item, int | np.integer) or (
            isinstance(item, float | np.floating) and float(item).is_integer()
        )
        if isinstance(item, bool) or not integral:
            raise self.error(f"{field}.{name}", f"must be an integer, got {item!r}")
        if positive and int(item) < 1:
            raise self.error(f"{field}.{name}", f"must be >= 1, got {int(item)}")
        return int(item)

    def _labels(self, value: Mapping[str, Any], field: str) -> tuple[float | None, int | None]:
        score = value.get("first_stage_score")
        if not _missing(score):
            if isinstance(score, bool) or not isinstance(score, int | float | np.number):
                raise self.error(f"{field}.first_stage_score", f"must be a number, got {score!r}")
            score = float(score)
            if not math.isfinite(score):
                raise self.error(f"{field}.first_stage_score", f"must be finite, got {score}")
        return (None if _missing(score) else score), self._integer(value, field, "relevance")

    def context(self) -> AgentContext:
        sub_query = self.field("sub_query", required=True)
        return AgentContext(
            sub_query,
            self.field("question"),
            self.field("reasoning"),
            instruction=self.field("instruction"),
        )


def parse_search(row: Mapping[str, Any], index: int | None = None) -> Search:
    """Validate one ``SEARCHES`` row; ``index`` (position in the batch) names a row without id."""
    r = _Row(row, "search_id", index)
    context = r.context()
    raw = r.items(row.get("candidates"), "candidates")
    if not raw:
        raise r.error("candidates", "is empty")
    candidates = tuple(r.document(c, f"candidates[{i}]") for i, c in enumerate(raw))
    supporting = row.get("supporting_docs")
    if not _missing(supporting):
        field = "supporting_docs"
        supporting = tuple(
            r.text(d, f"{field}[{i}]", True) for i, d in enumerate(r.items(supporting, field))
        )
    judge_ok = row.get("judge_ok")
    if _missing(judge_ok):
        judge_ok = None
    elif not isinstance(judge_ok, bool | np.bool_):
        raise r.error("judge_ok", f"must be a bool, got {type(judge_ok).__name__}")
    return Search(
        search_id=r.ident,
        session_id=r.field("session_id"),
        context=context,
        candidates=candidates,
        answer=r.field("answer"),
        supporting_docs=None if _missing(supporting) else supporting,
        judge_ok=None if judge_ok is None else bool(judge_ok),
    )


def parse_group(row: Mapping[str, Any], index: int | None = None) -> Group:
    """Validate one ``TRAINING_GROUPS`` row (at least one negative)."""
    r = _Row(row, "group_id", index)
    session_id = r.field("session_id", required=True)
    context = r.context()
    positive = r.document(row.get("positive"), "positive")
    raw = r.items(row.get("negatives"), "negatives")
    if not raw:
        raise r.error("negatives", "is empty")
    negatives = tuple(r.document(d, f"negatives[{i}]") for i, d in enumerate(raw))
    return Group(r.ident, session_id, context, positive, negatives)


def rerank_row(
    search_id: str,
    mode: Mode | str,
    doc_ids: Sequence[str],
    scores: Sequence[float],
    top_k: int | None = None,
    fusion: FusionConfig | None = None,
    first_stage_scores: Sequence[float | None] | None = None,
    first_stage_ranks: Sequence[int | None] | None = None,
) -> dict[str, Any]:
    """A ``RERANK_OUTPUT`` row: ranking by score descending, rank from 1; with an enabled
    ``fusion``, by the fused value (each entry's ``fused``) with ``score`` still the raw score.
    Ties follow the first-stage order (:func:`acare_ray.ranking.fusion.order`; without first-stage
    scores or ranks that is the input order).

    ``top_k`` keeps the best ``top_k`` entries; None keeps all. Scores are stored as float32,
    and ordered as stored.
    """
    if len(doc_ids) != len(scores):
        raise ValueError(f"search_id={search_id}: {len(doc_ids)} doc_ids but {len(scores)} scores")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        raise ValueError(f"top_k must be a positive integer or None, got {top_k!r}")
    values = np.asarray(scores, dtype=np.float32).reshape(-1)
    bad = np.flatnonzero(np.isnan(values))
    if bad.size:
        raise RowError(f"search_id={search_id}: score of candidates[{bad[0]}] is NaN")
    fusion = fusion or FusionConfig()
    try:
        fused = fuse(values, fusion, first_stage_scores, first_stage_ranks)
    except ValueError as err:
        raise RowError(f"search_id={search_id}: {err}") from None
    ranking = [
        {
            "doc_id": str(doc_ids[i]),
            "score": float(values[i]),
            "rank": rank,
            "fused": float(fused.values[i]) if fusion.enabled else None,
        }
        for rank, i in enumerate(fused.order[:top_k], start=1)
    ]
    return {
        "search_id": search_id,
        "mode": _mode_name(mode),
        "ranking": ranking,
        "error": None,
        "fusion": fusion.label if fusion.enabled else None,
    }


def error_row(
    search_id: str | None, mode: Mode | str, message: str, fusion: FusionConfig | None = None
) -> dict[str, Any]:
    """A ``RERANK_OUTPUT`` row for a search that could not be scored."""
    return {
        "search_id": search_id,
        "mode": _mode_name(mode),
        "ranking": [],
        "error": str(message),
        "fusion": fusion.label if fusion is not None and fusion.enabled else None,
    }


def _mode_name(mode: Mode | str) -> str:
    return mode.value if isinstance(mode, Mode) else str(mode)
