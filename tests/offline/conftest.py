"""Inputs for the offline job tests: small synthetic searches, with bad rows mixed in."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from offline_support import with_bad_rows

from acare_ray.data.io import write_parquet
from acare_ray.data.synthetic import SYNTHETIC_SEARCHES, synthetic_searches


@pytest.fixture(scope="session")
def mixed_searches(tmp_path_factory) -> tuple[Path, list[dict], dict[str, str]]:
    """(Parquet folder, its rows, expected errors): 4 synthetic sessions plus the bad rows, in
    three files (so Ray reads several blocks and writes several part files)."""
    rows, errors = with_bad_rows(synthetic_searches(4, seed=3).to_pylist())
    path = tmp_path_factory.mktemp("searches") / "mixed"
    for k in range(3):
        part = rows[k * len(rows) // 3 : (k + 1) * len(rows) // 3]
        write_parquet(pa.Table.from_pylist(part, schema=SYNTHETIC_SEARCHES), path / f"{k}.parquet")
    return path, rows, errors
