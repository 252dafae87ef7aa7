"""The ``--sessions`` part of ``acare eval``: session replay per mode, session-paired tests.

Input columns read: ``search_id``, ``session_id``, ``step`` (session order; without it, the
order of the rows in the input), the candidates' ``doc_id``, ``relevance`` and ``page`` (a doc
without a page is its own page), ``supporting_pages`` (the session's gold pages; without it, the
pages of the relevant candidates of the session's searches) and the ``group_by`` column.

A session counts when it has a gold page and every one of its searches was scored in every
mode (so all modes replay the same searches); the others are counted, not silently dropped.
Tests are paired by session: per-session values of each mode against each other mode, Holm
per measure; per-search measures enter as the mean over the session's searches
(:func:`acare_ray.eval.session_replay.session_means`).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow.compute as pc
import pyarrow.dataset as pads

from acare_ray.eval.ir_metrics import (
    bootstrap_ci,
    holm_bonferroni,
    paired_bootstrap_test,
    paired_randomization_test,
)
from acare_ray.eval.session_replay import SessionSearch, replay_session, session_means
from acare_ray.offline.resume import storage_paths


@dataclass
class SessionData:
    """Searches grouped into sessions, in order, with their gold pages and group values."""

    searches: dict[str, list[SessionSearch]] = field(default_factory=dict)
    gold: dict[str, set[str]] = field(default_factory=dict)
    group_of: dict[str, str] = field(default_factory=dict)
    session_of: dict[str, str] = field(default_factory=dict)


def load_sessions(path: str, group_by: str | None = None) -> SessionData:
    """Read what the replay needs from a searches Parquet (see the module docstring)."""
    fs, inner, _ = storage_paths(path)
    dataset = pads.dataset(inner, filesystem=fs, format="parquet")
    names = set(dataset.schema.names)
    if "session_id" not in names:
        raise ValueError(f"{path}: --sessions needs a session_id column")
    if group_by is not None and group_by not in names:
        raise ValueError(f"{path}: group_by column {group_by!r} is not in the input")
    columns = ["search_id", "session_id", "candidates"]
    columns += [c for c in ("step", "supporting_pages") if c in names]
    if group_by is not None and group_by not in columns:
        columns.append(group_by)
    rows: dict[str, list[tuple[float, int, SessionSearch]]] = {}
    data, position = SessionData(), 0
    candidate_fields = {f.name for f in dataset.schema.field("candidates").type.value_type}
    for batch in dataset.to_batches(columns=columns):
        for row in batch.to_pylist():
            position += 1
            qid, sid = row["search_id"], row["session_id"]
            if qid is None or sid is None or not row["candidates"]:
                continue
            pages, relevant = {}, set()
            for c in row["candidates"]:
                if c is None or c.get("doc_id") is None:
                    continue
                page = c.get("page") if "page" in candidate_fields else None
                pages[c["doc_id"]] = page if page is not None else c["doc_id"]
                if (c.get("relevance") or 0) > 0:
                    relevant.add(pages[c["doc_id"]])
            step = row.get("step")
            order = float(step) if step is not None else float(position)
            rows.setdefault(sid, []).append((order, position, SessionSearch(qid, pages)))
            gold = data.gold.setdefault(sid, set())
            if row.get("supporting_pages") is not None:
                gold.update(row["supporting_pages"])
            else:
                gold.update(relevant)
            data.session_of[qid] = sid
            if group_by is not None:
                data.group_of[sid] = str(row.get(group_by))
    data.searches = {
        sid: [s for _, _, s in sorted(items, key=lambda x: x[:2])] for sid, items in rows.items()
    }
    return data


# Keyed by mode, then two levels: runs {mode: {search id: {doc id: score}}}, per-search
# measures {mode: {measure: {search id: value}}}, session values {mode: {measure: {session: value}}}.
ByMode = Mapping[str, Mapping[str, Mapping[str, float]]]
Values = dict[str, dict[str, dict[str, float]]]


@dataclass(frozen=True)
class Significance:
    """How two systems are compared: a paired ``randomization`` (sign flip) or ``bootstrap``
    ``test`` of ``n_resamples`` draws from ``seed``; percentile bootstrap CIs at
    ``confidence``; ``alpha`` applies to Holm-adjusted p-values."""

    test: str = "randomization"
    n_resamples: int = 10_000
    seed: int = 0
    confidence: float = 0.95
    alpha: float = 0.05


def paired_comparisons(
    values: ByMode,
    modes: Sequence[str],
    measures: Sequence[str],
    significance: Significance,
    count_key: str = "n_paired",
) -> list[dict[str, Any]]:
    """Paired tests for every two modes and every measure of ``values[mode][measure][unit]``
    (units: searches or sessions); Holm across the pairs of a measure. ``ci_low``/``ci_high``
    bound the mean difference (b - a) by paired bootstrap; ``count_key`` names the unit count."""
    n, seed = significance.n_resamples, significance.seed
    out = []
    for measure in measures:
        rows = []
        for a, b in itertools.combinations(modes, 2):
            va, vb = values[a][measure], values[b][measure]
            boot = paired_bootstrap_test(va, vb, n, seed, significance.confidence)
            result = (
                boot
                if significance.test == "bootstrap"
                else paired_randomization_test(va, vb, n, seed)
            )
            rows.append(
                {
                    "measure": measure,
                    "a": a,
                    "b": b,
                    "mean_a": result.mean_a,
                    "mean_b": result.mean_b,
                    "diff": result.mean_diff,
                    "ci_low": boot.ci[0],
                    "ci_high": boot.ci[1],
                    "p_value": result.p_value,
                    count_key: result.n_queries,
                }
            )
        for row, adjusted in zip(rows, holm_bonferroni([r["p_value"] for r in rows])):
            row["p_holm"] = adjusted
            row["significant"] = adjusted <= significance.alpha
        out.extend(rows)
    return out


def eligible_sessions(
    data: SessionData,
    runs: ByMode,
    modes: Sequence[str],
    keep: Callable[[str], bool],
) -> tuple[list[str], dict[str, int]]:
    """The sessions ``keep`` selects that have a gold page and every search scored in every
    mode, and the counts of why the others were left out."""
    counts = {"sessions": 0, "evaluated": 0, "no_gold_page": 0, "not_scored_in_every_mode": 0}
    eligible = []
    for sid, searches in data.searches.items():
        if not keep(sid):
            continue
        counts["sessions"] += 1
        if not data.gold.get(sid):
            counts["no_gold_page"] += 1
        elif not all(s.search_id in runs[m] for m in modes for s in searches):
            counts["not_scored_in_every_mode"] += 1
        else:
            eligible.append(sid)
    counts["evaluated"] = len(eligible)
    counts["searches"] = sum(len(data.searches[s]) for s in eligible)
    return eligible, counts


def replayed_measures(
    data: SessionData,
    runs: ByMode,
    modes: Sequence[str],
    eligible: Sequence[str],
    depth: int,
) -> tuple[Values, dict[str, dict[str, int]]]:
    """Each mode's session measures (``values[mode][measure][session]``) from replaying the
    ``eligible`` sessions at ``depth``, and its histogram of where gold pages were first found."""
    names = ("session_recall", "session_recall_mean", f"useful@{depth}")
    values: Values = {}
    first_found: dict[str, dict[str, int]] = {}
    for mode in modes:
        values[mode] = {name: {} for name in names}
        histogram: dict[str, int] = {}
        for sid in eligible:
            replay = replay_session(sid, data.searches[sid], runs[mode], data.gold[sid], depth)
            for name, value in replay.measures(depth).items():
                values[mode][name][sid] = value
            for index in replay.first_found.values():
                key = "never" if index is None else str(index)
                histogram[key] = histogram.get(key, 0) + 1
        first_found[mode] = dict(
            sorted(histogram.items(), key=lambda kv: (kv[0] == "never", kv[0].zfill(4)))
        )
    return values, first_found


def session_means_of_searches(
    data: SessionData,
    per_query: ByMode,
    modes: Sequence[str],
    eligible: Sequence[str],
) -> Values:
    """``{mode: {"<measure> (session mean)": {session: mean}}}`` of each per-search measure
    over the searches of the ``eligible`` sessions."""
    search_measures = list(next(iter(per_query.values()))) if per_query else []
    chosen = set(eligible)
    out: Values = {mode: {} for mode in modes}
    for mode in modes:
        for measure in search_measures:
            scored = {
                q: v
                for q, v in per_query[mode][measure].items()
                if data.session_of.get(q) in chosen
            }
            out[mode][f"{measure} (session mean)"] = session_means(scored, data.session_of)
    return out


def session_section(
    data: SessionData,
    runs: ByMode,
    per_query: ByMode,
    modes: Sequence[str],
    *,
    depth: int = 10,
    significance: Significance = Significance(),
    keep: Callable[[str], bool] = lambda session_id: True,
) -> dict[str, Any]:
    """Replay every eligible session in every mode; means with CIs, first-found histograms and
    session-paired tests of the session measures and of the per-search measures (tested as
    ``significance`` says)."""
    eligible, counts = eligible_sessions(data, runs, modes, keep)
    if len(eligible) < 2:
        return {"counts": counts, "note": "fewer than 2 sessions to compare"}
    values, first_found = replayed_measures(data, runs, modes, eligible, depth)
    names = list(values[modes[0]])
    for mode, means in session_means_of_searches(data, per_query, modes, eligible).items():
        values[mode].update(means)
    measures = list(values[modes[0]])
    common = {m: set.intersection(*(set(values[mode][m]) for mode in modes)) for m in measures}
    for mode in modes:
        for m in measures:
            values[mode][m] = {s: values[mode][m][s] for s in sorted(common[m])}
    n, seed, confidence = significance.n_resamples, significance.seed, significance.confidence
    summary: dict[str, dict[str, Any]] = {}
    for mode in modes:
        summary[mode] = {}
        for m in measures:
            if values[mode][m]:
                mean, low, high = bootstrap_ci(list(values[mode][m].values()), n, seed, confidence)
                n_units = len(values[mode][m])
                summary[mode][m] = {"mean": mean, "ci_low": low, "ci_high": high, "n": n_units}
    measures = [m for m in measures if len(common[m]) >= 2]
    return {
        "counts": counts,
        "depth": depth,
        "measures": measures,
        "metrics": summary,
        "first_found": first_found,
        "comparisons": paired_comparisons(values, modes, measures, significance, "n_sessions"),
        "per_session": {mode: {m: values[mode][m] for m in names} for mode in modes},
    }


def load_column(path: str, column: str) -> dict[str, str]:
    """``{search_id: str(value)}`` of one input column (e.g. the ``group_by`` column)."""
    fs, inner, _ = storage_paths(path)
    dataset = pads.dataset(inner, filesystem=fs, format="parquet")
    if column not in dataset.schema.names:
        raise ValueError(f"{path}: group_by column {column!r} is not in the input")
    table = dataset.to_table(columns=["search_id", column])
    values = pc.cast(table.column(column), "string").to_pylist()
    return {
        q: str(v) for q, v in zip(table.column("search_id").to_pylist(), values) if q is not None
    }
