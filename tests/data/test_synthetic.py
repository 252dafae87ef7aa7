from __future__ import annotations

import numpy as np
import pytest

from acare_ray.data.groups import group_stats
from acare_ray.data.schema import parse_search
from acare_ray.data.synthetic import synthetic_groups, synthetic_searches, words

STOP = {"the", "of", "a", "in", "is", "its", "and", "to", "i", "that", "this", "which", "what"}


@pytest.fixture(scope="module")
def rows():
    return synthetic_searches(120, seed=5).to_pylist()


def test_same_seed_same_data_other_seed_other_data():
    assert synthetic_searches(8, seed=1).equals(synthetic_searches(8, seed=1))
    assert not synthetic_searches(8, seed=1).equals(synthetic_searches(8, seed=2))


def test_first_sessions_do_not_depend_on_how_many_are_drawn():
    small = synthetic_searches(4, seed=0)
    assert synthetic_searches(9, seed=0).slice(0, small.num_rows).equals(small)


def test_searches_are_valid_with_twenty_candidates_and_one_relevant(rows):
    for index, row in enumerate(rows):
        search = parse_search(row, index)
        assert len(search.candidates) == 20
        assert len({c.doc_id for c in search.candidates}) == 20
        assert [c.relevance for c in search.candidates].count(1) == 1
        assert search.context.richest_mode.value == "M3"
        assert all(len(c.text.split()) < 200 for c in search.candidates)
    assert {r["step"] for r in rows} == {1, 2, 3}


def test_sub_query_keywords_alone_cannot_pick_the_gold(rows):
    for row in rows:
        keys = words(row["sub_query"])
        full = [c for c in row["candidates"] if keys <= words(c["text"])]
        assert len(full) >= 2 and any(c["relevance"] == 1 for c in full), row["search_id"]
        if row["step"] > 1:
            assert len(full) >= 12, row["search_id"]


def test_reasoning_never_holds_the_answer_but_names_the_step_before(rows):
    by_id = {r["search_id"]: r for r in rows}
    for row in rows:
        assert row["answer"].lower() not in row["reasoning"].lower(), row["search_id"]
        if row["step"] > 1:
            before = by_id[f"{row['session_id']}:s{row['step'] - 1}"]
            assert before["answer"] in row["reasoning"]


def _mrr(rows, fields):
    """Expected reciprocal rank of the gold under distinct-word overlap, ties broken at random."""
    ranks = []
    for row in rows:
        context = set().union(*(words(row[f]) for f in fields)) - STOP
        scores = np.array([len(context & words(c["text"])) for c in row["candidates"]])
        gold = next(i for i, c in enumerate(row["candidates"]) if c["relevance"])
        better, ties = (scores > scores[gold]).sum(), (scores == scores[gold]).sum() - 1
        ranks.append(np.mean([1 / (better + 1 + t) for t in range(ties + 1)]))
    return float(np.mean(ranks))


def test_context_decides_relevance_for_a_word_overlap_ranker(rows):
    later = [r for r in rows if r["step"] > 1]
    m0 = _mrr(later, ["sub_query"])
    m2 = _mrr(later, ["sub_query", "question"])
    m3 = _mrr(later, ["sub_query", "question", "reasoning"])
    assert m0 < 0.3 < m2 + 0.05 and m2 + 0.2 < m3


def test_synthetic_groups_have_seven_negatives_per_search():
    groups = synthetic_groups(10, seed=0)
    stats = group_stats(groups)
    assert stats.groups == stats.searches and stats.too_few_negatives == 0
    assert all(len(g["negatives"]) == 7 for g in groups.to_pylist())
