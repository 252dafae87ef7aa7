from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from acare_ray.data import io
from acare_ray.data.io import (
    data_dir,
    read_jsonl,
    read_parquet,
    write_jsonl,
    write_parquet,
)
from acare_ray.data.schema import SEARCHES
from acare_ray.data.synthetic import synthetic_searches


def test_parquet_round_trip_preserves_schema_and_rows(tmp_path):
    table = synthetic_searches(3, seed=0)
    back = read_parquet(write_parquet(table, tmp_path / "out" / "s.parquet"))
    assert back.schema.equals(table.schema) and back.equals(table)


def test_written_files_have_bounded_row_groups_for_ray_data_blocks(tmp_path):
    """Ray Data reads one row group as one block: a 10^5-search file written as a single row
    group reached the rerank job as one ~0.5 GB block (object store 642 MB at peak)."""
    import pyarrow.parquet as pq

    table = synthetic_searches(1300, seed=0).slice(0, 2500)
    path = write_parquet(table, tmp_path / "s.parquet")
    meta = pq.ParquetFile(path).metadata
    sizes = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
    assert sizes == [io.ROW_GROUP_ROWS, io.ROW_GROUP_ROWS, 2500 - 2 * io.ROW_GROUP_ROWS]
    assert read_parquet(path).equals(table)
    small = write_parquet(table, tmp_path / "t.parquet", row_group_rows=1000)
    assert pq.ParquetFile(small).metadata.num_row_groups == 3


def test_read_parquet_with_schema_orders_casts_and_fills_missing_columns(tmp_path):
    rows = [
        {
            "sub_query": "q",
            "search_id": "s",
            "candidates": [{"doc_id": "d", "text": "t"}],
            "extra": 1,
        }
    ]
    write_parquet(pa.Table.from_pylist(rows), tmp_path / "s.parquet")
    table = read_parquet(tmp_path / "s.parquet", schema=SEARCHES)
    assert table.schema.names == [*SEARCHES.names, "extra"]
    assert table.schema.field("candidates").type == SEARCHES.field("candidates").type
    assert table.column("reasoning").to_pylist() == [None]


def test_jsonl_round_trip_and_bad_line_number(tmp_path):
    records = [{"a": 1, "text": "naïve"}, {"a": 2}]
    assert write_jsonl(records, tmp_path / "r.jsonl") == 2
    assert list(read_jsonl(tmp_path / "r.jsonl")) == records
    (tmp_path / "bad.jsonl").write_text('{"a": 1}\n\n{oops\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl:3: not valid JSON"):
        list(read_jsonl(tmp_path / "bad.jsonl"))


def test_data_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("ACARE_DATA_DIR", str(tmp_path))
    assert data_dir() == tmp_path
    monkeypatch.delenv("ACARE_DATA_DIR")
    assert data_dir() == Path(io.__file__).resolve().parents[2].parent / "shared" / "data"
