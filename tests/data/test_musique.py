from __future__ import annotations

import json
import re

import pytest

from acare_ray.data import musique
from acare_ray.data.groups import group_stats, searches_to_groups
from acare_ray.data.io import data_dir
from acare_ray.data.schema import parse_search


@pytest.fixture(scope="module", autouse=True)
def musique_dir(require_data):
    """Every test here reads the MuSiQue files under ACARE_DATA_DIR."""
    return require_data(data_dir() / "musique")


@pytest.fixture(scope="module")
def records():
    return musique.load_musique()


@pytest.fixture(scope="module")
def rows(records):
    return musique.musique_searches(records=records).to_pylist()


@pytest.fixture(scope="module")
def open_table(records):
    return musique.musique_searches("open", records=records)


def test_load_musique_dedupes_to_649_questions_with_their_split(records):
    assert len(records) == len({r["id"] for r in records}) == 649
    splits = [r["split"] for r in records]
    assert splits.count("dev") == 549 and splits.count("train") == 100


def test_one_search_per_step_each_valid(records, rows):
    assert len(rows) == sum(len(r["question_decomposition"]) for r in records)
    for index, row in enumerate(rows):
        parse_search(row, index)
    assert len({r["search_id"] for r in rows}) == len(rows)


def test_each_step_gold_paragraph_is_its_only_relevant_candidate(records, rows):
    by_id = {r["search_id"]: r for r in rows}
    for record in records:
        for k, step in enumerate(record["question_decomposition"]):
            row = by_id[f"{record['id']}:s{k + 1}"]
            relevant = [c["doc_id"] for c in row["candidates"] if c["relevance"] == 1]
            assert relevant == [f"{record['id']}:{step['paragraph_support_idx']}"]
            assert row["answer"] == step["answer"] and row["session_id"] == record["id"]
            assert row["split"] == record["split"] and row["question"] == record["question"]


def test_candidates_are_the_question_paragraphs_with_title(records, rows):
    first = {r["session_id"]: r for r in reversed(rows)}
    for record in records:
        texts = [c["text"] for c in first[record["id"]]["candidates"]]
        assert texts == [f"{p['title']}\n{p['paragraph_text']}" for p in record["paragraphs"]]
        supporting = [
            f"{record['id']}:{p['idx']}" for p in record["paragraphs"] if p["is_supporting"]
        ]
        assert first[record["id"]]["supporting_docs"] == supporting


def test_no_reasoning_contains_its_own_step_answer(rows):
    for row in rows:
        assert row["answer"].lower() not in row["reasoning"].lower(), row["search_id"]
        assert row["reasoning_source"] == "synthetic"


def test_first_step_reasoning_is_a_plan_without_any_answer(records, rows):
    by_id = {r["search_id"]: r for r in rows}
    for record in records:
        plan = by_id[f"{record['id']}:s1"]["reasoning"].lower()
        for step in record["question_decomposition"]:
            assert step["answer"].lower() not in plan, record["id"]


def test_later_reasoning_states_earlier_answers(records, rows):
    by_id = {r["search_id"]: r for r in rows}
    record = next(r for r in records if r["id"] == "2hop__574419_270105")
    reasoning = by_id["2hop__574419_270105:s2"]["reasoning"]
    assert record["question_decomposition"][0]["answer"] in reasoning  # Mountrail County


def test_sub_queries_substitute_answers_and_flatten_relations(rows):
    for row in rows:
        assert not re.search(r"#\d", row["sub_query"]), row["search_id"]
        assert ">>" not in row["sub_query"], row["search_id"]
    by_id = {r["search_id"]: r for r in rows}
    assert by_id["2hop__574419_270105:s2"]["sub_query"] == "Mountrail County capital"


def test_resolve_step_handles_both_step_styles():
    assert musique.resolve_step("#1 >> capital", ["Mountrail County"]) == "Mountrail County capital"
    assert (
        musique.resolve_step("Who is the spouse of #2?", ["a", "Ann"])
        == "Who is the spouse of Ann?"
    )
    with pytest.raises(ValueError, match="#2"):
        musique.resolve_step("#2 >> father", ["only one"])


def test_synthetic_reasoning_drops_a_sentence_that_would_reveal_the_answer():
    steps = [
        {"question": "Plainfield >> country", "answer": "Stanley County"},
        {"question": "Who is the mayor of Plainfield?", "answer": "Stanley"},
    ]
    reasoning = musique.synthetic_reasoning(steps, 1, ["Stanley County"])
    assert reasoning == "Next I need to find out: Who is the mayor of Plainfield?"
    steps[1]["question"] = "#1 >> capital"
    reasoning = musique.synthetic_reasoning(steps, 1, ["Stanley County"])
    assert "stanley" not in reasoning.lower() and reasoning


def test_conflicting_copies_of_one_question_raise(tmp_path, musique_dir):
    root = tmp_path / "musique"
    for name, _, _ in musique.FILES:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
    record = json.loads((musique_dir / musique.FILES[0][0]).read_text().split("\n")[0])
    (root / musique.FILES[0][0]).write_text(json.dumps(record) + "\n")
    changed = {**record, "answer": "something else"}
    for name, _, _ in musique.FILES[1:]:
        (root / name).write_text(json.dumps([changed if name == musique.FILES[1][0] else record]))
    with pytest.raises(ValueError, match=f"id={record['id']} differs"):
        musique.load_musique(tmp_path)


def test_open_setting_ranks_pooled_paragraphs_by_bm25(open_table, rows):
    recall = json.loads(open_table.schema.metadata[musique.RECALL_KEY])
    open_rows = open_table.to_pylist()
    found = sum(any(c["relevance"] for c in r["candidates"]) for r in open_rows)
    assert recall == {"k": 100, "recall": found / len(open_rows)}
    assert 0.8 < recall["recall"] < 1.0  # BM25 misses some gold paragraphs; that is reported
    for row in open_rows:
        scores = [c["first_stage_score"] for c in row["candidates"]]
        assert len(scores) == 100 and scores == sorted(scores, reverse=True)
        assert len({c["doc_id"] for c in row["candidates"]}) == 100
        assert sum(c["relevance"] for c in row["candidates"]) <= 1


def test_open_setting_pool_holds_each_paragraph_text_once(open_table):
    text_to_id = {}
    for row in open_table.to_pylist():
        for c in row["candidates"]:
            assert text_to_id.setdefault(c["text"], c["doc_id"]) == c["doc_id"]


def test_groups_from_distractor_setting_sample_seeded_negatives(rows):
    table = musique.musique_searches(records=musique.load_musique())
    groups = searches_to_groups(table, negatives=7, seed=0)
    stats = group_stats(groups)
    assert stats.groups == len(rows) and stats.no_positive == stats.too_few_negatives == 0
    gold = {r["search_id"]: next(c for c in r["candidates"] if c["relevance"]) for r in rows}
    for group in groups.to_pylist():
        assert group["positive"]["doc_id"] == gold[group["group_id"]]["doc_id"]
        negative_ids = [d["doc_id"] for d in group["negatives"]]
        assert len(set(negative_ids)) == 7 and gold[group["group_id"]]["doc_id"] not in negative_ids
    assert groups.equals(searches_to_groups(table, negatives=7, seed=0))
    assert not groups.equals(searches_to_groups(table, negatives=7, seed=1))


def test_groups_from_open_setting_take_the_hardest_negatives(open_table):
    groups = searches_to_groups(open_table)
    stats = group_stats(groups)
    assert stats.no_positive == stats.searches - stats.groups > 0
    by_id = {r["search_id"]: r for r in open_table.to_pylist()}
    for group in groups.to_pylist()[:50]:
        ranked = [c["doc_id"] for c in by_id[group["group_id"]]["candidates"] if not c["relevance"]]
        assert [d["doc_id"] for d in group["negatives"]] == ranked[:7]
