"""A fusion fit that is not a coin toss: question-grouped cross-validation, a prior towards the
first stage, and a safety rule that stores the first-stage order unless fusion is a sure gain.

The plain grid fit (:func:`acare_ray.ranking.fusion.fit`) takes the grid's best point whatever its
margin. On a flat grid that is noise: two training seeds stored different weights and one of
them served an order no better than the first stage. :func:`fit_safely` instead:

1. Scores every candidate setting and the **first stage** (the pass-through order,
   :data:`PASS_THROUGH`) on every judged search; a setting's **gain** on a question is its mean
   measure over the question's searches minus the first stage's. Questions, not searches, are the
   unit: the searches of one question are not independent draws.
2. **Chooses with a prior towards the first stage** (:func:`choose`): among the settings whose
   mean gain is within one standard error of the best (the paired standard error of the
   difference to the best over questions, the "one-standard-error rule"), the one with the
   smallest reranker weight (``weight`` for rrf, ``alpha`` for linear; the higher mean gain on a
   tie). A flat grid then lands near the first stage, not on the noise's maximum.
3. **Cross-validates that choice** over ``folds`` question-grouped folds
   (:func:`acare_ray.eval.splits.folds`): each fold's questions get the gain of the setting chosen on
   the other folds. Their mean is an honest estimate of what the procedure gains on questions it
   did not see, with a percentile bootstrap over questions.
4. **The safety rule**: the setting chosen on all questions is stored only when the
   cross-validated gain's one-sided lower bound (the ``1 - confidence`` percentile) is at least
   0. Otherwise the decision is ``pass-through``: the stored setting is :data:`PASS_THROUGH`,
   which every surface then serves by default (the order the agent arrived with).

Pure numpy; no Ray, no torch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from acare_ray.eval.ir_metrics import evaluate
from acare_ray.eval.splits import folds as question_folds
from acare_ray.ranking.fusion import DEFAULT_RRF_K, FusionConfig, fuse, ranked_run

PASS_THROUGH = FusionConfig("rrf", k=DEFAULT_RRF_K, weight=0.0)
"""The first-stage order as a fusion setting: rrf with no reranker weight orders candidates by
their first-stage rank alone (exactly; ties cannot occur), so every surface serves it as is."""


@dataclass(frozen=True)
class SafetyRule:
    """``folds`` question-grouped folds; the stored setting needs the cross-validated gain's
    one-sided ``confidence`` lower bound (``resamples`` bootstrap draws, seeded) to be >= 0."""

    folds: int = 5
    confidence: float = 0.95
    resamples: int = 4000
    seed: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.folds, bool) or not isinstance(self.folds, int) or self.folds < 2:
            raise ValueError(f"folds must be an integer >= 2, got {self.folds!r}")
        if not 0.5 <= self.confidence < 1:
            raise ValueError(f"confidence must be in [0.5, 1), got {self.confidence}")
        if self.resamples < 100:
            raise ValueError(f"resamples must be >= 100, got {self.resamples}")

    def as_dict(self) -> dict[str, Any]:
        return {
            "folds": self.folds,
            "confidence": self.confidence,
            "resamples": self.resamples,
            "seed": self.seed,
        }


@dataclass(frozen=True)
class SafeFit:
    """What :func:`fit_safely` decided. ``stored``: the setting to store (``chosen`` when
    ``decision == "fused"``, else :data:`PASS_THROUGH`); ``cv``: the cross-validated gain
    ``{"mean", "low", "high", "folds"}``; ``grid``: per setting, its mean measure and mean gain
    over the first stage with a two-sided bootstrap interval; ``reason``: one sentence."""

    decision: str
    stored: FusionConfig
    chosen: FusionConfig
    cv: dict[str, Any]
    grid: list[dict[str, Any]]
    first_stage: float
    questions: int
    searches: int
    reason: str

    def fitted(self) -> dict[str, Any]:
        """The summary stored with the checkpoint (``fusion.fitted`` in ``acare.json``)."""
        return {
            "decision": self.decision,
            "chosen": self.chosen.label,
            "cv_gain": self.cv,
            "first_stage": self.first_stage,
            "questions": self.questions,
            "searches": self.searches,
            "reason": self.reason,
        }


def is_pass_through(config: FusionConfig) -> bool:
    """The setting orders by the first stage alone (no reranker weight)."""
    return config.method != "none" and reranker_weight(config) == 0


def reranker_weight(config: FusionConfig) -> float:
    """The reranker's share of a setting (1 for ``none``: the reranker alone)."""
    return {"rrf": config.weight, "linear": config.alpha}.get(config.method, 1.0)


def search_values(
    searches: Mapping[str, tuple[Sequence[str], Any, Any, Any]],
    qrels: Mapping[str, Mapping[str, int]],
    configs: Sequence[FusionConfig],
    measure: str,
) -> tuple[list[str], np.ndarray]:
    """``(search_ids, values)``: the judged searches (a relevant candidate) and ``values[c, s]``,
    setting ``c``'s ``measure`` on search ``s``."""
    judged = sorted(q for q in searches if any(r > 0 for r in qrels.get(q, {}).values()))
    if not judged:
        raise ValueError("no search has a relevant candidate: nothing to fit the fusion on")
    values = np.empty((len(configs), len(judged)))
    for c, config in enumerate(configs):
        run = {}
        for q in judged:
            doc_ids, scores, fs_scores, fs_ranks = searches[q]
            run[q] = ranked_run(doc_ids, fuse(scores, config, fs_scores, fs_ranks).order)
        per_query = evaluate({q: qrels[q] for q in judged}, run, [measure]).per_query
        values[c] = [next(iter(per_query.values()))[q] for q in judged]
    return judged, values


def choose(gains: np.ndarray, weights: Sequence[float]) -> int:
    """The setting (row of ``gains[c, question]``) with the smallest reranker weight among those
    within one standard error of the best mean gain; the higher mean gain on a tie."""
    means = gains.mean(axis=1)
    best = int(np.argmax(means))
    n = gains.shape[1]
    diffs = gains[best] - gains
    se = diffs.std(axis=1, ddof=1) / np.sqrt(n) if n > 1 else np.zeros(len(gains))
    within = np.flatnonzero(means[best] - means <= se + 1e-12)
    return int(min(within, key=lambda c: (weights[c], -means[c], c)))


def _bootstrap_means(values: np.ndarray, resamples: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng([seed, 5])
    return values[rng.integers(0, values.size, size=(resamples, values.size))].mean(axis=1)


def fit_safely(
    searches: Mapping[str, tuple[Sequence[str], Any, Any, Any]],
    qrels: Mapping[str, Mapping[str, int]],
    configs: Sequence[FusionConfig],
    question_of: Mapping[str, str],
    measure: str = "nDCG@10",
    rule: SafetyRule | None = None,
) -> SafeFit:
    """Fit the fusion of ``searches`` (``{search_id: (doc_ids, reranker scores,
    first_stage_scores, first_stage_ranks)}``) by the module's procedure; ``question_of`` maps
    each search to its question (the unit of the folds and the bootstrap)."""
    rule = rule or SafetyRule()
    if not configs:
        raise ValueError("no fusion config to fit")
    missing = [s for s in searches if s not in question_of]
    if missing:
        raise ValueError(f"search_id={missing[0]}: no question to group it by")
    judged, values = search_values(searches, qrels, [PASS_THROUGH, *configs], measure)
    questions = sorted({question_of[s] for s in judged})
    column = {q: i for i, q in enumerate(questions)}
    index = np.array([column[question_of[s]] for s in judged])
    counts = np.bincount(index, minlength=len(questions))
    per_question = np.stack(
        [np.bincount(index, weights=row, minlength=len(questions)) / counts for row in values]
    )
    gains = per_question[1:] - per_question[0]
    weights = [reranker_weight(c) for c in configs]
    chosen = choose(gains, weights)
    tail = (1 - rule.confidence) * 100
    grid = []
    for c, config in enumerate(configs):
        draws = _bootstrap_means(gains[c], rule.resamples, rule.seed)
        grid.append(
            {
                "fusion": config.label,
                measure: float(values[c + 1].mean()),
                "gain": float(gains[c].mean()),
                "gain_low": float(np.percentile(draws, tail / 2)),
                "gain_high": float(np.percentile(draws, 100 - tail / 2)),
            }
        )
    common = {"first_stage": float(values[0].mean()), "questions": len(questions)}
    common["searches"] = len(judged)
    if len(questions) < 2 * rule.folds:
        reason = (
            f"{len(questions)} judged question(s) cannot support {rule.folds}-fold "
            f"cross-validation (at least {2 * rule.folds} needed): the first-stage order is stored"
        )
        cv = {"mean": None, "low": None, "high": None, "folds": rule.folds}
        return SafeFit("pass-through", PASS_THROUGH, configs[chosen], cv, grid, reason=reason,
                       **common)  # fmt: skip
    fold_of = question_folds(questions, rule.folds, rule.seed)
    fold = np.array([fold_of[q] for q in questions])
    held_out = np.empty(len(questions))
    picks = []
    for f in range(rule.folds):
        pick = choose(gains[:, fold != f], weights)
        picks.append(configs[pick].label)
        held_out[fold == f] = gains[pick, fold == f]
    draws = _bootstrap_means(held_out, rule.resamples, rule.seed)
    low, high = float(np.percentile(draws, tail)), float(np.percentile(draws, 100 - tail))
    cv = {"mean": float(held_out.mean()), "low": low, "high": high, "folds": rule.folds}
    cv["fold_choices"] = picks
    bound = f"{rule.confidence:.0%} lower bound {low:+.4f}"
    if reranker_weight(configs[chosen]) == 0:
        decision, stored = "pass-through", PASS_THROUGH
        reason = (
            f"no setting beats the first stage by more than one standard error of {measure} "
            f"on {len(questions)} questions (best mean gain {max(gains.mean(axis=1)):+.4f}): "
            "the first-stage order is stored"
        )
    elif low >= 0:
        decision, stored = "fused", configs[chosen]
        reason = (
            f"{configs[chosen].label}: cross-validated {measure} gain over the first stage "
            f"{cv['mean']:+.4f} on {len(questions)} questions, {bound} >= 0"
        )
    else:
        decision, stored = "pass-through", PASS_THROUGH
        reason = (
            f"cross-validated {measure} gain over the first stage {cv['mean']:+.4f} on "
            f"{len(questions)} questions, {bound} < 0: fusion is not a sure gain, the "
            "first-stage order is stored"
        )
    return SafeFit(decision, stored, configs[chosen], cv, grid, reason=reason, **common)
