"""Which groups a run trains and validates on, and which groups each worker sees at each step.

One optimizer step consumes ``batch_groups x grad_accum x workers`` groups (the global batch),
taken in order from the epoch's permutation (:func:`~acare_ray.training.groups.epoch_order`);
worker ``r`` takes the ``r``-th slice, cut into ``grad_accum`` micro-batches. Everything here is
a function of the config and the step, which is what lets a relaunch resume mid-epoch with the
same data.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np

from acare_ray.data.schema import Group
from acare_ray.training.config import TrainConfig
from acare_ray.training.groups import epoch_order, parse_groups, read_groups, split_by_question


def load_splits(config: TrainConfig) -> tuple[list[Group], list[Group], tuple[int, ...]]:
    """(train, validation, train groups per source): ``val_data`` if given, else a session split
    of each source. The training groups are the sources' in order."""
    train: list[Group] = []
    val: list[Group] = []
    sizes = []
    for path in config.sources:
        groups = parse_groups(read_groups(path), config.group_size)
        if config.val_data:
            part_train, part_val = groups, []
        else:
            part_train, part_val = split_by_question(groups, config.val_fraction, config.split_seed)
        train += part_train
        val += part_val
        sizes.append(len(part_train))
    if len(config.sources) > 1:
        seen: set[str] = set()
        for group in [*train, *val]:
            if group.group_id in seen:
                raise ValueError(f"group_id={group.group_id}: appears in more than one source")
            seen.add(group.group_id)
    if config.val_data:
        val = parse_groups(read_groups(config.val_data), config.group_size)
        overlap = {g.session_id for g in train} & {g.session_id for g in val}
        if overlap:
            raise ValueError(
                f"val_data shares {len(overlap)} session_id(s) with data, e.g. {sorted(overlap)[0]}"
            )
    if config.val_max_groups is not None and len(val) > config.val_max_groups:
        keep = np.sort(np.random.default_rng([config.seed, 2]).permutation(len(val)))
        val = [val[i] for i in keep[: config.val_max_groups]]
    return train, val, tuple(sizes)


def _total(sizes: int | Sequence[int]) -> int:
    return sizes if isinstance(sizes, int) else int(sum(sizes))


def steps_per_epoch(sizes: int | Sequence[int], config: TrainConfig) -> int:
    """Steps that consume as many groups as the sources hold (``sizes``: a count, or one per
    source)."""
    n_train = _total(sizes)
    steps = n_train // config.global_batch_groups
    if steps < 1:
        raise ValueError(
            f"{n_train} training groups are fewer than one global batch "
            f"(batch_groups {config.batch_groups} x grad_accum {config.grad_accum} x "
            f"workers {config.workers} = {config.global_batch_groups})"
        )
    return steps


def total_steps(sizes: int | Sequence[int], config: TrainConfig) -> int:
    return config.max_steps or config.epochs * steps_per_epoch(sizes, config)


@functools.lru_cache(maxsize=4)
def mixed_order(
    sizes: tuple[int, ...], weights: tuple[float, ...], seed: int, slots: int
) -> np.ndarray:
    """The group index of each of the run's first ``slots`` training slots under data mixing:
    slot ``i`` draws its source with probability proportional to ``weights`` (seeded once per
    run) and takes that source's next group; each source is read in seeded permutations,
    reshuffled on every pass. Indices are into the concatenation of the sources."""
    if any(n < 1 for n in sizes):
        raise ValueError(f"every weighted data source needs training groups, got sizes {sizes}")
    p = np.asarray(weights, dtype=np.float64)
    source = np.random.default_rng([seed, 3]).choice(len(sizes), size=slots, p=p / p.sum())
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    out = np.empty(slots, dtype=np.int64)
    for j, n in enumerate(sizes):
        where = np.flatnonzero(source == j)
        passes = -(-len(where) // n)
        stream = [epoch_order(n, seed + 1009 * (j + 1), e) for e in range(passes)]
        out[where] = offsets[j] + np.concatenate([*stream, np.empty(0, np.int64)])[: len(where)]
    return out


def step_groups(
    sizes: int | Sequence[int], config: TrainConfig, step: int, rank: int
) -> list[np.ndarray]:
    """Indices of the training groups ``rank`` uses at ``step``, one array per micro-batch."""
    size = config.global_batch_groups
    if config.data_weights is not None:
        per_source = (sizes,) if isinstance(sizes, int) else tuple(sizes)
        slots = total_steps(per_source, config) * size
        order = mixed_order(per_source, tuple(config.data_weights), config.seed, slots)
        chunk = order[step * size : (step + 1) * size]
    else:
        n_train = _total(sizes)
        per_epoch = steps_per_epoch(n_train, config)
        epoch, index = divmod(step, per_epoch)
        chunk = epoch_order(n_train, config.seed, epoch)[index * size : (index + 1) * size]
    mine = chunk.reshape(config.workers, config.grad_accum, config.batch_groups)[rank]
    return list(mine)
