"""Thin Ray Data actor classes: load one Scorer in ``__init__``, run a pure batch function.

Ray Data constructs each class once per pool actor (``map_batches(Cls, compute=
ActorPoolStrategy(...))``) and calls it with ``pyarrow.Table`` batches. The work itself lives
in :mod:`acare_ray.offline.score`, so tests and the actors run the same code.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from acare_ray.data.schema import RERANK_OUTPUT
from acare_ray.offline.score import RELABEL_OUTPUT, relabel_rows, rerank_rows, table_rows
from acare_ray.ranking.fusion import FusionConfig
from acare_ray.scoring import Scorer, ScorerSettings

log = logging.getLogger(__name__)


def actor_device() -> str:
    """``"cuda"`` when Ray gave this actor a GPU and CUDA works, else ``"cpu"``.

    A GPU-less build or a node that advertises GPUs without a driver falls back to CPU (with a
    warning) instead of failing; an actor without a Ray GPU never touches the node's GPUs.
    """
    import ray
    import torch

    gpus = ray.get_gpu_ids()
    if not gpus:
        return "cpu"
    if torch.cuda.is_available():
        return "cuda"
    log.warning("Ray assigned GPU %s but CUDA is not available here: scoring on CPU", gpus)
    return "cpu"


def load_scorer(model: str, cpus: float, options: dict[str, Any]) -> Scorer:
    """The actor's Scorer on :func:`actor_device`; on CPU, torch uses ``cpus`` threads.
    ``options``: :func:`acare_ray.offline.job.actor_scorer`'s settings and revision."""
    import torch

    device = actor_device()
    if device == "cpu":
        torch.set_num_threads(max(1, min(int(cpus), os.cpu_count() or 1)))
    settings = dict(options)
    revision = settings.pop("revision", None)
    return Scorer.from_settings(model, ScorerSettings.parse(settings), revision, device=device)


class ScorerActor:
    """Rerank: one ``RERANK_OUTPUT`` row per input row and mode."""

    def __init__(
        self,
        model: str,
        modes: Sequence[str],
        top_k: int | None = None,
        scorer_options: dict[str, Any] | None = None,
        cpus: float = 1.0,
        fusion: FusionConfig | None = None,
    ) -> None:
        self.scorer = load_scorer(model, cpus, scorer_options or {})
        self.modes = tuple(modes)
        self.top_k = top_k
        self.fusion = fusion

    def __call__(self, batch: pa.Table) -> pa.Table:
        rows = rerank_rows(self.scorer, table_rows(batch), self.modes, self.top_k, self.fusion)
        return pa.Table.from_pylist(rows, schema=RERANK_OUTPUT)


class RelabelActor:
    """Relabel: one ``RELABEL_OUTPUT`` row (a training group, or why not) per input row."""

    def __init__(
        self,
        model: str,
        negatives: int = 7,
        scorer_options: dict[str, Any] | None = None,
        cpus: float = 1.0,
        gold_aware: bool = False,
        negatives_from: str = "bottom",
        keep_failed: bool = False,
    ) -> None:
        self.scorer = load_scorer(model, cpus, scorer_options or {})
        self.negatives = negatives
        self.options = {
            "gold_aware": gold_aware,
            "negatives_from": negatives_from,
            "keep_failed": keep_failed,
        }

    def __call__(self, batch: pa.Table) -> pa.Table:
        rows = relabel_rows(self.scorer, table_rows(batch), self.negatives, **self.options)
        return pa.Table.from_pylist(rows, schema=RELABEL_OUTPUT)
