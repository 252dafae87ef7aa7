"""``acare rerank``: score every candidate of every search in one mode, over Parquet.

``read_parquet -> skip searches already written -> map_batches(ScorerActor) ->
write_parquet``; one ``RERANK_OUTPUT`` row per input row (bad rows carry their ``error``),
resumable (see :mod:`acare_ray.offline.resume`). With fusion on, each row's ranking follows the
fused value (:mod:`acare_ray.ranking.fusion`); the fusion setting is part of the resume manifest, so a
resumed job never mixes fused and unfused rows.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from acare_ray.offline.actor import ScorerActor
from acare_ray.offline.job import ActorPool, Job, JobCounts, actor_scorer, ray_session, run_job
from acare_ray.ranking.checkpoint_settings import read_fusion
from acare_ray.ranking.fusion import FusionConfig, resolve_fusion
from acare_ray.scoring import Mode, ScorerSettings, parse_mode


@dataclass(frozen=True)
class RerankConfig:
    """``input``: searches Parquet (file or folder); ``output``: a folder of part files.

    ``mode``: ``M0``..``M3`` or ``auto`` (each row's richest mode); ``top_k``: keep the best k
    per search (None keeps all). ``ray_address``: None connects to ``RAY_ADDRESS`` or starts a
    local cluster; ``"auto"`` joins a running one. ``fusion``: ``auto`` (the checkpoint's fitted
    setting, else none), ``none``, or a setting such as ``rrf:k=60,weight=0.5`` /
    ``linear:alpha=0.3``. ``retry_errors``: score again the searches whose output rows carry
    an error, replacing those rows (see :mod:`acare_ray.offline.resume`).
    """

    input: str
    output: str
    model: str
    mode: str = "auto"
    top_k: int | None = None
    pool: ActorPool = field(default_factory=ActorPool)
    revision: str | None = None
    scorer: ScorerSettings = field(default_factory=ScorerSettings)
    ray_address: str | None = None
    fusion: str = "auto"
    retry_errors: bool = False

    def __post_init__(self) -> None:
        mode = parse_mode(self.mode)  # parsed once: the job and its manifest use its value
        object.__setattr__(self, "mode", mode.value if isinstance(mode, Mode) else mode)
        resolve_fusion(self.fusion, None)
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {self.top_k}")

    def resolved_fusion(self) -> FusionConfig:
        """The fusion this job applies: ``fusion``, with ``auto`` resolved for the model."""
        return resolve_fusion(self.fusion, read_fusion(self.model))


def run(config: RerankConfig) -> JobCounts:
    """Run the rerank job; returns its counts."""
    mode = config.mode
    options = actor_scorer(config.scorer, config.revision)
    fusion = config.resolved_fusion()
    # Unfused jobs keep the manifest they always had, so outputs written before fusion resume.
    fused = {"fusion": fusion.label} if fusion.enabled else {}
    job = Job(
        "rerank",
        config.input,
        config.output,
        ScorerActor,
        actor_kwargs={
            "model": config.model,
            "modes": (mode,),
            "top_k": config.top_k,
            "scorer_options": options,
            "fusion": fusion if fusion.enabled else None,
        },
        manifest={
            "model": config.model,
            "modes": [mode],
            "top_k": config.top_k,
            "scorer": options,
            **fused,
        },
        key_column="mode",
        retry_errors=config.retry_errors,
    )
    with ray_session(config.ray_address):
        return run_job(job, config.pool)
