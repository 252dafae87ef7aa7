"""Pure batch functions the offline actors run: rows of searches in, output rows out.

No Ray here: an actor loads a :class:`~acare_ray.scoring.scorer.Scorer` once and calls these per batch,
and tests call them directly. The bad-row contract holds per row: a row that fails validation,
asks for a mode whose field it lacks, or fails to score becomes an output row with ``error``
set, never an exception that would fail the batch (and with it the job).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from acare_ray.data.schema import (
    TRAINING_GROUPS,
    RowError,
    Search,
    error_row,
    parse_search,
    rerank_row,
)
from acare_ray.ranking.fusion import FusionConfig
from acare_ray.scoring import (
    AgentContext,
    Mode,
    Scorer,
    parse_mode,
    rank_order,
    score_isolated,
    score_resolved_isolated,
)

RELABEL_OUTPUT = (
    TRAINING_GROUPS.insert(0, pa.field("search_id", pa.string()))
    .append(pa.field("status", pa.string()))
    .append(pa.field("error", pa.string()))
)
"""One row per input search: a ``TRAINING_GROUPS`` row plus ``search_id``, ``status`` (``ok``
or why no group came out: ``invalid``, ``failed_trajectory``, ``too_few_candidates``,
``no_gold_candidate``, ``scoring_failed``) and ``error`` (null when ``ok``). Only ``ok`` rows are training groups."""

LABELER_INSTRUCTION = (
    "Given a search query issued during a research session, the original question, its gold "
    "answer and the documents that support that answer, judge whether the passage helps answer "
    "the query on the way to the gold answer"
)


Parsed = tuple[str | None, Search | RowError]


class UndecodableRow(RowError):
    """A row with a string cell that is not valid UTF-8; stands in for the row's mapping."""

    def __init__(self, search_id: str | None, message: str) -> None:
        super().__init__(message)
        self.search_id = search_id


def _undecodable(array: pa.Array, path: str) -> str | None:
    """The path of the first string in the length-1 ``array`` that is not valid UTF-8."""
    kind = array.type
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        try:
            array.to_pylist()
        except UnicodeDecodeError:
            return path
        return None
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        values = array.flatten()
        for j in range(len(values)):
            if (bad := _undecodable(values.slice(j, 1), f"{path}[{j}]")) is not None:
                return bad
        return None
    if pa.types.is_struct(kind):
        for child, field in zip(array.flatten(), kind, strict=True):
            if (bad := _undecodable(child, f"{path}.{field.name}")) is not None:
                return bad
    return None


def table_rows(batch: pa.Table) -> list[Mapping[str, Any] | UndecodableRow]:
    """The rows of ``batch`` as mappings; a row with a string cell that is not valid UTF-8 is
    an :class:`UndecodableRow` naming the cell (``search_id=abc: sub_query is not valid
    UTF-8``) instead of failing the whole batch. Its id is the :func:`canonical_id` form."""
    from acare_ray.offline.resume import canonical_id

    try:
        return batch.to_pylist()
    except UnicodeDecodeError:
        pass
    out: list[Mapping[str, Any] | UndecodableRow] = []
    for i in range(batch.num_rows):
        row = batch.slice(i, 1)
        try:
            out.append(row.to_pylist()[0])
            continue
        except UnicodeDecodeError:
            pass
        ident = None
        if "search_id" in row.column_names and row["search_id"].null_count == 0:
            raw = pc.cast(row["search_id"], pa.binary())[0].as_py()
            ident = canonical_id(raw)
        cells = (_undecodable(row[name].combine_chunks(), name) for name in row.column_names)
        cell = next((c for c in cells if c is not None), "a string cell")
        out.append(UndecodableRow(ident, f"search_id={ident}: {cell} is not valid UTF-8"))
    return out


def parse_rows(rows: Sequence[Mapping[str, Any] | UndecodableRow]) -> list[Parsed]:
    """``(search_id or None, parse_search(row))`` per row; a bad row has its :class:`RowError`
    in place of the search (an :class:`UndecodableRow` is its own error)."""
    out: list[Parsed] = []
    for index, row in enumerate(rows):
        if isinstance(row, UndecodableRow):
            out.append((row.search_id, row))
            continue
        ident = row.get("search_id") if isinstance(row, Mapping) else None
        ident = ident if isinstance(ident, str) else None
        try:
            out.append((ident, parse_search(row, index)))
        except RowError as err:
            out.append((ident, err))
    return out


def _failure(search_id: str, err: Exception) -> str:
    return f"search_id={search_id}: scoring failed: {type(err).__name__}: {err}"


def rerank_mode(
    scorer: Scorer,
    parsed: Sequence[Parsed],
    mode: str,
    top_k: int | None,
    fusion: FusionConfig | None = None,
) -> list[dict[str, Any]]:
    """``RERANK_OUTPUT`` rows for one mode, one per parsed row, in input order.

    ``mode`` ``"auto"`` records each row's resolved mode; an error row of a row that could not
    be parsed records the mode as requested. ``fusion`` fuses each row's scores with its
    candidates' ``first_stage_score`` / ``first_stage_rank`` (:func:`acare_ray.ranking.fusion.fuse`).
    """
    requested = parse_mode(mode)
    name = requested.value if isinstance(requested, Mode) else requested
    out: list[dict[str, Any] | None] = [None] * len(parsed)
    ready: list[tuple[int, Search, Mode]] = []
    for i, (ident, item) in enumerate(parsed):
        if isinstance(item, RowError):
            out[i] = error_row(ident, name, str(item), fusion)
            continue
        try:
            ready.append((i, item, item.context.resolve_mode(requested)))
        except ValueError as err:
            message = f"search_id={item.search_id}: {err}"
            out[i] = error_row(item.search_id, name, message, fusion)
    items = [(s.context, resolved, [c.text for c in s.candidates]) for _, s, resolved in ready]
    for (i, search, resolved), scored in zip(ready, score_resolved_isolated(scorer, items)):
        if isinstance(scored, Exception):
            message = _failure(search.search_id, scored)
            out[i] = error_row(search.search_id, resolved, message, fusion)
            continue
        scores = scored.scores
        candidates = search.candidates
        try:
            out[i] = rerank_row(
                search.search_id,
                resolved,
                [c.doc_id for c in candidates],
                scores,
                top_k,
                fusion,
                [c.first_stage_score for c in candidates],
                [c.first_stage_rank for c in candidates],
            )
        except RowError as err:
            out[i] = error_row(search.search_id, resolved, str(err), fusion)
    return out  # type: ignore[return-value]


def rerank_rows(
    scorer: Scorer,
    rows: Sequence[Mapping[str, Any]],
    modes: Sequence[str],
    top_k: int | None = None,
    fusion: FusionConfig | None = None,
) -> list[dict[str, Any]]:
    """For each mode, one ``RERANK_OUTPUT`` row per input row (all rows of a mode together)."""
    parsed = parse_rows(rows)
    return [out for mode in modes for out in rerank_mode(scorer, parsed, mode, top_k, fusion)]


NEGATIVES_FROM = ("bottom", "hard")


def labeler_context(search: Search, supporting_titles: Sequence[str] | None = None) -> AgentContext:
    """What the labeler reads: the agent's sub-query and reasoning, and in the question block
    the original question, the gold answer and either the supporting pages' titles (when given)
    or the supporting documents' texts (those among the candidates, in candidate order). Fields
    absent from the row are left out."""
    parts = [search.context.question or ""]
    if search.answer and search.answer.strip():
        parts.append(f"#Gold Answer: {search.answer}")
    if supporting_titles:
        parts.append("#Supporting Titles: " + "; ".join(supporting_titles))
    else:
        supporting = set(search.supporting_docs or ())
        texts = [c.text for c in search.candidates if c.doc_id in supporting]
        if texts:
            parts.append(
                "#Supporting Documents:\n" + "\n".join(f"[{k}] {t}" for k, t in enumerate(texts, 1))
            )
    question = "\n".join(p for p in parts if p.strip()) or None
    return AgentContext(search.context.sub_query, question, search.context.reasoning)


def _titles(row: Mapping[str, Any]) -> list[str] | None:
    value = row.get("supporting_titles") if isinstance(row, Mapping) else None
    if value is None or isinstance(value, str | float):
        return None
    titles = [str(t) for t in value if isinstance(t, str) and t.strip()]
    return titles or None


def _doc(search: Search, index: int) -> dict[str, str]:
    candidate = search.candidates[index]
    return {"doc_id": candidate.doc_id, "text": candidate.text}


def _relabel_row(
    search_id: str | None,
    search: Search | None,
    status: str,
    error: str | None = None,
    positive: int | None = None,
    negatives: Sequence[int] = (),
) -> dict[str, Any]:
    context = search.context if search is not None else None
    ok = status == "ok" and positive is not None and search is not None
    return {
        "search_id": search_id,
        "group_id": search_id,
        "session_id": (search.session_id or search.search_id) if search is not None else None,
        "sub_query": context.sub_query if context else None,
        "question": context.question if context else None,
        "reasoning": context.reasoning if context else None,
        "positive": _doc(search, positive) if ok else None,
        "negatives": [_doc(search, int(i)) for i in negatives] if ok else [],
        "status": status,
        "error": error,
    }


def _choose(
    order: np.ndarray, search: Search, negatives: int, gold_aware: bool, negatives_from: str
) -> tuple[int, list[int]]:
    """(positive, negatives) candidate indices from the labeler's order (best first)."""
    if gold_aware:
        labels = [c.relevance for c in search.candidates]
        gold = [int(i) for i in order if (labels[i] or 0) > 0]
        pool = [int(i) for i in order if labels[i] is not None and labels[i] <= 0]
        positive = gold[0]
    else:
        positive, pool = int(order[0]), [int(i) for i in order[1:]]
    chosen = pool[:negatives] if negatives_from == "hard" else pool[-negatives:]
    return positive, chosen


def _unusable(search: Search, negatives: int, gold_aware: bool, keep_failed: bool):
    """``(status, message)`` when the search cannot make a group, else None."""
    sid = search.search_id
    if search.judge_ok is False and not keep_failed:
        return "failed_trajectory", f"search_id={sid}: judge_ok is False (failed trajectory)"
    if gold_aware:
        labels = [c.relevance for c in search.candidates]
        if not any((r or 0) > 0 for r in labels):
            return "no_gold_candidate", f"search_id={sid}: no candidate has relevance > 0"
        pool = sum(r is not None and r <= 0 for r in labels)
        if pool < negatives:
            message = (
                f"search_id={sid}: {pool} judged non-gold candidates, a group needs {negatives}"
            )
            return "too_few_candidates", message
    elif len(search.candidates) < negatives + 1:
        message = (
            f"search_id={sid}: candidates has {len(search.candidates)} entries, "
            f"a group needs {negatives + 1}"
        )
        return "too_few_candidates", message
    return None


def relabel_rows(
    scorer: Scorer,
    rows: Sequence[Mapping[str, Any]],
    negatives: int = 7,
    *,
    gold_aware: bool = False,
    negatives_from: str = "bottom",
    keep_failed: bool = False,
) -> list[dict[str, Any]]:
    """``RELABEL_OUTPUT`` rows, one per input row, in input order.

    The labeler scores each usable search's candidates in :func:`labeler_context` (with the
    row's ``supporting_titles`` when it has them) and orders them best first (ties keep input
    order). Without ``gold_aware`` the best becomes the positive and the negatives come from the
    rest; with ``gold_aware`` the positive is the labeler's best candidate of relevance > 0 (a
    gold page) and the negatives come from the judged non-gold candidates (relevance <= 0), so no
    negative is gold. ``negatives_from``: ``bottom`` takes the labeler's worst ``negatives``
    (worst last; the paper's choice), ``hard`` its best-ranked ones (hard negatives).
    ``judge_ok == False`` -> ``failed_trajectory`` unless ``keep_failed``; no gold candidate
    (``gold_aware``) -> ``no_gold_candidate``; too few negatives -> ``too_few_candidates``.
    """
    if negatives < 1:
        raise ValueError(f"negatives must be >= 1, got {negatives}")
    if negatives_from not in NEGATIVES_FROM:
        raise ValueError(f"negatives_from must be one of {NEGATIVES_FROM}, got {negatives_from!r}")
    out: list[dict[str, Any] | None] = [None] * len(rows)
    ready: list[tuple[int, Search]] = []
    for i, (ident, item) in enumerate(parse_rows(rows)):
        if isinstance(item, RowError):
            out[i] = _relabel_row(ident, None, "invalid", str(item))
        elif (problem := _unusable(item, negatives, gold_aware, keep_failed)) is not None:
            out[i] = _relabel_row(item.search_id, item, *problem)
        else:
            ready.append((i, item))
    items = [
        (labeler_context(s, _titles(rows[i])), [c.text for c in s.candidates]) for i, s in ready
    ]
    for (i, search), scores in zip(ready, score_isolated(scorer, items, "auto")):
        if isinstance(scores, Exception):
            message = _failure(search.search_id, scores)
            out[i] = _relabel_row(search.search_id, search, "scoring_failed", message)
        elif np.isnan(scores).any():
            message = f"search_id={search.search_id}: the labeler returned a NaN score"
            out[i] = _relabel_row(search.search_id, search, "scoring_failed", message)
        else:
            order = rank_order(scores)
            positive, chosen = _choose(order, search, negatives, gold_aware, negatives_from)
            out[i] = _relabel_row(search.search_id, search, "ok", None, positive, chosen)
    return out  # type: ignore[return-value]
