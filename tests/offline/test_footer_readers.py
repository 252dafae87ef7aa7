"""The offline jobs size Ray Data's pool of Parquet footer readers by their input's files."""

from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from acare_ray.offline.job import (
    FOOTER_READERS_ENV,
    footer_readers,
    input_files,
    sized_footer_readers,
)


@pytest.mark.parametrize(
    ("files", "readers"), [(0, 1), (1, 1), (10, 1), (11, 2), (25, 3), (320, 32), (5000, 32)]
)
def test_one_footer_reader_per_batch_of_ten_files_at_most_32(files, readers):
    assert footer_readers(files) == readers


def _indexer_actors(path) -> int:
    """The footer actors of the indexer Ray Data builds when it plans a read of ``path``."""
    from ray.data._internal.datasource_v2.formats.parquet.parquet_datasource_v2 import (
        ParquetDatasourceV2,
    )

    return ParquetDatasourceV2(paths=[str(path)])._get_file_indexer()._num_actors


def test_ray_data_plans_the_read_with_the_sized_pool_and_the_setting_is_removed_after(
    tmp_path, monkeypatch
):
    monkeypatch.delenv(FOOTER_READERS_ENV, raising=False)
    for i in range(25):
        pq.write_table(pa.table({"x": [i]}), tmp_path / f"part-{i:03d}.parquet")
    assert input_files(str(tmp_path)) == 25
    assert input_files(str(tmp_path / "part-000.parquet")) == 1
    # If a Ray upgrade renames the setting, this fails: the sized pool would silently be lost.
    with sized_footer_readers(input_files(str(tmp_path))):
        assert _indexer_actors(tmp_path) == 3
    assert FOOTER_READERS_ENV not in os.environ
    assert _indexer_actors(tmp_path) == 32  # Ray Data's own default, outside a job's read


def test_a_users_setting_is_kept(tmp_path, monkeypatch):
    monkeypatch.setenv(FOOTER_READERS_ENV, "7")
    with sized_footer_readers(500):
        assert os.environ[FOOTER_READERS_ENV] == "7"
    assert os.environ[FOOTER_READERS_ENV] == "7"
