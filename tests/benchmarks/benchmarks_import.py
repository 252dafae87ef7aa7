"""Importing the benchmark scripts (``benchmarks/`` is not a package) from the tests."""

from __future__ import annotations

import contextlib
import importlib
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@contextlib.contextmanager
def benchmark_modules(*names: str) -> Iterator[tuple[ModuleType, ...]]:
    """The named ``benchmarks/<name>.py`` modules, imported with ``benchmarks/`` on ``sys.path``
    for as long as the block runs (their own imports of each other resolve there too)."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        yield tuple(importlib.import_module(name) for name in names)
    finally:
        sys.path.remove(str(BENCHMARKS))
