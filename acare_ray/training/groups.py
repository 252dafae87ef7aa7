"""Training groups from files to the order they are trained in: reading, validating, the
session split and each epoch's order. Tokens are :mod:`acare_ray.training.collator`'s job.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow as pa

from acare_ray.data.schema import TRAINING_GROUPS, Group, RowError, parse_group
from acare_ray.eval.splits import split_values

NEMO_SUFFIXES = (".jsonl", ".json")

logger = logging.getLogger(__name__)


def read_groups(path: str | os.PathLike) -> pa.Table:
    """A ``TRAINING_GROUPS`` table from Parquet (file or folder) or NeMo JSONL (by suffix).

    A relabel job's output (Parquet with a ``status`` column, one row per search) is read as its
    ``status == "ok"`` rows; the other rows are searches that gave no group, and how many of each
    status were left out is logged.
    """
    text = os.fspath(path)
    local = "://" not in text
    if local and not Path(text).exists():
        raise FileNotFoundError(f"training data not found: {text}")
    if Path(text).suffix in NEMO_SUFFIXES:
        from acare_ray.data.nemo import read_nemo_jsonl

        return read_nemo_jsonl(text)
    from acare_ray.data.io import read_parquet

    table = read_parquet(text, TRAINING_GROUPS)
    if "status" not in table.column_names:
        return table
    from acare_ray.data.groups import ok_groups

    groups, left_out = ok_groups(table)
    if left_out:
        logger.info(
            "%s: relabel output, training on %d ok rows; left out %s",
            text,
            groups.num_rows,
            ", ".join(f"{n} {s}" for s, n in sorted(left_out.items(), key=str)),
        )
    return groups


def parse_groups(table: pa.Table, group_size: int) -> list[Group]:
    """Validated groups, each cut to its first ``group_size - 1`` negatives.

    Raises :class:`RowError` naming the group for a bad row, a group with too few negatives, or
    a repeated ``group_id`` (dropout draws are keyed by it).
    """
    groups, seen = [], set()
    for index, row in enumerate(table.to_pylist()):
        group = parse_group(row, index)
        if group.group_id in seen:
            raise RowError(f"group_id={group.group_id}: appears more than once")
        seen.add(group.group_id)
        needed = group_size - 1
        if len(group.negatives) < needed:
            raise RowError(
                f"group_id={group.group_id}: negatives has {len(group.negatives)} documents, "
                f"group_size={group_size} needs {needed}"
            )
        groups.append(replace(group, negatives=group.negatives[:needed]))
    if not groups:
        raise ValueError("no training groups in the data")
    return groups


def question_key(group: Group) -> str:
    """The question a group belongs to (:mod:`acare_ray.eval.splits`): its question text, else its
    session (groups carry no ``question_id``)."""
    return group.context.question or group.session_id


def split_by_question(
    groups: Sequence[Group], val_fraction: float, seed: int = 0
) -> tuple[list[Group], list[Group]]:
    """(train, validation): a seeded ``val_fraction`` of the questions (the project's one split,
    :func:`acare_ray.eval.splits.split_values`), so all sessions of a question sit on one side."""
    if val_fraction == 0:
        return list(groups), []
    questions = {question_key(g) for g in groups}
    if len(questions) < 2:
        raise ValueError(f"cannot split {len(questions)} question(s) into train and validation")
    parts = split_values(questions, validation=val_fraction, seed=seed)
    return [g for g in groups if parts[question_key(g)] == "train"], [
        g for g in groups if parts[question_key(g)] == "validation"
    ]


def epoch_order(n_groups: int, seed: int, epoch: int) -> np.ndarray:
    """The order groups are visited in during ``epoch``: a permutation fixed by (seed, epoch)."""
    return np.random.default_rng([seed, epoch, 0]).permutation(n_groups)
