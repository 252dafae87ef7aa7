"""Which groups a run trains and validates on, and which groups each worker sees at each step.

One optimizer step consumes ``batch_groups x grad_accum x workers`` groups (the global batch),
taken in order from the epoch's permutation (:func:`~acare_ray.training.collator.epoch_order`);
worker ``r`` takes the ``r``-th slice, cut into ``grad_accum`` micro-batches. Everything here is
a function of the config and the step, which is what lets a relaunch resume mid-epoch with the
same data.
"""

from __future__ import annotations

import numpy as np

from acare_ray.schema import Group
from acare_ray.training.collator import epoch_order, parse_groups, read_groups, split_by_session
from acare_ray.training.config import TrainConfig


def load_splits(config: TrainConfig) -> tuple[list[Group], list[Group]]:
    """(train, validation) groups: ``val_data`` if given, else a session split of ``data``."""
    groups = parse_groups(read_groups(config.data), config.group_size)
    if config.val_data:
        train = groups
        val = parse_groups(read_groups(config.val_data), config.group_size)
        overlap = {g.session_id for g in train} & {g.session_id for g in val}
        if overlap:
            raise ValueError(
                f"val_data shares {len(overlap)} session_id(s) with data, e.g. {sorted(overlap)[0]}"
            )
    else:
        train, val = split_by_session(groups, config.val_fraction, config.seed)
    if config.val_max_groups is not None and len(val) > config.val_max_groups:
        keep = np.sort(np.random.default_rng([config.seed, 2]).permutation(len(val)))
        val = [val[i] for i in keep[: config.val_max_groups]]
    return train, val


def steps_per_epoch(n_train: int, config: TrainConfig) -> int:
    steps = n_train // config.global_batch_groups
    if steps < 1:
        raise ValueError(
            f"{n_train} training groups are fewer than one global batch "
            f"(batch_groups {config.batch_groups} x grad_accum {config.grad_accum} x "
            f"workers {config.workers} = {config.global_batch_groups})"
        )
    return steps


def total_steps(n_train: int, config: TrainConfig) -> int:
    return config.max_steps or config.epochs * steps_per_epoch(n_train, config)


def step_groups(n_train: int, config: TrainConfig, step: int, rank: int) -> list[np.ndarray]:
    """Indices of the training groups ``rank`` uses at ``step``, one array per micro-batch."""
    per_epoch = steps_per_epoch(n_train, config)
    epoch, index = divmod(step, per_epoch)
    size = config.global_batch_groups
    chunk = epoch_order(n_train, config.seed, epoch)[index * size : (index + 1) * size]
    mine = chunk.reshape(config.workers, config.grad_accum, config.batch_groups)[rank]
    return list(mine)
