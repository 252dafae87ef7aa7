from __future__ import annotations

import json

import pyarrow as pa
import pytest

from acare_ray.data.nemo import (
    content_id,
    groups_to_records,
    read_nemo_jsonl,
    records_to_groups,
    write_nemo_jsonl,
)
from acare_ray.data.schema import TRAINING_GROUPS
from acare_ray.data.synthetic import synthetic_groups


def test_groups_survive_a_jsonl_round_trip_unchanged(tmp_path):
    groups = synthetic_groups(6, seed=2).cast(TRAINING_GROUPS)
    rows = groups.to_pylist()
    rows[0]["question"] = None  # absent context fields must stay absent
    rows[1]["reasoning"] = None
    groups = pa.Table.from_pylist(rows, schema=TRAINING_GROUPS)
    assert write_nemo_jsonl(groups, tmp_path / "g.jsonl") == groups.num_rows
    back = read_nemo_jsonl(tmp_path / "g.jsonl")
    assert back.to_pylist() == groups.to_pylist()


def test_written_records_use_the_nemo_field_names(tmp_path):
    groups = synthetic_groups(2, seed=0)
    write_nemo_jsonl(groups, tmp_path / "g.jsonl")
    record = json.loads((tmp_path / "g.jsonl").read_text().splitlines()[0])
    nemo_fields = {
        "query_id",
        "global_qid",
        "query",
        "reasoning",
        "global_query",
        "pos_doc",
        "neg_doc",
    }
    assert nemo_fields <= set(record)
    assert isinstance(record["pos_doc"], str) and len(record["neg_doc"]) == 7


def test_reads_strings_dicts_lists_and_numeric_ids():
    records = [
        {"query_id": 7, "global_qid": 3, "query": "q", "pos_doc": "p", "neg_doc": "n"},
        {
            "query_id": "b",
            "query": "q",
            "reasoning": "",
            "pos_doc": [{"text": "p"}],
            "neg_doc": [{"text": "n"}, "m"],
        },
    ]
    rows = records_to_groups(records).to_pylist()
    assert rows[0]["group_id"] == "7" and rows[0]["session_id"] == "3"
    assert rows[0]["positive"] == {"doc_id": content_id("p"), "text": "p"}
    assert rows[1]["session_id"] == "b" and rows[1]["reasoning"] is None
    assert [d["text"] for d in rows[1]["negatives"]] == ["n", "m"]


def test_several_positives_become_several_groups():
    record = {"query_id": "q1", "query": "q", "pos_doc": ["p1", "p2"], "neg_doc": ["n"]}
    rows = records_to_groups([record]).to_pylist()
    assert [r["group_id"] for r in rows] == ["q1#0", "q1#1"]
    assert [r["positive"]["text"] for r in rows] == ["p1", "p2"]


@pytest.mark.parametrize(
    ("record", "message"),
    [
        (
            {"query_id": "x", "query": "q", "pos_doc": [], "neg_doc": ["n"]},
            r"record 1 \(query_id=x\): pos_doc is empty",
        ),
        (
            {"query_id": "x", "query": "q", "pos_doc": "p", "neg_doc": []},
            r"record 1 \(query_id=x\): neg_doc is empty",
        ),
        (
            {"query_id": "x", "query": "q", "pos_doc": "p", "neg_doc": ["n", " "]},
            r"neg_doc\[1\] has no text",
        ),
        (
            {"query_id": "x", "query": "", "pos_doc": "p", "neg_doc": ["n"]},
            r"query_id=x\).*sub_query is empty",
        ),
        (
            {"query_id": 1.5, "query": "q", "pos_doc": "p", "neg_doc": ["n"]},
            r"query_id must be a string",
        ),
        (
            {
                "query_id": "x",
                "query": "q",
                "pos_doc": "p",
                "neg_doc": ["n"],
                "neg_doc_id": ["a", "b"],
            },
            r"neg_doc_id has 2 ids for 1 neg_doc docs",
        ),
    ],
)
def test_bad_records_name_the_record_and_field(record, message):
    with pytest.raises(ValueError, match=message):
        records_to_groups([record], source="train.jsonl")


def test_records_keep_doc_ids_in_extra_keys():
    groups = synthetic_groups(1, seed=0)
    record = groups_to_records(groups)[0]
    row = groups.to_pylist()[0]
    assert record["pos_doc_id"] == row["positive"]["doc_id"]
    assert record["neg_doc_id"] == [d["doc_id"] for d in row["negatives"]]
