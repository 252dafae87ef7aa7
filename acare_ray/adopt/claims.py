"""Session-paired tests of a few focused claims from an ``acare eval`` report, one Holm family.

A claim ``(a, b)`` says system ``b`` beats system ``a`` on nDCG@10. Searches of one session are
not independent, so each session's mean over its searches is one paired value; a paired
randomization test gives the p-value, a paired bootstrap the interval, and Holm-Bonferroni
corrects the family. ``sessions`` restricts the family to some sessions (one agent's).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from acare_ray.eval.ir_metrics import (
    evaluate,
    holm_bonferroni,
    paired_bootstrap_test,
    paired_randomization_test,
)


def read_trec_run(path: str | Path) -> dict[str, dict[str, float]]:
    run: dict[str, dict[str, float]] = {}
    for line in Path(path).read_text().splitlines():
        qid, _, doc, _, score, _ = line.split()
        run.setdefault(qid, {})[doc] = float(score)
    return run


def read_trec_qrels(path: str | Path) -> dict[str, dict[str, int]]:
    qrels: dict[str, dict[str, int]] = {}
    for line in Path(path).read_text().splitlines():
        qid, _, doc, rel = line.split()
        qrels.setdefault(qid, {})[doc] = int(rel)
    return qrels


def report_session_means(
    report: dict[str, Any], system: str, session_of: dict[str, str], measure: str = "nDCG@10"
) -> dict[str, float]:
    """``{session: mean measure over its judged searches}`` of one system of ``report``."""
    qrels = read_trec_qrels(report["files"]["qrels"])
    run = read_trec_run(report["files"]["runs"][system])
    values = evaluate(qrels, run, [measure]).per_query[measure]
    by_session: dict[str, list[float]] = {}
    for qid, value in values.items():
        by_session.setdefault(session_of[qid], []).append(value)
    return {s: float(np.mean(v)) for s, v in by_session.items()}


def claim_tests(
    report: dict[str, Any],
    claims: Sequence[tuple[str, str]],
    session_of: dict[str, str],
    resamples: int = 10_000,
    sessions: Collection[str] | None = None,
) -> list[dict[str, Any]]:
    """One row per claim ``(a, b)``: sessions, means, ``diff`` (b - a) with a 95% bootstrap
    interval, the randomization p-value and its Holm-adjusted value."""
    means = {s: report_session_means(report, s, session_of) for s in {x for c in claims for x in c}}
    rows = []
    for a, b in claims:
        common = sorted(set(means[a]) & set(means[b]))
        if sessions is not None:
            common = [s for s in common if s in sessions]
        if len(common) < 2:
            raise ValueError(f"claim {a} vs {b}: {len(common)} session(s), need at least 2")
        va = {s: means[a][s] for s in common}
        vb = {s: means[b][s] for s in common}
        test = paired_randomization_test(va, vb, resamples, 0)
        boot = paired_bootstrap_test(va, vb, resamples, 0, 0.95)
        rows.append(
            {
                "a": a,
                "b": b,
                "sessions": len(common),
                "mean_a": test.mean_a,
                "mean_b": test.mean_b,
                "diff": test.mean_b - test.mean_a,
                "ci95": list(boot.ci) if boot.ci else None,
                "p": test.p_value,
            }
        )
    for row, adjusted in zip(rows, holm_bonferroni([r["p"] for r in rows]), strict=True):
        row["p_holm"] = adjusted
    return rows
