from __future__ import annotations

import copy

import numpy as np
import pyarrow as pa
import pytest

from acare_ray.data.schema import (
    RERANK_OUTPUT,
    SEARCHES,
    TRAINING_GROUPS,
    RowError,
    error_row,
    parse_group,
    parse_search,
    rerank_row,
)
from acare_ray.scoring import Mode


def _row(**overrides):
    row = {
        "search_id": "s1",
        "session_id": "sess",
        "sub_query": "capital population",
        "question": "How many people live in the capital?",
        "reasoning": None,
        "candidates": [
            {"doc_id": f"d{i}", "text": f"doc {i}", "first_stage_score": None, "relevance": i % 2}
            for i in range(4)
        ],
        "answer": None,
        "supporting_docs": ["d1"],
        "judge_ok": None,
    }
    row.update(overrides)
    return row


def _batch_forms(rows):
    """The same rows as Ray Data hands them over: pylist, pandas records, numpy batch rows."""
    table = pa.Table.from_pylist(rows, schema=SEARCHES)
    pandas_rows = table.to_pandas().to_dict("records")
    columns = {c: table[c].to_numpy(zero_copy_only=False) for c in table.column_names}
    numpy_rows = [{c: columns[c][i] for c in columns} for i in range(table.num_rows)]
    return {"pylist": table.to_pylist(), "pandas": pandas_rows, "numpy": numpy_rows}


def test_schemas_have_the_design_columns_and_types():
    cand = SEARCHES.field("candidates").type.value_type
    assert [cand.field(i).name for i in range(cand.num_fields)] == [
        "doc_id",
        "text",
        "first_stage_score",
        "relevance",
        "first_stage_rank",
    ]
    assert cand.field("relevance").type == pa.int32()
    assert SEARCHES.field("judge_ok").type == pa.bool_()
    assert SEARCHES.field("instruction").type == pa.string()
    ranked = RERANK_OUTPUT.field("ranking").type.value_type
    assert ranked.field("score").type == pa.float32() and ranked.field("rank").type == pa.int32()
    assert ranked.field("fused").type == pa.float64()
    assert RERANK_OUTPUT.field("fusion").type == pa.string()
    assert TRAINING_GROUPS.names == [
        "group_id",
        "session_id",
        "sub_query",
        "question",
        "reasoning",
        "positive",
        "negatives",
        "instruction",
    ]


@pytest.mark.parametrize("form", ["pylist", "pandas", "numpy"])
def test_parse_search_reads_every_batch_form_alike(form):
    rows = [_row(), _row(search_id="s2", question=None, judge_ok=False)]
    parsed = [parse_search(r, i) for i, r in enumerate(_batch_forms(rows)[form])]
    expected = [parse_search(r, i) for i, r in enumerate(rows)]
    assert parsed == expected
    assert parsed[1].context.question is None  # pandas turns a null string into NaN
    assert parsed[0].candidates[1].relevance == 1 and parsed[1].judge_ok is False
    assert parsed[0].supporting_docs == ("d1",)


def test_parse_search_treats_numpy_nan_labels_as_absent():
    candidates = [
        {"doc_id": "d", "text": "t", "first_stage_score": np.float32("nan"), "relevance": np.nan}
    ]
    candidate = parse_search(_row(candidates=candidates)).candidates[0]
    assert candidate.first_stage_score is None and candidate.relevance is None


def test_parse_search_accepts_a_one_megabyte_document():
    big = "word " * 200_000
    search = parse_search(_row(candidates=[{"doc_id": "d", "text": big}]))
    assert len(search.candidates[0].text) == 1_000_000


def _set_candidate(index, **fields):
    def mutate(row):
        row["candidates"][index].update(fields)

    return mutate


def _drop_candidate_key(index, key):
    def mutate(row):
        del row["candidates"][index][key]

    return mutate


BAD_ROWS = [
    (lambda r: r.pop("search_id"), "row 0: search_id is missing"),
    (lambda r: r.update(search_id=7), "row 0: search_id must be a string, got int"),
    (lambda r: r.pop("sub_query"), "search_id=s1: sub_query is missing"),
    (lambda r: r.update(sub_query="   "), "search_id=s1: sub_query is empty"),
    (lambda r: r.update(question=3), "search_id=s1: question must be a string, got int"),
    (lambda r: r.update(candidates=None), "search_id=s1: candidates is missing"),
    (lambda r: r.update(candidates=[]), "search_id=s1: candidates is empty"),
    (lambda r: r.update(candidates="d0"), "search_id=s1: candidates must be a list, got str"),
    (_set_candidate(3, text=""), "search_id=s1: candidates[3].text is empty"),
    (_set_candidate(1, text=None), "search_id=s1: candidates[1].text is missing"),
    (_drop_candidate_key(2, "doc_id"), "search_id=s1: candidates[2].doc_id is missing"),
    (_set_candidate(0, doc_id=5), "search_id=s1: candidates[0].doc_id must be a string, got int"),
    (_set_candidate(0, relevance=0.5), "search_id=s1: candidates[0].relevance must be an integer"),
    (
        _set_candidate(0, relevance="yes"),
        "search_id=s1: candidates[0].relevance must be an integer",
    ),
    (
        _set_candidate(2, first_stage_score="high"),
        "search_id=s1: candidates[2].first_stage_score must be a number",
    ),
    (lambda r: r.update(judge_ok="yes"), "search_id=s1: judge_ok must be a bool, got str"),
    (lambda r: r.update(supporting_docs=[""]), "search_id=s1: supporting_docs[0] is empty"),
]


@pytest.mark.parametrize(("mutate", "message"), BAD_ROWS)
def test_parse_search_names_row_and_field_of_bad_input(mutate, message):
    row = copy.deepcopy(_row())
    mutate(row)
    with pytest.raises(RowError) as err:
        parse_search(row, index=0)
    assert str(err.value).startswith(message)


def test_parse_search_without_index_or_id_still_says_which_field():
    with pytest.raises(RowError, match=r"^search_id=<missing>: search_id is missing$"):
        parse_search(_row(search_id=None))
    with pytest.raises(RowError, match=r"candidates\[0\] must be a struct"):
        parse_search(_row(candidates=["just text"]))


@pytest.mark.parametrize("form", ["pandas", "numpy"])
def test_parse_search_reports_empty_text_from_a_numpy_batch(form):
    rows = [_row(), _row(search_id="bad")]
    rows[1]["candidates"][3]["text"] = ""
    batch = _batch_forms(rows)[form]
    parse_search(batch[0], 0)
    with pytest.raises(RowError, match=r"^search_id=bad: candidates\[3\]\.text is empty$"):
        parse_search(batch[1], 1)


def _group(**overrides):
    row = {
        "group_id": "g1",
        "session_id": "sess",
        "sub_query": "capital",
        "question": None,
        "reasoning": "I found Ruritania.",
        "positive": {"doc_id": "p", "text": "positive"},
        "negatives": [{"doc_id": f"n{i}", "text": f"negative {i}"} for i in range(7)],
    }
    row.update(overrides)
    return row


def test_parse_group_reads_a_table_row_and_rejects_bad_ones():
    table = pa.Table.from_pylist([_group()], schema=TRAINING_GROUPS)
    group = parse_group(table.to_pandas().to_dict("records")[0])
    assert group.context.reasoning == "I found Ruritania." and group.context.question is None
    assert [d.doc_id for d in group.negatives] == [f"n{i}" for i in range(7)]
    with pytest.raises(RowError, match=r"^group_id=g1: session_id is missing$"):
        parse_group(_group(session_id=None))
    with pytest.raises(RowError, match=r"^group_id=g1: negatives is empty$"):
        parse_group(_group(negatives=[]))
    with pytest.raises(RowError, match=r"^group_id=g1: positive\.text is empty$"):
        parse_group(_group(positive={"doc_id": "p", "text": " "}))


def test_rerank_row_sorts_by_score_keeping_input_order_on_ties():
    row = rerank_row("s1", Mode.M2, ["a", "b", "c", "d"], [0.5, 2.0, 0.5, -1.0])
    assert [r["doc_id"] for r in row["ranking"]] == ["b", "a", "c", "d"]
    assert [r["rank"] for r in row["ranking"]] == [1, 2, 3, 4]
    assert row["mode"] == "M2" and row["error"] is None
    table = pa.Table.from_pylist([row], schema=RERANK_OUTPUT)
    assert table.to_pylist()[0] == row


def test_rerank_row_stores_float32_scores_and_cuts_top_k():
    scores = np.array([0.1, 0.30000001192092896, 0.2], dtype=np.float64)
    row = rerank_row("s1", "M0", ["a", "b", "c"], scores, top_k=2)
    assert [r["doc_id"] for r in row["ranking"]] == ["b", "c"]
    assert row["ranking"][0]["score"] == float(np.float32(0.3))


def test_rerank_row_rejects_mismatch_nan_and_bad_top_k():
    with pytest.raises(ValueError, match="2 doc_ids but 1 scores"):
        rerank_row("s1", "M0", ["a", "b"], [1.0])
    with pytest.raises(RowError, match=r"search_id=s1: score of candidates\[1\] is NaN"):
        rerank_row("s1", "M0", ["a", "b"], [1.0, float("nan")])
    with pytest.raises(ValueError, match="top_k"):
        rerank_row("s1", "M0", ["a"], [1.0], top_k=0)


def test_error_row_fits_the_output_schema_with_an_empty_ranking():
    rows = [error_row("s1", Mode.M3, "candidates is empty"), error_row(None, "auto", "no id")]
    table = pa.Table.from_pylist(rows, schema=RERANK_OUTPUT)
    assert table.column("ranking").to_pylist() == [[], []]
    assert table.column("mode").to_pylist() == ["M3", "auto"]


def test_parse_search_keeps_agent_rank_and_first_stage_rank():
    """Pins issue 20: parse_search dropped the trace candidates' agent_rank."""
    candidates = _row()["candidates"]
    candidates[0] |= {"agent_rank": 2, "first_stage_rank": 3}
    candidates[1] |= {"agent_rank": 1.0, "first_stage_rank": None}
    search = parse_search(_row(candidates=candidates))
    assert [c.agent_rank for c in search.candidates] == [2, 1, None, None]
    assert [c.first_stage_rank for c in search.candidates] == [3, None, None, None]
    candidates[2] |= {"first_stage_rank": 0}
    with pytest.raises(RowError, match=r"candidates\[2\]\.first_stage_rank must be >= 1"):
        parse_search(_row(candidates=candidates))
    candidates[2] |= {"first_stage_rank": None, "first_stage_score": float("inf")}
    with pytest.raises(RowError, match=r"candidates\[2\]\.first_stage_score must be finite"):
        parse_search(_row(candidates=candidates))


def test_rerank_row_breaks_score_ties_by_the_first_stage_order():
    row = rerank_row("s1", "M0", ["a", "b", "c"], [1.0, 1.0, 1.0], first_stage_scores=[1, 3, 2])
    assert [r["doc_id"] for r in row["ranking"]] == ["b", "c", "a"]
    assert row["fusion"] is None and all(r["fused"] is None for r in row["ranking"])


def test_fused_rerank_row_orders_by_fused_and_keeps_the_raw_score():
    from acare_ray.ranking.fusion import FusionConfig, fuse

    scores, first = [2.0, 0.5, 1.0, 0.5], [1.0, 3.0, None, 2.0]
    config = FusionConfig("rrf", k=60, weight=0.5)
    row = rerank_row("s1", "M3", ["a", "b", "c", "d"], scores, 3, config, first)
    expected = fuse(scores, config, first)
    assert [r["doc_id"] for r in row["ranking"]] == ["b", "a", "d"]
    assert [r["score"] for r in row["ranking"]] == [0.5, 2.0, 0.5]
    assert [r["fused"] for r in row["ranking"]] == [expected.values[i] for i in (1, 0, 3)]
    assert row["fusion"] == "rrf:k=60,weight=0.5"
    assert pa.Table.from_pylist([row], schema=RERANK_OUTPUT).to_pylist()[0] == row
    with pytest.raises(RowError, match=r"search_id=s1: first_stage_scores\[0\] must be finite"):
        rerank_row("s1", "M3", ["a", "b"], [1.0, 2.0], None, config, [float("inf"), 1.0])
