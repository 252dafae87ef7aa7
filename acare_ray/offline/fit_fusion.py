"""``acare fit-fusion``: fit a checkpoint's fusion on a training split and store it with it.

One Ray Data scoring pass over the labelled training searches in one mode (resumable, into
``<work_dir>/rerank``), then a grid over the fusion weight (``rrf``: ``weight`` at ``k``;
``linear``: ``alpha``; 0.0, 0.1, ..., 1.0, :func:`acare_ray.ranking.fusion.grid`) scored by nDCG@10
(the ``measure``) over the searches with a relevant candidate.

``rule="safe"`` (the default, :mod:`acare_ray.ranking.fusion_fit`): the setting is chosen with a prior
towards the first stage (smallest reranker weight within one standard error of the best gain),
cross-validated over question-grouped folds, and stored only when the cross-validated gain over
the first stage has a lower bound >= 0; otherwise the checkpoint stores the first-stage order
(pass-through, ``rrf`` with weight 0), which ``acare rerank``, ``acare eval`` and ``acare
serve`` then use by default. ``rule="best"``: the grid's best mean (the first on a tie),
whatever its margin (for experiments; never the default).

The stored ``fusion`` entry of the checkpoint's ``acare.json`` says how it was fitted
(``fitted``: decision, reason, cross-validated gain). ``<work_dir>/fit.json`` has every grid
point with its gain over the first stage.

The same pass fits the mode's relevance calibration (Platt scaling of the raw scores on the
judged candidates, :mod:`acare_ray.ranking.calibration`), stored under ``calibration.<mode>`` with the
expected calibration error of sigmoid and of the calibration on held-out question folds; the
Serve app's 0..1 relevance uses it for that mode.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from acare_ray.eval.ir_metrics import parse_measure
from acare_ray.offline.actor import ScorerActor
from acare_ray.offline.evaluate import load_first_stage, load_qrels, load_questions, load_runs
from acare_ray.offline.job import ActorPool, Job, actor_scorer, ray_session, run_job
from acare_ray.ranking.calibration import Calibration, fit_platt, held_out_ece
from acare_ray.ranking.checkpoint_settings import write_calibration, write_fusion
from acare_ray.ranking.fusion import DEFAULT_RRF_K, fit, grid
from acare_ray.ranking.fusion_fit import SafetyRule, fit_safely
from acare_ray.scoring import Mode, ScorerSettings, parse_mode

RULES = ("safe", "best")


@dataclass(frozen=True)
class FitFusionConfig:
    """``input``: labelled training searches (never the test split); ``model``: the checkpoint
    folder the fitted setting is written into (unless ``write`` is False); ``work_dir``: the
    scoring output and ``fit.json``. ``methods``: ``rrf`` and/or ``linear``. ``rule``: ``safe``
    (cross-validated, pass-through unless a sure gain; ``safety`` sets folds and confidence) or
    ``best`` (the grid's best point)."""

    input: str
    model: str
    work_dir: str
    mode: str = "M3"
    methods: tuple[str, ...] = ("rrf", "linear")
    k: float = DEFAULT_RRF_K
    measure: str = "nDCG@10"
    write: bool = True
    rule: str = "safe"
    safety: SafetyRule = field(default_factory=SafetyRule)
    pool: ActorPool = field(default_factory=ActorPool)
    revision: str | None = None
    scorer: ScorerSettings = field(default_factory=ScorerSettings)
    ray_address: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(parse_mode(self.mode), Mode):
            raise ValueError(f"mode must be one of M0..M3, got {self.mode!r}")
        object.__setattr__(self, "mode", parse_mode(self.mode).value)
        grid(self.methods, self.k)
        if self.rule not in RULES:
            raise ValueError(f"rule must be one of {RULES}, got {self.rule!r}")
        kind, k = parse_measure(self.measure)
        object.__setattr__(self, "measure", f"{kind}@{k}")
        if self.write and not Path(self.model).is_dir():
            raise ValueError(f"{self.model}: the fitted fusion is stored in a checkpoint folder")


def fit_calibration(
    searches: dict[str, tuple], qrels: dict, question_of: dict[str, str], config: FitFusionConfig
) -> dict[str, Any]:
    """Platt scaling of the mode's raw scores on the judged candidates
    (:mod:`acare_ray.ranking.calibration`), with the expected calibration error of sigmoid and of the
    calibration on held-out question folds; ``{"skipped": reason}`` when it cannot be fitted."""
    scores, labels, questions = [], [], []
    for qid, (doc_ids, values, _, _) in searches.items():
        judged = qrels.get(qid, {})
        for doc_id, value in zip(doc_ids, values, strict=True):
            if doc_id in judged:
                scores.append(value)
                labels.append(int(judged[doc_id] > 0))
                questions.append(question_of[qid])
    x, y = np.asarray(scores, dtype=np.float64), np.asarray(labels)
    try:
        calibration = fit_platt(x, y)
    except ValueError as err:
        return {"skipped": str(err)}
    out: dict[str, Any] = {**calibration.as_dict(), "mode": config.mode}
    if len(set(questions)) >= 2 * config.safety.folds:
        out["held_out"] = held_out_ece(x, y, questions, config.safety.folds, config.safety.seed)
    return out


def run(config: FitFusionConfig) -> dict[str, Any]:
    """Score, fit, store; returns what ``fit.json`` holds."""
    out = Path(config.work_dir)
    rerank_dir = str(out / "rerank")
    options = actor_scorer(config.scorer, config.revision)
    job = Job(
        "fit-fusion",
        config.input,
        rerank_dir,
        ScorerActor,
        actor_kwargs={"model": config.model, "modes": (config.mode,), "scorer_options": options},
        manifest={"model": config.model, "modes": [config.mode], "scorer": options},
        key_column="mode",
    )
    with ray_session(config.ray_address):
        run_job(job, config.pool)
    qrels = load_qrels(config.input)
    scores, errored = load_runs(rerank_dir, (config.mode,))
    first = load_first_stage(config.input)
    searches = {}
    for qid, by_doc in scores[config.mode].items():
        doc_ids, fs_scores, fs_ranks, _ = first[qid]
        searches[qid] = (doc_ids, [by_doc[d] for d in doc_ids], fs_scores, fs_ranks)
    fitted = {
        "objective": config.measure,
        "mode": config.mode,
        "input": config.input,
        "rule": config.rule,
        "errored_rows": errored.get(config.mode, 0),
    }
    configs = grid(config.methods, config.k)
    question_of = load_questions(config.input)  # read once: the folds and the calibration's
    if config.rule == "best":
        best, table = fit(searches, qrels, configs, config.measure)
        fitted["value"] = max(row[config.measure] for row in table)
        fitted["searches"] = sum(any(r > 0 for r in qrels.get(q, {}).values()) for q in searches)
    else:
        safe = fit_safely(searches, qrels, configs, question_of, config.measure, config.safety)
        best, table = safe.stored, safe.grid
        fitted.update(safe.fitted(), safety=config.safety.as_dict())
        chosen_row = next(r for r in table if r["fusion"] == safe.chosen.label)
        fitted["value"] = (
            chosen_row[config.measure] if safe.decision == "fused" else safe.first_stage
        )
    result = {"fusion": best.as_dict(), "label": best.label, "fitted": fitted, "grid": table}
    result["calibration"] = fit_calibration(searches, qrels, question_of, config)
    if config.write:
        result["stored_in"] = str(write_fusion(config.model, best, fitted))
        if result["calibration"].get("a") is not None:
            write_calibration(
                config.model,
                config.mode,
                Calibration(result["calibration"]["a"], result["calibration"]["b"]),
                {k: v for k, v in result["calibration"].items() if k not in ("a", "b")},
            )
    out.mkdir(parents=True, exist_ok=True)
    (out / "fit.json").write_text(json.dumps(result, indent=2) + "\n")
    return result
