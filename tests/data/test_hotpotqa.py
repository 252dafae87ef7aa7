"""HotpotQA -> synthetic agent searches with BM25 first-stage scores and page-level labels."""

from __future__ import annotations

import pytest

from acare_ray.data.bm25 import BM25Index
from acare_ray.data.groups import group_stats, searches_to_groups
from acare_ray.data.hotpotqa import hotpotqa_searches, keyword_query, load_hotpotqa
from acare_ray.data.io import data_dir


def _record(qid, question, answer, gold, distractors):
    context = [[t, [f"{t} sentence one. ", f"{t} sentence two."]] for t in gold + distractors]
    return {
        "id": qid,
        "question": question,
        "answer": answer,
        "supporting_facts": [[gold[0], 0], [gold[1], 1]] if len(gold) > 1 else [[gold[0], 0]],
        "context": context,
    }


RECORDS = [
    _record(
        "q1",
        "Which river flows through the capital of Austria?",
        "Danube",
        ["Vienna", "Danube"],
        ["Salzburg", "Rhine", "Graz"],
    ),
    _record(
        "q2",
        "Who painted the ceiling of the Sistine Chapel?",
        "Michelangelo",
        ["Sistine Chapel"],
        ["Raphael", "Vatican"],
    ),
]


def test_searches_follow_the_documented_conventions():
    table = hotpotqa_searches(records=RECORDS, k=3)
    rows = {r["search_id"]: r for r in table.to_pylist()}
    assert sorted(rows) == ["q1:s1", "q1:s2", "q2:s1"]  # q2 has one gold page: one search
    first, second = rows["q1:s1"], rows["q1:s2"]
    assert first["sub_query"] == keyword_query(RECORDS[0]["question"])
    assert first["sub_query"] == "river flows through capital Austria"
    assert second["sub_query"] == "Danube"
    assert "Vienna sentence one." in second["reasoning"]
    assert "danube" not in first["reasoning"].lower()
    for row in rows.values():
        assert row["reasoning_source"] == "synthetic" and row["session_id"] == row["search_id"][:2]
        ids = [c["doc_id"] for c in row["candidates"]]
        assert len(ids) == len(set(ids))
    labels = {c["doc_id"]: c["relevance"] for c in first["candidates"]}
    assert labels["Vienna"] == labels["Danube"] == 1 and labels["Rhine"] == 0
    pool = [t for r in RECORDS for t, _ in r["context"]]
    texts = [f"{t}\n{t} sentence one. {t} sentence two." for t in pool]
    index = BM25Index(texts)
    for c in second["candidates"]:
        expected = index.scores("Danube", [pool.index(c["doc_id"])])[0]
        assert c["first_stage_score"] == pytest.approx(expected)
        assert c["text"] == texts[pool.index(c["doc_id"])]


def test_the_answer_never_leaks_into_the_reasoning():
    record = _record(
        "q3",
        "Where was the author of Dune born?",
        "Tacoma",
        ["Dune (novel)", "Frank Herbert"],
        ["Arrakis", "Seattle"],
    )
    record["context"][0][1][0] = "Dune was written by Frank Herbert of Tacoma. "
    rows = hotpotqa_searches(records=[record], k=2).to_pylist()
    assert all("tacoma" not in r["reasoning"].lower() for r in rows)


def test_the_shared_dataset_converts_and_gives_groups(require_data):
    require_data(data_dir() / "hotpotqa")
    records = load_hotpotqa()
    assert len(records) == 1222
    table = hotpotqa_searches(records=records[:200])
    groups = searches_to_groups(table, negatives=7, seed=0, hard=3)
    stats = group_stats(groups)
    assert stats.groups > stats.searches > 200 and stats.no_positive == 0
    assert all(
        c["first_stage_score"] is not None for r in table.to_pylist() for c in r["candidates"]
    )
