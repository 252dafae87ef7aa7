"""The question split's row-level hold-out (what the quality benchmarks split by)."""

from __future__ import annotations

import pyarrow as pa
import pytest

from acare_ray.eval.splits import hold_out, split_values


def table() -> pa.Table:
    sessions = [f"s{i % 7}" for i in range(40)]
    return pa.table({"search_id": [f"q{i}" for i in range(40)], "session_id": sessions})


def test_hold_out_keeps_every_row_of_a_value_on_one_side_and_loses_none():
    rows = table()
    train, test = hold_out(rows, "session_id", 3, seed=5)
    assert train.num_rows + test.num_rows == rows.num_rows
    held = set(test.column("session_id").to_pylist())
    assert len(held) == 3
    assert held.isdisjoint(train.column("session_id").to_pylist())
    # the project's one draw, not a second one; seeded, so it repeats
    parts = split_values(rows.column("session_id").to_pylist(), test=3, seed=5)
    assert held == {v for v, part in parts.items() if part == "test"}
    assert hold_out(rows, "session_id", 3, seed=5)[1].equals(test)


@pytest.mark.parametrize("n_test", [0, 7])
def test_hold_out_refuses_a_count_that_leaves_a_side_empty(n_test):
    with pytest.raises(ValueError, match=r"^test: must be in 1\.\.6"):
        hold_out(table(), "session_id", n_test)
