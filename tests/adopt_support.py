"""The stage files a finished ``acare adopt`` seed leaves, written for the summary's tests."""

from __future__ import annotations

import json
from pathlib import Path

STORED = "M3+linear:alpha=0.3"
M0 = "M0+linear:alpha=0.5"


def write_seed(work: Path, seed: int, gain: float, ci: tuple[float, float], p: float, **kw):
    """The stage files a finished seed leaves: fit, test (session-paired rows), loop, report."""
    folder = work / f"seed{seed}"
    folder.mkdir(parents=True)
    first, m0 = 0.80, kw.get("m0", 0.82)
    tests = [
        {"a": "first_stage", "b": STORED, "sessions": 98, "mean_a": first,
         "mean_b": first + gain, "diff": gain, "ci95": list(ci), "p": p, "p_holm": p},
        {"a": M0, "b": STORED, "sessions": 98, "mean_a": m0, "mean_b": first + gain,
         "diff": first + gain - m0, "ci95": [0.0, 0.1], "p": 0.1, "p_holm": 0.2},
    ]  # fmt: skip
    alone = kw.get("unfused")  # the reranker alone: (gain, ci, p_holm), when given
    if alone is not None:
        tests.append({"a": "first_stage", "b": "M3", "sessions": 98, "mean_a": first,
                      "mean_b": first + alone[0], "diff": alone[0], "ci95": list(alone[1]),
                      "p": alone[2], "p_holm": alone[2]})  # fmt: skip
    test = {"stored": STORED, "tests": tests}
    if "bands" in kw:  # the test report's banding by the first stage, as the eval writes it
        test["by_first_stage"] = {"measure": "nDCG@10", "baseline": "first_stage",
                                  "bands": kw["bands"]}  # fmt: skip
    (folder / "test.json").write_text(json.dumps(test))
    # fit.json as the fit stage writes it: the decision under "fitted", the whole grid beside.
    grid = [{"fusion": f"linear:alpha={a:g}", "nDCG@10": 0.70 + 0.1 * a} for a in (0, 0.3, 1)]
    fit = {"label": STORED.split("+", 1)[1], "grid": grid,
           "fitted": {"decision": kw.get("fit", "fused"), "objective": "nDCG@10"}}  # fmt: skip
    (folder / "fit.json").write_text(json.dumps({"M3": fit}))
    systems = {
        "bm25": {"tasks": 100, "solved": 92, "searches_per_task": 2.36},
        STORED: {"tasks": 100, "solved": kw.get("solved", 92), "searches_per_task": 2.35},
    }
    (folder / "loop.json").write_text(json.dumps({"report": {"systems": systems}}))
    (folder / "report.json").write_text(json.dumps({"overall": {"decision": "switch"}}))
