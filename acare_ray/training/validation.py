"""Validation during training: nDCG@10 and the LCE loss per mode on held-out groups, through
``Scorer``.

Each validation group is one query: its positive is judged relevant (1), its negatives not (0).
A mode is evaluated on the groups whose context has that mode's fields (M2 needs a question,
M1 a reasoning, M3 both), with the dropout-free context, through the error policy that serves
(:func:`~acare_ray.scoring.score_isolated`): a group that fails to score (or runs the device out
of memory alone) is left out of that mode's figures, counted in ``val/errors/<mode>`` and logged,
and the others are scored as if it had not been there. Under several workers each scores a share of the groups and the runs are gathered, so
every rank returns the same figures. The loss (``val/loss/<mode>``) is the training objective
on those same scores (:func:`acare_ray.training.loss.lce_loss` at the run's temperature), so it is
comparable to the logged training loss except that training drops context fields.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch

from acare_ray.data.schema import Group
from acare_ray.eval.ir_metrics import evaluate
from acare_ray.scoring import Mode, Scorer, score_isolated
from acare_ray.training.loss import DEFAULT_TEMPERATURE, lce_loss

log = logging.getLogger(__name__)

MEASURE = "nDCG@10"
CHUNK_GROUPS = 32


def group_loss(
    groups: Sequence[Group], run: dict[str, dict[str, float]], temperature: float
) -> float:
    """Mean LCE loss of ``run`` over ``groups`` (positive first in each)."""
    rows = [[run[g.group_id][d.doc_id] for d in (g.positive, *g.negatives)] for g in groups]
    scores = torch.tensor(rows, dtype=torch.float32)
    return float(lce_loss(scores, scores.shape[1], temperature))


def metric_key(mode: Mode | str, measure: str = MEASURE) -> str:
    return f"val/{measure}/{Mode(mode).value}"


def eligible(groups: Sequence[Group], mode: Mode) -> list[Group]:
    """The groups whose context has every field ``mode`` reads."""
    return [g for g in groups if g.context.missing_field(mode) is None]


def qrels_of(groups: Sequence[Group]) -> dict[str, dict[str, int]]:
    return {
        g.group_id: {g.positive.doc_id: 1, **{d.doc_id: 0 for d in g.negatives}} for g in groups
    }


def score_groups(
    scorer: Scorer, groups: Sequence[Group], mode: Mode
) -> tuple[dict[str, dict[str, float]], dict[str, str]]:
    """A run ``{group_id: {doc_id: score}}`` for ``groups`` in ``mode``, and the groups that
    failed to score (``{group_id: error}``), each failing alone."""
    run: dict[str, dict[str, float]] = {}
    errors: dict[str, str] = {}
    for start in range(0, len(groups), CHUNK_GROUPS):
        chunk = groups[start : start + CHUNK_GROUPS]
        items = [(g.context, [d.text for d in (g.positive, *g.negatives)]) for g in chunk]
        for group, scores in zip(chunk, score_isolated(scorer, items, mode)):
            if isinstance(scores, Exception):
                errors[group.group_id] = f"{type(scores).__name__}: {scores}"
                continue
            docs = (group.positive, *group.negatives)
            run[group.group_id] = {d.doc_id: float(s) for d, s in zip(docs, scores)}
    return run, errors


def _gather(run: dict[str, Any], world_size: int) -> dict[str, Any]:
    if world_size == 1:
        return run
    import torch.distributed as dist

    parts: list[Any] = [None] * world_size
    dist.all_gather_object(parts, run)
    return {qid: docs for part in parts for qid, docs in part.items()}


def validate(
    scorer: Scorer,
    groups: Sequence[Group],
    modes: Sequence[Mode | str],
    rank: int = 0,
    world_size: int = 1,
    temperature: float = DEFAULT_TEMPERATURE,
) -> dict[str, float]:
    """``{"val/nDCG@10/M0": ..., "val/loss/M0": ..., ...}`` for each mode with at least one
    eligible group that scored; ``val/errors/<mode>`` (the number of groups that failed to
    score) only where some did.

    All ranks must call it with the same ``groups`` and ``modes`` (it gathers across them).
    """
    metrics: dict[str, float] = {}
    for mode in map(Mode, modes):
        chosen = eligible(groups, mode)
        if not chosen:
            continue
        run, errors = score_groups(scorer, chosen[rank::world_size], mode)
        run, errors = _gather(run, world_size), _gather(errors, world_size)
        for group_id, error in sorted(errors.items())[:5]:
            log.warning("validation %s: group %s failed to score: %s", mode.value, group_id, error)
        if errors:
            metrics[metric_key(mode, "errors")] = float(len(errors))
        scored = [g for g in chosen if g.group_id in run]
        if not scored:
            continue
        metrics[metric_key(mode)] = evaluate(qrels_of(scored), run, [MEASURE]).mean[MEASURE]
        metrics[metric_key(mode, "loss")] = group_loss(scored, run, temperature)
    return metrics
