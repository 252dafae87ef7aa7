"""Searches with relevance labels -> LCE training groups (1 positive + N negatives)."""

from __future__ import annotations

import json
import logging
import random
from collections import Counter
from dataclasses import asdict, dataclass

import pyarrow as pa
import pyarrow.compute as pc

from acare_ray.data.schema import TRAINING_GROUPS, Candidate, Search, parse_search

log = logging.getLogger(__name__)
STATS_KEY = b"acare.group_stats"


@dataclass(frozen=True)
class GroupStats:
    """What happened to each search: how many groups came out and why searches were skipped."""

    searches: int = 0
    groups: int = 0
    no_positive: int = 0
    too_few_negatives: int = 0
    failed_trajectory: int = 0


def _negatives(
    search: Search, count: int, seed: int, hard: int | None = None, skip: int = 0
) -> list[Candidate]:
    """``count`` judged non-relevant candidates: the ``hard`` ones with the highest first-stage
    score (all ``count`` when ``hard`` is None), then a seeded sample of the rest. Candidates
    without a score count as the easiest, so a search without scores gets a seeded sample. The
    ``skip`` highest-scored ones are left out altogether (likely unjudged positives)."""
    pool = [c for c in search.candidates if c.relevance is not None and c.relevance <= 0]
    scored = sorted(
        (c for c in pool if c.first_stage_score is not None), key=lambda c: -c.first_stage_score
    )[skip:]
    unscored = [c for c in pool if c.first_stage_score is None]
    # A string seed is hashed with SHA-512, so the order repeats across runs and processes.
    rng = random.Random(f"{seed}|{search.search_id}")
    rng.shuffle(unscored)
    ranked = scored + unscored
    if hard is None:
        return ranked[:count]
    rest = ranked[hard:]
    rng.shuffle(rest)
    return (ranked[:hard] + rest)[:count]


def _doc(candidate: Candidate) -> dict[str, str]:
    return {"doc_id": candidate.doc_id, "text": candidate.text}


def searches_to_groups(
    table: pa.Table, negatives: int = 7, seed: int = 0, hard: int | None = None, skip: int = 0
) -> pa.Table:
    """Build ``TRAINING_GROUPS`` rows from a ``SEARCHES`` table.

    Each candidate with relevance > 0 becomes the positive of one group (``group_id`` is the
    search id, suffixed ``#k`` when a search has several positives); negatives are candidates
    with relevance 0 (unjudged ones are never used): the ``hard`` with the highest first-stage
    score and a seeded random sample of the others (``hard=None``: the ``negatives`` hardest,
    candidates without a score last in a seeded order); with ``skip``, the ``skip`` highest-scored
    non-relevant candidates are never used (a self-mining round's guard against pages that are
    relevant but unjudged). Searches with no positive, fewer than
    ``negatives`` negatives, or ``judge_ok == False`` are skipped; the counts are logged and kept
    in the schema metadata (read them with :func:`group_stats`). ``session_id`` falls back to
    the search id when absent.
    """
    if negatives < 1:
        raise ValueError(f"negatives must be >= 1, got {negatives}")
    if hard is not None and not 0 <= hard <= negatives:
        raise ValueError(f"hard must be in 0..negatives ({negatives}), got {hard}")
    if skip < 0:
        raise ValueError(f"skip must be >= 0, got {skip}")
    rows, counts = [], dict.fromkeys(asdict(GroupStats()), 0)
    for index, raw in enumerate(table.to_pylist()):
        search = parse_search(raw, index)
        counts["searches"] += 1
        if search.judge_ok is False:
            counts["failed_trajectory"] += 1
            continue
        positives = [c for c in search.candidates if c.relevance is not None and c.relevance > 0]
        if not positives:
            counts["no_positive"] += 1
            continue
        chosen = _negatives(search, negatives, seed, hard, skip)
        if len(chosen) < negatives:
            counts["too_few_negatives"] += 1
            continue
        for k, positive in enumerate(positives):
            ctx = search.context
            rows.append(
                {
                    "group_id": search.search_id
                    if len(positives) == 1
                    else f"{search.search_id}#{k}",
                    "session_id": search.session_id or search.search_id,
                    "sub_query": ctx.sub_query,
                    "question": ctx.question,
                    "reasoning": ctx.reasoning,
                    "positive": _doc(positive),
                    "negatives": [_doc(c) for c in chosen],
                    "instruction": ctx.instruction,
                }
            )
    counts["groups"] = len(rows)
    skipped = counts["no_positive"] + counts["too_few_negatives"] + counts["failed_trajectory"]
    if skipped:
        log.warning(
            "searches_to_groups skipped %d of %d searches: %s", skipped, counts["searches"], counts
        )
    schema = TRAINING_GROUPS.with_metadata({STATS_KEY: json.dumps(counts).encode()})
    return pa.Table.from_pylist(rows, schema=schema)


def group_stats(table: pa.Table) -> GroupStats:
    """The counts :func:`searches_to_groups` stored on its output."""
    meta = table.schema.metadata or {}
    if STATS_KEY not in meta:
        raise ValueError("table carries no group statistics (not made by searches_to_groups)")
    return GroupStats(**json.loads(meta[STATS_KEY]))


def ok_groups(table: pa.Table) -> tuple[pa.Table, Counter]:
    """The training groups of a relabel output, its ``status == "ok"`` rows as
    ``TRAINING_GROUPS``, and how many rows of each other status (searches that gave no group)
    were left out."""
    status = table.column("status")
    left_out = Counter(s for s in status.to_pylist() if s != "ok")
    groups = table.filter(pc.equal(status, "ok")).select(TRAINING_GROUPS.names)
    return groups.cast(TRAINING_GROUPS), left_out


def with_bm25_scores(table: pa.Table) -> pa.Table:
    """``table`` (``SEARCHES``-shaped) with every candidate's ``first_stage_score`` set to its
    BM25 score for the search's ``sub_query`` over the pooled, deduplicated candidate texts of
    the whole table (for data whose candidates carry no first-stage score, such as MuSiQue's
    distractor setting, so negatives can be first-stage-hard)."""
    from acare_ray.data.bm25 import BM25Index

    rows = table.to_pylist()
    texts = list(dict.fromkeys(c["text"] for row in rows for c in row["candidates"]))
    position = {t: i for i, t in enumerate(texts)}
    index = BM25Index(texts)
    for row in rows:
        scores = index.scores(row["sub_query"], [position[c["text"]] for c in row["candidates"]])
        for candidate, score in zip(row["candidates"], scores, strict=True):
            candidate["first_stage_score"] = float(score)
    return pa.Table.from_pylist(rows, schema=table.schema)
