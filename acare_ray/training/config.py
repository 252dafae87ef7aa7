"""``TrainConfig``: every setting of an LCE fine-tuning run, frozen (docs/architecture.md, 5.3).

One optimizer step consumes ``batch_groups x grad_accum x workers`` groups (the global batch).
Steps per epoch = ``train groups // global batch`` (a short last batch is dropped so every
worker runs the same number of steps); total steps = ``epochs x steps per epoch``, or
``max_steps`` when set. Data order, context dropout and dropout masks are functions of
(``seed``, step), so a relaunch under the same ``name`` continues at the same step with the
same data.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from acare_ray.scoring import DEFAULT_MODEL, Mode, ScorerSettings
from acare_ray.training.loss import DEFAULT_GROUP_SIZE, DEFAULT_TEMPERATURE
from acare_ray.training.stopping import check_metric

STRATEGIES = ("ddp", "fsdp")
# Settings that fix which groups each step sees, which parameters the optimizer holds, or which
# weights a checkpoint holds (ema_decay: averaged or trained); a relaunch that changes one cannot
# resume.
RESUME_KEYS = (
    "data",
    "data_weights",
    "val_data",
    "val_fraction",
    "split_seed",
    "model",
    "revision",
    "group_size",
    "batch_groups",
    "grad_accum",
    "workers",
    "epochs",
    "max_steps",
    "seed",
    "p_question",
    "p_reasoning",
    "freeze_embeddings",
    "freeze_layers",
    "ema_decay",
)


@dataclass(frozen=True)
class TrainConfig:
    """An LCE fine-tuning run as a Ray Train job.

    Data: ``data`` is a ``TRAINING_GROUPS`` Parquet file/folder or a NeMo JSONL file
    (``.jsonl``/``.json``), or several of them (a tuple). With ``data_weights`` (one positive
    weight per source) each training slot draws its source with probability proportional to
    the weight and takes that source's next group (each source is visited in seeded
    permutations, reshuffled on every pass), so a small source is repeated and a large one
    subsampled; without weights the sources are concatenated and visited uniformly. Validation
    groups come from ``val_data`` or, without it, from a ``val_fraction`` of the questions of each
    source (the project's one split, :mod:`acare_ray.eval.splits`: by question text, else session, so
    one question never sits on both sides; the draw is seeded by ``split_seed``, not by the
    training ``seed``, so every training seed validates on the same questions);
    ``val_max_groups`` bounds the validation cost.

    Output: checkpoints go to ``<output>/<name>/checkpoint_*`` (Ray Train storage); each is a
    Hugging Face model folder that ``Scorer.from_pretrained`` loads.

    ``scorer``: how the model is loaded and scores (:class:`~acare_ray.scoring.ScorerSettings`,
    the same section as the offline jobs' and the Serve app's: ``backend``, ``max_length``,
    the batching of validation); the worker decides the device and float32 weights, so
    ``device`` and ``dtype`` are refused there.

    Speed levers (docs/training.md has their measurement): ``cpu_bf16`` (bf16 autocast on CPU;
    ``"auto"``: only on CPUs with native bf16, float32 elsewhere, where emulated bf16 is far slower),
    ``chunk_tokens`` (cross-encoders: each micro-batch's pairs run sorted by length in chunks of
    at most that many padded tokens; same scores, less padding), ``freeze_embeddings`` and
    ``freeze_layers`` (the embeddings and the lowest N transformer layers get no gradient and no
    optimizer state).

    ``ema_decay``: validate and save an exponential moving average of the weights
    (:class:`~acare_ray.training.loop.WeightAverage`, a window of about ``1 / (1 - ema_decay)``
    steps) instead of the weights of the last step; training itself goes on from the trained
    weights, which each checkpoint keeps in ``trainer_state.pt`` for resuming. DDP only.

    Selection and stopping (:mod:`acare_ray.training.stopping`): with ``select_metric``
    (``val/nDCG@10/<mode>`` or ``val/loss/<mode>``) the run's result is its best validated
    checkpoint, not its last (Ray Train keeps the ``keep_checkpoints`` best by that metric and
    the latest), and the untrained model is saved at step 0 as a candidate. ``patience``: stop
    once that many validations in a row have not beaten the best by more than ``min_delta``.
    ``time_budget_s``: stop (validate and save) after that much training time, summed over
    resumes. Steps (``max_steps`` or ``epochs``) stay the upper bound and fix the learning-rate
    schedule; the curve decides when to stop before it.
    """

    data: str | tuple[str, ...]
    data_weights: tuple[float, ...] | None = None
    model: str = DEFAULT_MODEL
    revision: str | None = None
    output: str = "runs"
    name: str = "acare-train"
    val_data: str | None = None
    val_fraction: float = 0.1
    split_seed: int = 0
    val_max_groups: int | None = 1000
    eval_modes: tuple[str, ...] = ("M0", "M1", "M2", "M3")
    eval_at_start: bool = True
    workers: int = 1
    cpus_per_worker: int = 1
    gpus_per_worker: float = 0.0
    strategy: str = "ddp"
    epochs: int = 1
    max_steps: int | None = None
    lr: float = 2e-5
    weight_decay: float = 0.01
    warmup_ratio: float = 0.1
    temperature: float = DEFAULT_TEMPERATURE
    group_size: int = DEFAULT_GROUP_SIZE
    batch_groups: int = 8
    grad_accum: int = 1
    max_grad_norm: float | None = 1.0
    p_question: float = 0.5
    p_reasoning: float = 0.5
    seed: int = 0
    checkpoint_every: int = 500
    keep_checkpoints: int = 2
    max_failures: int = 0
    log_every: int = 10
    scorer: ScorerSettings = field(default_factory=ScorerSettings)
    cpu_bf16: bool | str = False
    chunk_tokens: int | None = None
    freeze_embeddings: bool = False
    freeze_layers: int = 0
    ema_decay: float | None = None
    select_metric: str | None = None
    patience: int | None = None
    min_delta: float = 0.0
    time_budget_s: float | None = None
    ray_address: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "scorer", ScorerSettings.parse(self.scorer))
        if self.scorer.device is not None or self.scorer.dtype is not None:
            raise ValueError(
                "scorer.device/scorer.dtype: the trainer places the model on its worker's device "
                "(gpus_per_worker) in float32 (cpu_bf16 for bf16 autocast on CPU)"
            )
        if not self.sources or not all(isinstance(p, str) and p for p in self.sources):
            raise ValueError(f"data must be one or more non-empty paths, got {self.data!r}")
        if self.data_weights is not None:
            weights = self.data_weights
            if len(weights) != len(self.sources):
                raise ValueError(
                    f"data_weights has {len(weights)} weight(s) for {len(self.sources)} data "
                    "source(s); give one per source"
                )
            if not all(isinstance(w, int | float) and 0 < w < float("inf") for w in weights):
                raise ValueError(f"data_weights must be finite and > 0, got {list(weights)}")
        positive = ("workers", "cpus_per_worker", "epochs", "batch_groups", "grad_accum")
        for name in positive:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if self.chunk_tokens is not None and (
            isinstance(self.chunk_tokens, bool)
            or not isinstance(self.chunk_tokens, int)
            or self.chunk_tokens < 1
        ):
            raise ValueError(
                f"chunk_tokens must be an integer >= 1 or None, got {self.chunk_tokens!r}"
            )
        if (
            isinstance(self.freeze_layers, bool)
            or not isinstance(self.freeze_layers, int)
            or self.freeze_layers < 0
        ):
            raise ValueError(f"freeze_layers must be an integer >= 0, got {self.freeze_layers!r}")
        if not (isinstance(self.cpu_bf16, bool) or self.cpu_bf16 == "auto"):
            raise ValueError(f"cpu_bf16 must be true, false or 'auto', got {self.cpu_bf16!r}")
        if self.ema_decay is not None:
            if isinstance(self.ema_decay, bool) or not isinstance(self.ema_decay, int | float):
                raise ValueError(f"ema_decay must be a number in (0, 1), got {self.ema_decay!r}")
            if not 0 < self.ema_decay < 1:
                raise ValueError(f"ema_decay must be in (0, 1), got {self.ema_decay}")
            if self.strategy == "fsdp":
                raise ValueError(
                    "ema_decay is not supported with strategy 'fsdp' (the average would be "
                    "sharded like the weights); use strategy 'ddp'"
                )
        if self.group_size < 2:
            raise ValueError(
                f"group_size must be >= 2 (1 positive + negatives), got {self.group_size}"
            )
        if self.max_steps is not None and self.max_steps < 1:
            raise ValueError(f"max_steps must be >= 1 or None, got {self.max_steps}")
        if self.checkpoint_every < 1:
            raise ValueError(f"checkpoint_every must be >= 1, got {self.checkpoint_every}")
        if self.max_failures < -1:
            raise ValueError(f"max_failures must be >= -1 (-1: unlimited), got {self.max_failures}")
        if self.keep_checkpoints < 1:
            raise ValueError(f"keep_checkpoints must be >= 1, got {self.keep_checkpoints}")
        if not 0 <= self.val_fraction < 1:
            raise ValueError(f"val_fraction must be in [0, 1), got {self.val_fraction}")
        for name in ("p_question", "p_reasoning", "warmup_ratio"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"{name} must be in [0, 1], got {getattr(self, name)}")
        if self.lr <= 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if self.temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        if self.strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {STRATEGIES}, got {self.strategy!r}")
        if self.gpus_per_worker < 0:
            raise ValueError(f"gpus_per_worker must be >= 0, got {self.gpus_per_worker}")
        for mode in self.eval_modes:
            if mode not in Mode.__members__:
                raise ValueError(f"eval_modes: {mode!r} is not one of {list(Mode.__members__)}")
        if self.select_metric is not None:
            check_metric(self.select_metric, self.eval_modes)
        if self.patience is not None:
            if isinstance(self.patience, bool) or not isinstance(self.patience, int):
                raise ValueError(f"patience must be an integer >= 1, got {self.patience!r}")
            if self.patience < 1:
                raise ValueError(f"patience must be >= 1, got {self.patience}")
            if self.select_metric is None:
                raise ValueError("patience needs select_metric (the curve early stopping reads)")
        if not 0 <= self.min_delta < float("inf"):
            raise ValueError(f"min_delta must be >= 0, got {self.min_delta}")
        if self.time_budget_s is not None and not 0 < self.time_budget_s < float("inf"):
            raise ValueError(f"time_budget_s must be > 0, got {self.time_budget_s}")
        if not self.name or "/" in self.name:
            raise ValueError(f"name must be a non-empty folder name, got {self.name!r}")

    @property
    def sources(self) -> tuple[str, ...]:
        """The training data paths, one or several."""
        return (self.data,) if isinstance(self.data, str) else tuple(self.data)

    @property
    def use_gpu(self) -> bool:
        return self.gpus_per_worker > 0

    @property
    def global_batch_groups(self) -> int:
        """Groups consumed by one optimizer step across all workers."""
        return self.batch_groups * self.grad_accum * self.workers

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["eval_modes"] = list(self.eval_modes)
        for key in ("data", "data_weights"):  # JSON has lists: a saved config compares equal
            if isinstance(out[key], tuple):
                out[key] = list(out[key])
        return out

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> TrainConfig:
        known = {f.name for f in fields(cls)} | {"backend", "max_length"}
        unknown = set(values) - known
        if unknown:
            raise ValueError(f"unknown TrainConfig fields: {', '.join(sorted(unknown))}")
        values = dict(values)
        # A run recorded before the scorer section had these two flat.
        flat = {k: values.pop(k) for k in ("backend", "max_length") if k in values}
        if flat:
            values["scorer"] = {**(values.get("scorer") or {}), **flat}
        for key in ("eval_modes", "data", "data_weights"):
            if isinstance(values.get(key), list):
                values[key] = tuple(values[key])
        return cls(**values)

    def resume_mismatches(self, saved: dict[str, Any]) -> list[str]:
        """Settings that differ from a saved run's and would change its data order."""
        mine = self.to_dict()
        return [
            f"{key}: saved {saved.get(key)!r}, now {mine[key]!r}"
            for key in RESUME_KEYS
            if key in saved and saved[key] != mine[key]
        ]
