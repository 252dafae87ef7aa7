"""``acare relabel``: a labeler model turns searches into LCE training groups, over Parquet.

The labeler (any model :class:`~acare_ray.scoring.scorer.Scorer` loads, typically bigger than the
model being trained) reads each search's sub-query and reasoning plus the original question,
the gold answer and the supporting documents (:func:`~acare_ray.offline.score.labeler_context`)
and ranks the candidates: the best becomes the positive, the ``negatives`` worst the negatives.
Searches of failed trajectories (``judge_ok == False``) are filtered out. The output has one
``RELABEL_OUTPUT`` row per input row, so nothing disappears unaccounted for: ``status`` says
whether it is a group (``ok``) or why not. :func:`read_relabel_groups` returns the groups.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.dataset as pads

from acare_ray.data.groups import ok_groups
from acare_ray.data.schema import TRAINING_GROUPS
from acare_ray.offline.actor import RelabelActor
from acare_ray.offline.job import ActorPool, Job, JobCounts, actor_scorer, ray_session, run_job
from acare_ray.offline.resume import storage_paths
from acare_ray.offline.score import LABELER_INSTRUCTION, NEGATIVES_FROM
from acare_ray.scoring import ScorerSettings


@dataclass(frozen=True)
class RelabelConfig:
    """``input``: searches Parquet with ``question``, ``answer``, ``supporting_docs`` and
    optionally ``judge_ok`` and ``supporting_titles``; ``output``: a folder of
    ``RELABEL_OUTPUT`` part files.

    ``gold_aware``: the positive is a gold candidate (relevance > 0) and no negative is;
    ``negatives_from``: ``bottom`` (the labeler's worst) or ``hard`` (its best-ranked
    non-positives); ``keep_failed``: also label searches of failed trajectories (gold labels do
    not depend on the agent's success). See :func:`~acare_ray.offline.score.relabel_rows`.

    ``retry_errors``: label again the searches whose rows carry an error (every status but
    ``ok``), replacing those rows.

    The labeler's instruction defaults to :data:`LABELER_INSTRUCTION` (set
    ``scorer.instruction`` to change it).
    """

    input: str
    output: str
    model: str
    negatives: int = 7
    gold_aware: bool = False
    negatives_from: str = "bottom"
    keep_failed: bool = False
    pool: ActorPool = field(default_factory=ActorPool)
    revision: str | None = None
    scorer: ScorerSettings = field(
        default_factory=lambda: ScorerSettings(instruction=LABELER_INSTRUCTION)
    )
    ray_address: str | None = None
    retry_errors: bool = False

    def __post_init__(self) -> None:
        if self.negatives < 1:
            raise ValueError(f"negatives must be >= 1, got {self.negatives}")
        if self.negatives_from not in NEGATIVES_FROM:
            raise ValueError(
                f"negatives_from must be one of {NEGATIVES_FROM}, got {self.negatives_from!r}"
            )


def run(config: RelabelConfig) -> JobCounts:
    """Run the relabel job; ``per_key`` of the counts is keyed by status."""
    options = actor_scorer(config.scorer, config.revision)
    labels = {
        "negatives": config.negatives,
        "gold_aware": config.gold_aware,
        "negatives_from": config.negatives_from,
        "keep_failed": config.keep_failed,
    }
    job = Job(
        "relabel",
        config.input,
        config.output,
        RelabelActor,
        actor_kwargs={"model": config.model, "scorer_options": options, **labels},
        manifest={"model": config.model, "scorer": options, **labels},
        key_column="status",
        retry_errors=config.retry_errors,
    )
    with ray_session(config.ray_address):
        return run_job(job, config.pool)


def read_relabel_groups(path: str) -> pa.Table:
    """The training groups (``status == "ok"``) of a relabel output, as ``TRAINING_GROUPS``."""
    fs, inner, _ = storage_paths(path)
    dataset = pads.dataset(inner, filesystem=fs, format="parquet")
    return ok_groups(dataset.to_table(columns=[*TRAINING_GROUPS.names, "status"]))[0]
