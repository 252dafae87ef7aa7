"""Which groups each worker trains on at each step."""

from __future__ import annotations

import numpy as np
import pytest

from acare_ray.training.config import TrainConfig
from acare_ray.training.plan import step_groups, steps_per_epoch, total_steps


def test_workers_share_each_epoch_without_overlap_and_epochs_reshuffle():
    config = TrainConfig(data="g", workers=3, batch_groups=2, grad_accum=2, epochs=2, seed=5)
    n = 50  # 4 steps of 12 groups per epoch; 2 groups left out each epoch
    assert steps_per_epoch(n, config) == 4 and total_steps(n, config) == 8
    epochs = []
    for first in (0, 4):
        seen = []
        for step in range(first, first + 4):
            parts = [step_groups(n, config, step, rank) for rank in range(3)]
            assert all(len(p) == 2 and all(len(m) == 2 for m in p) for p in parts)
            seen += [int(i) for p in parts for m in p for i in m]
        assert len(seen) == len(set(seen)) == 48
        epochs.append(seen)
    assert epochs[0] != epochs[1]
    again = step_groups(n, config, 6, 1)
    assert all((a == b).all() for a, b in zip(again, step_groups(n, config, 6, 1)))


def test_max_steps_runs_past_one_epoch():
    config = TrainConfig(data="g", batch_groups=4, max_steps=7)
    assert total_steps(10, config) == 7
    assert np.concatenate(step_groups(10, config, 6, 0)).size == 4


def test_too_few_groups_for_one_global_batch_is_explained():
    config = TrainConfig(data="g", workers=2, batch_groups=8)
    with pytest.raises(ValueError, match="10 training groups are fewer than one global batch"):
        steps_per_epoch(10, config)
