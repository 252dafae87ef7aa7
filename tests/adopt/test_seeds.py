"""``acare adopt --summarize-seeds``: the claim is judged across seeds, from the stage files."""

from __future__ import annotations

import pytest
from adopt_support import STORED, write_seed

from acare_ray.adopt.seeds import summarize_seeds, write_summary
from acare_ray.cli import main
from acare_ray.eval.bands import first_stage_bands


def test_three_good_seeds_hold_with_mean_spread_and_worst(tmp_path):
    write_seed(tmp_path, 0, 0.045, (0.024, 0.069), 0.0005)
    write_seed(tmp_path, 1, 0.010, (-0.01, 0.03), 0.3)
    write_seed(tmp_path, 2, 0.020, (0.001, 0.04), 0.04)
    summary = summarize_seeds(tmp_path, [0, 1, 2])
    gain = summary["across"]["gain"]
    assert gain["mean"] == pytest.approx(0.025) and gain["spread"] == pytest.approx(0.035)
    assert gain["worst"] == pytest.approx(0.010) and summary["worst_seed"] == 1
    assert summary["verdict"]["holds"] is True, summary["checks"]
    assert summary["across"]["loop"]["solved"] == 92


@pytest.mark.parametrize(
    ("seeds", "failed"),
    [
        ([(0.05, (0.02, 0.08), 0.001), (-0.001, (-0.02, 0.02), 0.9)], "every seed at or above"),
        ([(0.01, (-0.01, 0.03), 0.3), (0.015, (-0.01, 0.04), 0.3)], "mean gain at least"),
        ([(0.09, (0.05, 0.12), 0.001), (-0.03, (-0.05, -0.01), 0.01)], "significantly below"),
    ],
)
def test_a_claim_that_fails_in_one_seed_does_not_hold(tmp_path, seeds, failed):
    for seed, (gain, ci, p) in enumerate(seeds):
        write_seed(tmp_path, seed, gain, ci, p)
    summary = summarize_seeds(tmp_path, range(len(seeds)))
    assert summary["verdict"]["holds"] is False
    assert failed in summary["verdict"]["reason"]


def test_fused_m0_above_fused_m3_and_fewer_solved_tasks_fail(tmp_path):
    write_seed(tmp_path, 0, 0.03, (0.01, 0.05), 0.01, m0=0.86, solved=90)
    summary = summarize_seeds(tmp_path, [0])
    assert not summary["checks"]["mean fused M3 above mean fused M0"]
    loop_check = "agent loop: solves as many tasks as BM25 with no more searches"
    assert not summary["checks"][loop_check]


def test_a_missing_seed_leaves_the_verdict_open_and_the_cli_writes_the_summary(tmp_path, capsys):
    write_seed(tmp_path, 0, 0.045, (0.024, 0.069), 0.0005)
    summary = write_summary(tmp_path, [0, 1])
    assert summary["missing"] == [1] and summary["verdict"]["holds"] is None
    config = tmp_path / "adopt.yaml"
    config.write_text(
        f"work_dir: {tmp_path}\nsources:\n  - name: traces\n    searches: s.parquet\n    test: 5\n"
    )
    assert main(["adopt", "--config", str(config), "--summarize-seeds", "0,1"]) == 0, (
        capsys.readouterr().err
    )
    out = capsys.readouterr().out
    assert "undecided" in out and "seeds [1] have not finished" in out
    text = (tmp_path / "seeds.md").read_text()
    assert "| 0 | M3+linear:alpha=0.3 | 0.800 | 0.845 | +0.045 [+0.024, +0.069]" in text
    assert main(["adopt", "--config", str(config), "--summarize-seeds", "0,x"]) == 2


def test_the_reranker_alone_is_reported_per_seed_and_across_beside_the_verdict(tmp_path):
    write_seed(tmp_path, 0, 0.07, (0.04, 0.10), 0.0005, unfused=(-0.034, (-0.092, 0.023), 0.26))
    write_seed(tmp_path, 1, 0.07, (0.04, 0.10), 0.0005, unfused=(0.008, (-0.043, 0.059), 0.75))
    summary = write_summary(tmp_path, [0, 1])
    assert summary["per_seed"][0]["unfused_m3"] == {
        "mean": pytest.approx(0.766),
        "gain": -0.034,
        "ci95": [-0.092, 0.023],
        "p_holm": 0.26,
    }
    assert summary["per_seed"][1]["validation"] == {
        "first_stage": pytest.approx(0.70), "alone": pytest.approx(0.80),
        "stored": pytest.approx(0.73),
    }  # fmt: skip
    gain = summary["across"]["unfused_gain"]
    assert gain["mean"] == pytest.approx(-0.013) and gain["worst"] == pytest.approx(-0.034)
    assert gain["spread"] == pytest.approx(0.042)
    # Beside the verdict, not part of it: a losing reranker alone does not fail the stored claim.
    assert summary["verdict"]["holds"] is True
    text = (tmp_path / "seeds.md").read_text()
    assert "| 0 | 0.800 | 0.766 | -0.034 [-0.092, +0.023] | 0.26 | 0.700 | 0.800 | +0.100 |" in text
    assert "Unfused M3 across 2 seeds: gain mean -0.013, spread 0.042, worst -0.034." in text


def _bands(alone: dict[str, float], fused: dict[str, float]) -> list[dict]:
    first = {"a": 0.3, "b": 0.9, "c": 1.0, "d": 1.0}
    return first_stage_bands({"first_stage": first, "M3": alone, STORED: fused})


def test_searches_banded_by_the_first_stage_are_averaged_over_seeds(tmp_path):
    fused = {"a": 0.5, "b": 0.9, "c": 1.0, "d": 1.0}
    write_seed(
        tmp_path,
        0,
        0.05,
        (0.02, 0.08),
        0.001,
        bands=_bands({"a": 0.9, "b": 0.8, "c": 0.6, "d": 1.0}, fused),
    )
    write_seed(tmp_path, 1, 0.05, (0.02, 0.08), 0.001,
               bands=_bands({"a": 0.7, "b": 1.0, "c": 0.4, "d": 0.6}, fused))  # fmt: skip
    summary = write_summary(tmp_path, [0, 1])
    assert summary["per_seed"][0]["bands"][3] == {
        "band": "= 1", "queries": 2, "first_stage": 1.0, "m3": pytest.approx(0.8),
        "m3_lost": 1, "m3_won": 0, "stored": 1.0, "stored_lost": 0, "stored_won": 0,
    }  # fmt: skip
    perfect = summary["across"]["bands"][3]
    assert perfect["m3"] == pytest.approx(0.65) and perfect["m3_worst"] == pytest.approx(0.5)
    assert perfect["m3_lost"] == pytest.approx(1.5) and perfect["stored"] == 1.0
    low = summary["across"]["bands"][0]
    assert low["m3"] == pytest.approx(0.8) and low["m3_won"] == 1.0
    text = (tmp_path / "seeds.md").read_text()
    assert "| = 1 | 2 | 1.000 | 0.650 | 0.500 | 1.5/0.0 | 1.000 | 0.0 |" in text
    assert "| [0.5, 0.8) | 0 | - | - | - | - | - | - |" in text


def test_seeds_banded_over_different_searches_are_not_averaged(tmp_path):
    write_seed(
        tmp_path,
        0,
        0.05,
        (0.02, 0.08),
        0.001,
        bands=first_stage_bands({"first_stage": {"a": 1.0}, "M3": {"a": 0.5}}),
    )
    write_seed(tmp_path, 1, 0.05, (0.02, 0.08), 0.001,
               bands=first_stage_bands({"first_stage": {"a": 0.2}, "M3": {"a": 0.5}}))  # fmt: skip
    summary = write_summary(tmp_path, [0, 1])
    assert "bands" in summary["per_seed"][1] and "bands" not in summary["across"]
    assert "Where it gains and loses" not in (tmp_path / "seeds.md").read_text()


def test_without_an_unfused_test_row_the_summary_says_nothing_of_it(tmp_path):
    write_seed(tmp_path, 0, 0.045, (0.024, 0.069), 0.0005)
    summary = write_summary(tmp_path, [0])
    assert "unfused_m3" not in summary["per_seed"][0] and "unfused_gain" not in summary["across"]
    assert "unfused" not in (tmp_path / "seeds.md").read_text()


def test_a_seed_that_stored_the_first_stage_order_exempts_the_loop_check(tmp_path):
    """The fit's decision is read where the fit stage writes it (``fitted.decision``)."""
    write_seed(tmp_path, 0, 0.0, (0.0, 0.0), 1.0, fit="pass-through", solved=90)
    summary = summarize_seeds(tmp_path, [0])
    assert summary["per_seed"][0]["fit_decision"] == "pass-through"
    assert summary["checks"]["agent loop: solves as many tasks as BM25 with no more searches"]
