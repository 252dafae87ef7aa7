"""Held-out test questions for the quality benchmarks: the project's one split
(:mod:`acare_ray.eval.splits`) over a named column."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from acare_ray.eval.splits import split_values


def hold_out(table: pa.Table, column: str, n_test: int, seed: int) -> tuple[pa.Table, pa.Table]:
    """``(train, test)`` rows: ``n_test`` seeded values of ``column`` held out, each with every
    row that has it (a question is never in both)."""
    values = table.column(column).to_pylist()
    n = len(set(values))
    if not 0 < n_test < n:
        raise ValueError(f"--test-questions must be in 1..{n - 1}, got {n_test}")
    parts = split_values(values, test=n_test, seed=seed)
    is_test = pa.array([parts[v] == "test" for v in values])
    return table.filter(pc.invert(is_test)), table.filter(is_test)
