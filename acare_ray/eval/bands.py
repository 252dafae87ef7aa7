"""Where a reranker gains and where it loses: searches banded by the first stage's own score.

A mean over searches hides two populations. Where the first stage already ranks the gold pages
on top (nDCG@10 = 1), a reranker can only tie or lose; where it ranks them low, a reranker can
only tie or gain. :func:`first_stage_bands` splits the searches by the first stage's per-search
value of one measure and gives every system's mean in each band, with how many searches it
lost or won there against the first stage. That is the headroom each band leaves and what the
system did with it, and it is why a fusion with the first-stage order can beat both.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

# Band edges on the first stage's per-search value: [0, 0.5), [0.5, 0.8), [0.8, 1), exactly 1.
DEFAULT_EDGES = (0.5, 0.8, 1.0)
_TIE = 1e-9


def _label(low: float, high: float | None) -> str:
    return f"= {low:g}" if high is None else f"[{low:g}, {high:g})"


def first_stage_bands(
    per_query: Mapping[str, Mapping[str, float]],
    baseline: str = "first_stage",
    edges: Sequence[float] = DEFAULT_EDGES,
) -> list[dict[str, Any]]:
    """``per_query`` is ``{system: {search_id: value}}`` for one measure, ``baseline`` one of
    its systems. Returns one entry per band of the baseline's value, in order: ``band`` (a
    label), ``low`` and ``high`` (``high`` None for the last band, which holds values equal to
    its ``low``: the baseline already perfect), ``queries``, and per system ``mean``, ``lost``
    and ``won`` (searches below / above the baseline's value). Searches are those the baseline
    has; a system missing one of them is a ValueError naming it. The last edge is the measure's
    maximum (1 for nDCG, recall and RR); values above it fall in no band. Empty bands are kept, with
    ``queries`` 0 and no means, so tables line up across runs."""
    if baseline not in per_query:
        raise ValueError(f"baseline system {baseline!r} not among {sorted(per_query)}")
    if not edges or list(edges) != sorted(set(edges)) or edges[0] <= 0:
        raise ValueError(f"band edges must be positive, increasing and distinct, got {list(edges)}")
    base = per_query[baseline]
    qids = sorted(base)
    for system, values in per_query.items():
        missing = [q for q in qids if q not in values]
        if missing:
            raise ValueError(f"system {system!r} has no value for search {missing[0]!r}")
    bounds = [0.0, *edges]
    bands = []
    for i, low in enumerate(bounds):
        high = bounds[i + 1] if i + 1 < len(bounds) else None
        if high is None:
            chosen = [q for q in qids if abs(base[q] - low) <= _TIE]
        else:
            chosen = [q for q in qids if low - _TIE <= base[q] < high - _TIE]
        entry: dict[str, Any] = {
            "band": _label(low, high),
            "low": low,
            "high": high,
            "queries": len(chosen),
            "mean": {},
            "lost": {},
            "won": {},
        }
        bands.append(entry)
        if not chosen:
            continue
        for system, values in per_query.items():
            diffs = np.array([values[q] - base[q] for q in chosen])
            entry["mean"][system] = float(np.mean([values[q] for q in chosen]))
            entry["lost"][system] = int(np.sum(diffs < -_TIE))
            entry["won"][system] = int(np.sum(diffs > _TIE))
    return bands


def bands_markdown(bands: list[dict[str, Any]], systems: Sequence[str], baseline: str) -> list[str]:
    """A markdown table of :func:`first_stage_bands`: one row per band, per system its mean
    and ``lost/won`` against ``baseline``."""
    others = [s for s in systems if s != baseline]
    lines = [
        f"| {baseline} band | searches | {baseline} | " + " | ".join(others) + " |",
        "|---" * (len(others) + 3) + "|",
    ]
    for band in bands:
        if not band["queries"]:
            lines.append(f"| {band['band']} | 0 | - | " + " | ".join("-" for _ in others) + " |")
            continue
        cells = [f"{band['mean'][s]:.3f} ({band['lost'][s]}/{band['won'][s]})" for s in others]
        lines.append(
            f"| {band['band']} | {band['queries']} | {band['mean'][baseline]:.3f} | "
            + " | ".join(cells)
            + " |"
        )
    return lines


__all__ = ["DEFAULT_EDGES", "bands_markdown", "first_stage_bands"]
