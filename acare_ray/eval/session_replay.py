"""Session replay: what a reranker's rankings would have given an agent over a whole session.

Agent harnesses show each search only documents the session has not returned yet. Replaying a
session's searches in order, each search returns the top ``depth`` of its ranking (trec_eval
order, :func:`acare_ray.eval.ir_metrics.rank_docs`) among candidates not returned by an earlier search
of the session. The unit of usefulness is a **gold page** (several candidates can be chunks of
one page): a session's gold set is given (e.g. the question's supporting titles), and a page is
found when a returned document belongs to it.

Per session (each a mean or a final value; sessions are the unit of significance tests, since
the searches of one session are not independent):

- ``session_recall``: share of the gold pages returned by the end of the session;
- ``session_recall_mean``: the share after each search, averaged over the session's searches
  (rewards finding gold early);
- ``useful@{depth}``: share of the returned documents that belong to a gold page, averaged over
  the session's searches (the agent's "top-10 usefulness").

Also the search at which each gold page was first returned (1-based), or None.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from acare_ray.eval.ir_metrics import rank_docs

SESSION_MEASURES = ("session_recall", "session_recall_mean", "useful@10")


@dataclass(frozen=True)
class SessionSearch:
    """One search of a session: its id and each candidate's page (``doc_id -> page``)."""

    search_id: str
    pages: Mapping[str, str]


@dataclass(frozen=True)
class SessionReplay:
    """What each search returned and what the session found."""

    session_id: str
    search_ids: tuple[str, ...]
    returned: tuple[tuple[str, ...], ...]
    recall_after: tuple[float, ...]
    useful: tuple[float, ...]
    first_found: dict[str, int | None]

    def measures(self, depth: int = 10) -> dict[str, float]:
        return {
            "session_recall": self.recall_after[-1] if self.recall_after else 0.0,
            "session_recall_mean": float(np.mean(self.recall_after)) if self.recall_after else 0.0,
            f"useful@{depth}": float(np.mean(self.useful)) if self.useful else 0.0,
        }


def replay_session(
    session_id: str,
    searches: Sequence[SessionSearch],
    run: Mapping[str, Mapping[str, float]],
    gold_pages: set[str] | frozenset[str],
    depth: int = 10,
) -> SessionReplay:
    """Replay ``searches`` (in session order) with the rankings of ``run``.

    A search absent from ``run`` returns nothing (it still counts as a search). ``gold_pages``
    must be non-empty.
    """
    if depth < 1:
        raise ValueError(f"depth must be >= 1, got {depth}")
    if not gold_pages:
        raise ValueError(f"session_id={session_id}: the gold set is empty")
    seen: set[str] = set()
    found: dict[str, int | None] = dict.fromkeys(sorted(gold_pages))
    returned, recall_after, useful = [], [], []
    for index, search in enumerate(searches, start=1):
        ranking = rank_docs(run.get(search.search_id, {}), search.search_id)
        shown = [d for d in ranking if d not in seen][:depth]
        seen.update(shown)
        pages = [search.pages.get(d, d) for d in shown]
        for page in pages:
            if page in found and found[page] is None:
                found[page] = index
        returned.append(tuple(shown))
        useful.append(sum(p in gold_pages for p in pages) / len(shown) if shown else 0.0)
        recall_after.append(sum(v is not None for v in found.values()) / len(found))
    return SessionReplay(
        session_id=session_id,
        search_ids=tuple(s.search_id for s in searches),
        returned=tuple(returned),
        recall_after=tuple(recall_after),
        useful=tuple(useful),
        first_found=found,
    )


def session_means(
    per_search: Mapping[str, float], session_of: Mapping[str, str]
) -> dict[str, float]:
    """``{session_id: mean of its searches' values}``: per-search measures made session-paired."""
    groups: dict[str, list[float]] = {}
    for search_id, value in per_search.items():
        groups.setdefault(session_of[search_id], []).append(value)
    return {s: float(np.mean(v)) for s, v in sorted(groups.items())}
