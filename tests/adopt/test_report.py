"""The adopt report's fusion-fit section: the reranker alone on the validation lists, beside the
first stage and the stored fusion, read off the fit's grid."""

from __future__ import annotations

from acare_ray.adopt.config import AdoptConfig
from acare_ray.adopt.report import report_markdown

DECISIONS = {"overall": {"decision": "no clear gain", "reason": "-"}, "per_agent": {}}


def _config() -> AdoptConfig:
    return AdoptConfig.from_dict(
        {
            "work_dir": "w",
            "model": "m",
            "sources": [{"name": "s", "searches": "s.parquet", "test": 1}],
        }
    )


def _fit(label: str, decision: str) -> dict:
    grid = [{"fusion": "rrf:k=60,weight=0", "nDCG@10": 0.7305}]
    grid += [{"fusion": f"linear:alpha={a:g}", "nDCG@10": 0.7305 + a * 0.1487} for a in (0, 0.5, 1)]
    grid[2]["nDCG@10"] = 0.9012  # alpha 0.5 above both ends
    fitted = {"decision": decision, "chosen": "linear:alpha=0.5", "questions": 25, "reason": "r"}
    return {"label": label, "fitted": fitted, "grid": grid}


def _results(fit: dict) -> dict:
    return {"data": {"sources": {}}, "fit": {"M3": fit}}


def test_the_fit_section_shows_the_reranker_alone_beside_the_first_stage():
    markdown = report_markdown(_config(), _results(_fit("linear:alpha=0.5", "fused")), DECISIONS)
    assert (
        "On these questions (nDCG@10): first stage 0.731, M3 alone 0.879 (+0.149), stored "
        "`linear:alpha=0.5` 0.901." in markdown
    )


def test_a_pass_through_fit_shows_the_first_stage_as_stored():
    fit = _fit("rrf:k=60,weight=0", "pass-through")
    markdown = report_markdown(_config(), _results(fit), DECISIONS)
    assert "M3 alone 0.879 (+0.149), stored `rrf:k=60,weight=0` 0.731." in markdown


def test_a_grid_without_the_end_points_adds_nothing():
    fit = _fit("linear:alpha=0.5", "fused")
    fit["grid"] = [row for row in fit["grid"] if row["fusion"] != "linear:alpha=1"]
    markdown = report_markdown(_config(), _results(fit), DECISIONS)
    assert "- M3: **fused**" in markdown and "alone" not in markdown
