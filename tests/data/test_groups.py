from __future__ import annotations

import pyarrow as pa
import pytest

from acare_ray.data.groups import group_stats, searches_to_groups
from acare_ray.data.schema import SEARCHES, TRAINING_GROUPS


def _search(search_id, relevances, scores=None, **extra):
    scores = scores or [None] * len(relevances)
    candidates = [
        {"doc_id": f"{search_id}-d{i}", "text": f"text {i}", "first_stage_score": s, "relevance": r}
        for i, (r, s) in enumerate(zip(relevances, scores, strict=True))
    ]
    return {"search_id": search_id, "sub_query": "q", "candidates": candidates, **extra}


def _table(*rows):
    return pa.Table.from_pylist(list(rows), schema=SEARCHES)


def test_negatives_are_the_highest_scored_non_relevant_candidates():
    scores = [0.1, 9.0, 5.0, 7.0, 1.0, 3.0, 8.0, 2.0, 6.0, 4.0]
    rels = [0, 1, 0, 0, 0, 0, 0, 0, 0, 0]
    group = searches_to_groups(_table(_search("s", rels, scores)), negatives=3).to_pylist()[0]
    assert group["positive"]["doc_id"] == "s-d1"
    assert [d["doc_id"] for d in group["negatives"]] == ["s-d6", "s-d3", "s-d8"]
    assert group["session_id"] == "s"  # falls back to the search id


def test_unscored_negatives_are_a_seeded_sample_that_repeats():
    table = _table(_search("s", [1] + [0] * 15))
    first = searches_to_groups(table, seed=3).to_pylist()[0]["negatives"]
    assert first == searches_to_groups(table, seed=3).to_pylist()[0]["negatives"]
    draws = {
        tuple(d["doc_id"] for d in searches_to_groups(table, seed=s).to_pylist()[0]["negatives"])
        for s in range(5)
    }
    assert len(first) == 7 and len(draws) > 1


def test_skipped_searches_are_counted_not_lost():
    table = _table(
        _search("ok", [1] + [0] * 7),
        _search("nopos", [0] * 8),
        _search("few", [1] + [0] * 6),
        _search("unjudged", [1] + [None] * 9),
        _search("failed", [1] + [0] * 7, judge_ok=False),
    )
    groups = searches_to_groups(table)
    assert groups.column("group_id").to_pylist() == ["ok"]
    assert group_stats(groups).__dict__ == {
        "searches": 5,
        "groups": 1,
        "no_positive": 1,
        "too_few_negatives": 2,
        "failed_trajectory": 1,
    }
    assert groups.schema.equals(TRAINING_GROUPS)


def test_each_positive_gets_its_own_group():
    groups = searches_to_groups(_table(_search("s", [1, 0, 2, 0, 0])), negatives=3)
    assert groups.column("group_id").to_pylist() == ["s#0", "s#1"]
    assert [g["positive"]["doc_id"] for g in groups.to_pylist()] == ["s-d0", "s-d2"]


def test_bad_search_row_raises_with_its_name():
    with pytest.raises(ValueError, match=r"search_id=s: candidates\[0\]\.text is empty"):
        searches_to_groups(
            _table(
                {"search_id": "s", "sub_query": "q", "candidates": [{"doc_id": "d", "text": ""}]}
            )
        )
    with pytest.raises(ValueError, match="statistics"):
        group_stats(pa.Table.from_pylist([], schema=TRAINING_GROUPS))


def test_hard_negatives_are_the_top_scored_and_the_rest_a_seeded_sample():
    """hard=k: the k highest first-stage scores, then a seeded sample of the other non-relevant
    candidates (never the easiest-first order the all-hard rule would give)."""
    scores = [float(s) for s in range(20)]  # d19 is the hardest
    rels = [1] + [0] * 19
    table = _table(_search("s", rels, scores))
    picks = {
        seed: [
            d["doc_id"]
            for d in searches_to_groups(table, 7, seed, hard=3).to_pylist()[0]["negatives"]
        ]
        for seed in range(4)
    }
    for chosen in picks.values():
        assert chosen[:3] == ["s-d19", "s-d18", "s-d17"]
        assert len(set(chosen)) == 7 and "s-d0" not in chosen
        assert not set(chosen[3:]) & {"s-d19", "s-d18", "s-d17"}
    assert len({tuple(c[3:]) for c in picks.values()}) > 1  # the random part depends on the seed
    assert (
        searches_to_groups(table, 7, 1, hard=3).to_pylist()
        == searches_to_groups(table, 7, 1, hard=3).to_pylist()
    )
    all_hard = searches_to_groups(table, 7, 0, hard=7).to_pylist()[0]["negatives"]
    assert [d["doc_id"] for d in all_hard] == [f"s-d{i}" for i in range(19, 12, -1)]
    with pytest.raises(ValueError, match="hard must be in 0..negatives"):
        searches_to_groups(table, 7, 0, hard=8)


def test_skip_leaves_the_top_scored_negatives_out_of_the_group_altogether():
    """skip=k: the k highest-scored non-relevant candidates are never used, neither as hard
    negatives nor in the random sample; the hard ones are the next k+1..k+hard."""
    scores = [float(s) for s in range(20)]  # d19 is the hardest
    table = _table(_search("s", [1] + [0] * 19, scores))
    for seed in range(4):
        chosen = [
            d["doc_id"]
            for d in searches_to_groups(table, 7, seed, hard=3, skip=2).to_pylist()[0]["negatives"]
        ]
        assert chosen[:3] == ["s-d17", "s-d16", "s-d15"]
        assert len(set(chosen)) == 7 and not set(chosen) & {"s-d19", "s-d18", "s-d0"}
    # The skipped negatives no longer count: 9 negatives, skip 2 leaves 7, skip 3 too few.
    small = _table(_search("t", [1] + [0] * 9, [float(s) for s in range(10)]))
    assert searches_to_groups(small, 7, 0, hard=3, skip=2).num_rows == 1
    assert searches_to_groups(small, 7, 0, hard=3, skip=3).num_rows == 0
    assert group_stats(searches_to_groups(small, 7, 0, hard=3, skip=3)).too_few_negatives == 1
    with pytest.raises(ValueError, match="skip must be >= 0"):
        searches_to_groups(table, 7, 0, hard=3, skip=-1)


def test_with_bm25_scores_scores_each_candidate_for_its_own_sub_query():
    from acare_ray.data.bm25 import BM25Index
    from acare_ray.data.groups import with_bm25_scores

    rows = [
        {
            "search_id": "a",
            "sub_query": "volcano eruption",
            "candidates": [
                {"doc_id": "1", "text": "a volcano eruption in Iceland", "relevance": 1},
                {"doc_id": "2", "text": "cheese making in France", "relevance": 0},
            ],
        },
        {
            "search_id": "b",
            "sub_query": "cheese",
            "candidates": [
                {"doc_id": "2", "text": "cheese making in France", "relevance": 1},
                {"doc_id": "3", "text": "the volcano of Etna", "relevance": 0},
            ],
        },
    ]
    scored = with_bm25_scores(_table(*rows)).to_pylist()
    pool = ["a volcano eruption in Iceland", "cheese making in France", "the volcano of Etna"]
    index = BM25Index(pool)
    assert [c["first_stage_score"] for c in scored[0]["candidates"]] == pytest.approx(
        list(index.scores("volcano eruption", [0, 1]))
    )
    assert [c["first_stage_score"] for c in scored[1]["candidates"]] == pytest.approx(
        list(index.scores("cheese", [1, 2]))
    )
    assert scored[0]["candidates"][0]["first_stage_score"] > 0
    assert scored[0]["candidates"][1]["first_stage_score"] == 0
