"""Early stopping and checkpoint selection read from the validation history alone."""

from __future__ import annotations

import pytest

from acare_ray.training import TrainConfig
from acare_ray.training.stopping import selection

M3 = "val/nDCG@10/M3"


def _history(values, key=M3):
    return [{"step": 10 * i, key: v} for i, v in enumerate(values)]


def test_the_best_validation_is_kept_and_patience_counts_from_it():
    chosen = selection(_history([0.50, 0.60, 0.58, 0.59]), M3, patience=3)
    assert (chosen.best_step, chosen.best_value, chosen.stale, chosen.stop) == (10, 0.60, 2, False)
    assert selection(_history([0.50, 0.60, 0.58, 0.59, 0.60]), M3, patience=3).stop


def test_min_delta_and_ties_keep_the_earlier_checkpoint():
    chosen = selection(_history([0.50, 0.505, 0.50]), M3, patience=2, min_delta=0.01)
    assert chosen.best_step == 0 and chosen.stop
    assert selection(_history([0.5, 0.5]), M3).best_step == 0


def test_loss_is_minimised_and_missing_values_are_skipped():
    key = "val/loss/M0"
    history = [*_history([2.0, 1.5, 1.7], key), {"step": 40}, {"step": 50, key: float("nan")}]
    chosen = selection(history, key, patience=5)
    assert (chosen.best_step, chosen.stale, chosen.stop) == (10, 1, False)
    assert selection([{"step": 0}], key) is None


def test_the_config_refuses_what_it_could_not_select_on():
    with pytest.raises(ValueError, match="mode 'M2' is not among eval_modes"):
        TrainConfig(data="d", eval_modes=("M0", "M3"), select_metric="val/nDCG@10/M2")
    with pytest.raises(ValueError, match="select_metric must be"):
        TrainConfig(data="d", select_metric="nDCG@10")
    with pytest.raises(ValueError, match="patience needs select_metric"):
        TrainConfig(data="d", patience=3)
    with pytest.raises(ValueError, match="time_budget_s must be > 0"):
        TrainConfig(data="d", time_budget_s=0)
