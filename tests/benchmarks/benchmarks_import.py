"""Importing the benchmark modules (the ``benchmarks`` package at the repository root, which
pytest's ``pythonpath`` setting puts on the path) from the tests."""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@contextlib.contextmanager
def benchmark_modules(*names: str) -> Iterator[tuple[ModuleType, ...]]:
    """The named ``benchmarks.<name>`` modules."""
    yield tuple(importlib.import_module(f"benchmarks.{name}") for name in names)
