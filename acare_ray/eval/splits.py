"""The project's one question split: train / validation / test by question, seeded, and the
question-grouped folds of the fusion fit.

Every searches table is split by its **question key** (:func:`question_keys`): the
``question_id`` column where the table has one, else the question text, else the session. So all
sessions of one question (several agents, several attempts) sit on one side, never two: a
system tuned on one agent's trajectory is never tested on another agent's trajectory of the
same question.

The draw (:func:`split_values`): ``test`` questions are the first ``test`` of a permutation of
the sorted distinct keys seeded by ``seed``; ``validation`` is a fraction of the remaining
questions, the first of a second permutation seeded by ``(seed, 11)``. These are the draws the
project's published splits were made with, so the trace test split (50 questions, seed 0) is
the same questions as in every earlier report.

Used by ``acare adopt``, the trainer's own validation split, ``acare fit-fusion``'s folds and
the benchmarks. Pure numpy/pyarrow; no Ray, no torch.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

PARTS = ("train", "validation", "test")
KEY_COLUMNS = ("question_id", "question", "session_id", "search_id")


def _distinct(values: Iterable[Hashable]) -> list:
    return sorted(set(values))


def validation_count(n: int, fraction: float) -> int:
    """How many of ``n`` questions a ``fraction`` holds out: at least 1, at most ``n - 1``."""
    if not 0 < fraction < 1:
        raise ValueError(f"validation fraction must be in (0, 1), got {fraction}")
    if n < 2:
        raise ValueError(f"cannot hold out a fraction of {n} question(s): need at least 2")
    return min(n - 1, max(1, round(fraction * n)))


def split_values(
    values: Iterable[Hashable], test: int = 0, validation: float = 0.0, seed: int = 0
) -> dict[Hashable, str]:
    """``{key: part}`` for the distinct ``values``: ``test`` of them (a count) in ``"test"``,
    a ``validation`` fraction of the rest in ``"validation"``, the others in ``"train"``."""
    keys = _distinct(values)
    if isinstance(test, bool) or not isinstance(test, int) or not 0 <= test < len(keys):
        raise ValueError(
            f"test must be a number of questions in 0..{max(len(keys) - 1, 0)}, got {test!r}"
        )
    parts = dict.fromkeys(keys, "train")
    held = np.random.default_rng(seed).permutation(np.array(keys, dtype=object))[:test].tolist()
    parts.update(dict.fromkeys(held, "test"))
    if validation:
        rest = [k for k in keys if parts[k] == "train"]
        count = validation_count(len(rest), validation)
        order = np.random.default_rng([seed, 11]).permutation(np.array(rest, dtype=object))
        parts.update(dict.fromkeys(order[:count].tolist(), "validation"))
    return parts


def question_keys(table: pa.Table) -> list[str]:
    """Each row's question key: ``question_id`` when the table has the column, else the
    ``question`` text, else ``session_id``, else ``search_id`` (a row missing the one used falls
    back to the next; a row with none of them is an error naming it)."""
    n = table.num_rows
    columns = [
        table.column(name).to_pylist() if name in table.column_names else [None] * n
        for name in KEY_COLUMNS
    ]
    keys = []
    for index, candidates in enumerate(zip(*columns, strict=True)):
        key = next((str(c) for c in candidates if c not in (None, "")), None)
        if key is None:
            raise ValueError(f"row {index}: no {', '.join(KEY_COLUMNS)} to split by question")
        keys.append(key)
    return keys


def split_table(
    table: pa.Table, test: int = 0, validation: float = 0.0, seed: int = 0
) -> dict[str, pa.Table]:
    """``{"train", "validation", "test"}`` tables of the rows of ``table``, split by question
    (:func:`split_values` over :func:`question_keys`); an empty part is an empty table."""
    keys = question_keys(table)
    parts = split_values(keys, test, validation, seed)
    labels = pa.array([parts[k] for k in keys], pa.string())
    return {part: table.filter(pc.equal(labels, part)) for part in PARTS}


def hold_out(table: pa.Table, column: str, test: int, seed: int = 0) -> tuple[pa.Table, pa.Table]:
    """``(train, test)`` rows of ``table``: ``test`` seeded values of ``column`` held out, each
    with every row that has it (the :func:`split_values` draw over that column, no validation)."""
    values = table.column(column).to_pylist()
    n = len(set(values))
    if not 0 < test < n:
        raise ValueError(f"test: must be in 1..{n - 1} (distinct {column} values), got {test}")
    parts = split_values(values, test=test, seed=seed)
    is_test = pa.array([parts[v] == "test" for v in values])
    return table.filter(pc.invert(is_test)), table.filter(is_test)


def folds(values: Iterable[Hashable], k: int, seed: int = 0) -> dict[Hashable, int]:
    """``{key: fold}``: the distinct ``values`` dealt round-robin into ``k`` folds (0..k-1) in a
    permutation seeded by ``(seed, 23)``; fold sizes differ by at most one."""
    keys = _distinct(values)
    if isinstance(k, bool) or not isinstance(k, int) or not 2 <= k <= len(keys):
        raise ValueError(f"folds must be an integer in 2..{len(keys)} (the questions), got {k!r}")
    order = np.random.default_rng([seed, 23]).permutation(np.array(keys, dtype=object)).tolist()
    return {key: i % k for i, key in enumerate(order)}


def by_question(search_ids: Sequence[str], question_of: Mapping[str, str]) -> dict[str, list[str]]:
    """``{question: [search_id, ...]}`` for ``search_ids`` (each must be in ``question_of``)."""
    out: dict[str, list[str]] = {}
    for search_id in search_ids:
        out.setdefault(question_of[search_id], []).append(search_id)
    return out
