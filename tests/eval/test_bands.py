"""Searches banded by the first stage's own score (acare_ray.eval.bands)."""

from __future__ import annotations

import pytest

from acare_ray.eval.bands import bands_markdown, first_stage_bands

FIRST = {"a": 0.2, "b": 0.6, "c": 0.9, "d": 1.0, "e": 1.0}
RERANKED = {"a": 0.7, "b": 0.6, "c": 0.5, "d": 1.0, "e": 0.4}


def test_bands_split_by_the_baseline_and_count_losses_and_wins():
    bands = first_stage_bands({"first_stage": FIRST, "M3": RERANKED})
    assert [b["band"] for b in bands] == ["[0, 0.5)", "[0.5, 0.8)", "[0.8, 1)", "= 1"]
    assert [b["queries"] for b in bands] == [1, 1, 1, 2]
    perfect = bands[3]
    assert perfect["mean"] == {"first_stage": 1.0, "M3": pytest.approx(0.7)}
    assert perfect["lost"]["M3"] == 1 and perfect["won"]["M3"] == 0
    assert bands[0]["won"]["M3"] == 1 and bands[1]["lost"]["M3"] == bands[1]["won"]["M3"] == 0
    assert bands[2]["lost"]["M3"] == 1
    assert sum(b["queries"] for b in bands) == len(FIRST)


def test_band_means_weighted_by_size_give_the_overall_mean():
    bands = first_stage_bands({"first_stage": FIRST, "M3": RERANKED})
    total = sum(b["mean"]["M3"] * b["queries"] for b in bands if b["queries"])
    assert total / len(RERANKED) == pytest.approx(sum(RERANKED.values()) / len(RERANKED))


def test_edge_values_fall_in_the_upper_band():
    bands = first_stage_bands({"first_stage": {"x": 0.5, "y": 0.8}}, edges=(0.5, 0.8, 1.0))
    assert [b["queries"] for b in bands] == [0, 1, 1, 0]
    assert bands[0]["mean"] == {} and bands[3]["high"] is None


def test_a_system_missing_a_search_is_named():
    with pytest.raises(ValueError, match="'M3' has no value for search 'e'"):
        first_stage_bands(
            {"first_stage": FIRST, "M3": {k: v for k, v in RERANKED.items() if k != "e"}}
        )


@pytest.mark.parametrize("edges", [(), (0.8, 0.5, 1.0), (0.5, 0.5, 1.0), (0.0, 1.0)])
def test_bad_edges_are_refused(edges):
    with pytest.raises(ValueError, match="band edges"):
        first_stage_bands({"first_stage": FIRST}, edges=edges)


def test_unknown_baseline_is_refused():
    with pytest.raises(ValueError, match="baseline system 'bm25'"):
        first_stage_bands({"first_stage": FIRST}, baseline="bm25")


def test_markdown_has_a_row_per_band_and_marks_empty_ones():
    bands = first_stage_bands({"first_stage": {"x": 0.2}, "M3": {"x": 0.4}})
    lines = bands_markdown(bands, ["M3", "first_stage"], "first_stage")
    assert lines[0] == "| first_stage band | searches | first_stage | M3 |"
    assert lines[2] == "| [0, 0.5) | 1 | 0.200 | 0.400 (0/1) |"
    assert lines[5] == "| = 1 | 0 | - | - |"
