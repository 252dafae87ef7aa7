"""Self-mined hard negatives (``acare adopt``'s ``mine`` stage), without Ray or a model: the
miner's scores decide which negatives are hard, and the stage's figures count what changed."""

from __future__ import annotations

import pyarrow as pa

from acare_ray.adopt.stages import _mined_signal, answer_signal, with_miner_scores
from acare_ray.data.groups import searches_to_groups
from acare_ray.data.synthetic import synthetic_searches


def _miner(table, favourite: dict[str, list[str]]):
    """Scores that put each search's ``favourite`` negatives on top, in that order, and the
    positive just below them."""
    scores = {}
    for row in table.to_pylist():
        top = favourite.get(row["search_id"], [])
        scores[row["search_id"]] = {
            c["doc_id"]: (10.0 - top.index(c["doc_id"]) if c["doc_id"] in top
                          else 5.0 if c["relevance"] else -float(i))
            for i, c in enumerate(row["candidates"])
        }  # fmt: skip
    return scores


def test_the_miners_highest_scored_negatives_become_the_hard_ones():
    table = synthetic_searches(6, seed=3)
    rows = table.to_pylist()
    # The miner prefers the negatives the first stage ranks lowest.
    favourite = {
        row["search_id"]: [c["doc_id"] for c in sorted(
            (c for c in row["candidates"] if c["relevance"] == 0),
            key=lambda c: c["first_stage_score"])][:3]
        for row in rows
    }  # fmt: skip
    scores = _miner(table, favourite)
    first_stage = searches_to_groups(table, 7, seed=0, hard=3)
    mined = searches_to_groups(with_miner_scores(table, scores), 7, seed=0, hard=3)
    assert mined.num_rows == first_stage.num_rows > 0
    for group in mined.to_pylist():
        search = group["group_id"].rsplit("#", 1)[0]
        assert [d["doc_id"] for d in group["negatives"][:3]] == favourite[search]
        assert group["positive"]["doc_id"] not in {d["doc_id"] for d in group["negatives"]}
    signal = _mined_signal(mined, first_stage, scores, hard=3)
    # The miner puts three negatives above every positive; the first stage's hard ones differ.
    assert signal["positive_below_hardest"] == 1.0
    assert signal["hard_shared_with_first_stage"] < 0.5


def test_skip_leaves_out_the_miners_favourite_and_takes_the_next_ones():
    """A round with skip=1 never trains against the miner's top-scored negative (the likely
    unjudged positive); its hard negatives are the miner's next three."""
    table = synthetic_searches(6, seed=3)
    favourite = {
        row["search_id"]: [c["doc_id"] for c in row["candidates"] if c["relevance"] == 0][:4]
        for row in table.to_pylist()
    }  # fmt: skip
    scores = _miner(table, favourite)
    mined = searches_to_groups(with_miner_scores(table, scores), 7, seed=0, hard=3, skip=1)
    assert mined.num_rows > 0
    for group in mined.to_pylist():
        search = group["group_id"].rsplit("#", 1)[0]
        negatives = [d["doc_id"] for d in group["negatives"]]
        assert negatives[:3] == favourite[search][1:4]
        assert favourite[search][0] not in negatives


def test_a_search_the_miner_could_not_score_keeps_its_first_stage_negatives():
    table = synthetic_searches(4, seed=5)
    unscored = table.column("search_id")[0].as_py()
    scores = {k: v for k, v in _miner(table, {}).items() if k != unscored}
    mined = with_miner_scores(table, scores).to_pylist()
    kept = next(r for r in mined if r["search_id"] == unscored)
    original = next(r for r in table.to_pylist() if r["search_id"] == unscored)
    assert kept["candidates"] == original["candidates"]
    assert all(
        c["first_stage_score"] == scores[r["search_id"]][c["doc_id"]]
        for r in mined if r["search_id"] != unscored for c in r["candidates"]
    )  # fmt: skip


def test_when_the_miner_agrees_with_the_first_stage_nothing_is_learned_from_it():
    table = synthetic_searches(5, seed=7)
    # The miner scores as the first stage does, positives on top: no errors, the same negatives.
    scores = {
        row["search_id"]: {c["doc_id"]: c["first_stage_score"] + (10.0 if c["relevance"] else 0)
                           for c in row["candidates"]}
        for row in table.to_pylist()
    }  # fmt: skip
    first_stage = searches_to_groups(table, 7, seed=0, hard=3)
    mined = searches_to_groups(with_miner_scores(table, scores), 7, seed=0, hard=3)
    signal = _mined_signal(mined, first_stage, scores, hard=3)
    assert signal["positive_below_hardest"] == 0.0
    assert signal["hard_shared_with_first_stage"] == 1.0


def test_the_answer_signal_counts_negatives_that_name_the_answer():
    """A negative whose text names the question's answer (case and spacing aside) counts as
    answer-bearing: for the miner's top one, the mined hard ones and the first stage's; a yes/no
    answer says nothing and its search is left out."""
    rows = synthetic_searches(4, seed=3).to_pylist()
    rows[-1]["answer"] = "Yes"
    hit = {}
    for row in rows[:-1]:
        negatives = [c for c in row["candidates"] if c["relevance"] == 0]
        # The miner's favourite names the answer (with other case and spacing); the rest do not.
        negatives[0]["text"] += " It is  " + row["answer"].upper() + "."
        hit[row["search_id"]] = negatives[0]["doc_id"]
        for c in negatives[1:]:
            assert row["answer"].lower() not in c["text"].lower()
    table = pa.Table.from_pylist(rows, schema=synthetic_searches(1).schema)
    scores = _miner(table, {s: [d] for s, d in hit.items()})
    mined_table = with_miner_scores(table, scores)
    mined = searches_to_groups(mined_table, 7, seed=0, hard=3)
    skipped = searches_to_groups(mined_table, 7, seed=0, hard=3, skip=1)
    first_stage = searches_to_groups(table, 7, seed=0, hard=3)
    signal = answer_signal(mined_table, mined, first_stage, hard=3)
    assert signal["answer_searches"] == len(rows) - 1
    assert signal["miner_top_negative_with_answer"] == 1.0
    assert signal["hard_with_answer"] == 1 / 3  # one of the three hard negatives per group
    # The first stage's hard negatives name the answer exactly where they hold the favourite.
    expected = sum(
        hit.get(g["group_id"].rsplit("#", 1)[0]) in {d["doc_id"] for d in g["negatives"][:3]}
        for g in first_stage.to_pylist()
        if g["group_id"].rsplit("#", 1)[0] in hit
    ) / (3 * sum(g["group_id"].rsplit("#", 1)[0] in hit for g in first_stage.to_pylist()))
    assert signal["first_stage_hard_with_answer"] == expected
    assert answer_signal(mined_table, skipped, first_stage, hard=3)["hard_with_answer"] == 0.0
