"""Command-line flags -> a frozen config dataclass, by field name (the CLIs stay thin: argparse
-> config -> ``run``)."""

from __future__ import annotations

import argparse
from dataclasses import fields
from typing import Any, TypeVar

T = TypeVar("T")


def config_from_flags(cls: type[T], args: argparse.Namespace, **values: Any) -> T:
    """``cls`` (a dataclass) with each field named in ``values`` set from there, each other
    field that has a flag of the same name in ``args`` set from the flag, and the rest left at
    their defaults."""
    flagged = {
        f.name: getattr(args, f.name)
        for f in fields(cls)  # type: ignore[arg-type]
        if f.name in args and f.name not in values
    }
    return cls(**flagged, **values)
