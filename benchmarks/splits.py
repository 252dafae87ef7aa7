"""Held-out test questions for the quality benchmarks."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


def hold_out(table: pa.Table, column: str, n_test: int, seed: int) -> tuple[pa.Table, pa.Table]:
    """``(train, test)`` rows: ``n_test`` seeded values of ``column`` held out, each with every
    row that has it (a question is never in both)."""
    values = sorted(set(table.column(column).to_pylist()))
    if not 0 < n_test < len(values):
        raise ValueError(f"--test-questions must be in 1..{len(values) - 1}, got {n_test}")
    held = set(np.random.default_rng(seed).permutation(values)[:n_test].tolist())
    is_test = pa.array([v in held for v in table.column(column).to_pylist()])
    return table.filter(pc.invert(is_test)), table.filter(is_test)
