"""When to stop training and which checkpoint to keep: the validation curve decides.

:func:`selection` reads a run's metric history (one entry per validation, step 0 included when
the run validates before training) and says which validation was best on the selected metric
(``val/nDCG@10/<mode>`` is maximised, ``val/loss/<mode>`` minimised), and whether ``patience``
validations in a row have now failed to beat it by more than ``min_delta``: early stopping.
It is a function of the history alone, so a resumed run decides as the uninterrupted run would.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from acare_ray.scoring import Mode

MEASURES = ("nDCG@10", "loss")


def check_metric(metric: str, eval_modes: Sequence[str]) -> None:
    """ValueError unless ``metric`` is ``val/nDCG@10/<mode>`` or ``val/loss/<mode>`` with the
    mode among ``eval_modes`` (the validation only measures those)."""
    parts = metric.split("/")
    if len(parts) != 3 or parts[0] != "val" or parts[1] not in MEASURES:
        raise ValueError(
            f"select_metric must be val/nDCG@10/<mode> or val/loss/<mode>, got {metric!r}"
        )
    if parts[2] not in Mode.__members__ or parts[2] not in eval_modes:
        raise ValueError(
            f"select_metric {metric!r}: mode {parts[2]!r} is not among eval_modes "
            f"{list(eval_modes)}"
        )


def maximised(metric: str) -> bool:
    return metric.split("/")[1] != "loss"


@dataclass(frozen=True)
class Selection:
    """``best_step`` / ``best_value``: the best validation so far; ``stale``: validations since
    it that did not beat it by more than ``min_delta``; ``stop``: ``stale >= patience``."""

    best_step: int
    best_value: float
    stale: int
    stop: bool

    def as_dict(self) -> dict[str, Any]:
        return {
            "best_step": self.best_step,
            "best_value": self.best_value,
            "stale": self.stale,
            "stop": self.stop,
        }


def selection(
    history: Sequence[Mapping[str, Any]],
    metric: str,
    patience: int | None = None,
    min_delta: float = 0.0,
) -> Selection | None:
    """The best validation of ``history`` on ``metric`` and whether to stop (None when no entry
    has the metric yet). A later validation is an improvement only when it beats the best by
    more than ``min_delta``; ties keep the earlier (cheaper, less fitted) checkpoint."""
    sign = 1.0 if maximised(metric) else -1.0
    best: tuple[int, float] | None = None
    stale = 0
    for entry in history:
        value = entry.get(metric)
        if value is None or not math.isfinite(value):
            continue
        if best is None or sign * (value - best[1]) > min_delta:
            best, stale = (int(entry["step"]), float(value)), 0
        else:
            stale += 1
    if best is None:
        return None
    return Selection(best[0], best[1], stale, patience is not None and stale >= patience)
