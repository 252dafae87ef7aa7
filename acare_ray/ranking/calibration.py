"""Calibrated relevance: a 0..1 ``relevance_score`` that means a probability for this checkpoint.

The Cohere and TEI APIs promise a 0..1 relevance and teams threshold it. ``sigmoid(score)`` of
an LCE-trained reranker is not a probability: the group softmax does not change when every
score of a group shifts by the same amount, so the log-odds carry an arbitrary offset, and a
threshold that means "60% likely relevant" for one checkpoint means something else for the next.

Platt scaling fixes it per checkpoint and mode: ``p = sigmoid(a * score + b)`` (``a`` the inverse
temperature, ``b`` the bias), fitted by maximum likelihood on labelled validation candidates
(:func:`fit_platt`, Newton's method with Platt's smoothed targets). It is monotone, so it never
changes an order; ``score`` stays the raw log-odds everywhere. :func:`expected_calibration_error`
measures it (equal-width bins), and :func:`held_out_ece` compares sigmoid and calibrated on
question-grouped folds the calibration was not fitted on.

Pure numpy; no Ray, no torch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.special import expit

from acare_ray.eval.splits import folds as question_folds


@dataclass(frozen=True)
class Calibration:
    """``p = sigmoid(a * score + b)``."""

    a: float
    b: float

    def __post_init__(self) -> None:
        for name in ("a", "b"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"calibration {name} must be a number, got {value!r}")
            if not math.isfinite(value):
                raise ValueError(f"calibration {name} must be finite, got {value!r}")
        if self.a <= 0:
            raise ValueError(f"calibration a must be > 0 (order-preserving), got {self.a}")

    def apply(self, scores: Sequence[float] | np.ndarray) -> np.ndarray:
        return expit(self.a * np.asarray(scores, dtype=np.float64) + self.b)

    def as_dict(self) -> dict[str, float]:
        return {"a": self.a, "b": self.b}

    @classmethod
    def from_dict(cls, value: Mapping[str, Any]) -> Calibration:
        return cls(float(value["a"]), float(value["b"]))


def fit_platt(
    scores: Sequence[float] | np.ndarray, labels: Sequence[int] | np.ndarray, max_iter: int = 100
) -> Calibration:
    """Maximum-likelihood ``(a, b)`` for labels in {0, 1}, with Platt's targets
    ``(N+ + 1) / (N+ + 2)`` and ``1 / (N- + 2)`` (no infinite weights on separable data)."""
    x = np.asarray(scores, dtype=np.float64)
    y = np.asarray(labels, dtype=np.float64)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError(f"scores and labels must be 1-D of one length, got {x.shape}, {y.shape}")
    positives, negatives = int((y > 0).sum()), int((y <= 0).sum())
    if positives == 0 or negatives == 0:
        raise ValueError(
            f"calibration needs relevant and non-relevant candidates, got {positives} and "
            f"{negatives}"
        )
    t = np.where(y > 0, (positives + 1) / (positives + 2), 1 / (negatives + 2))
    a, b = 1.0, 0.0
    for _ in range(max_iter):
        p = expit(a * x + b)
        w = np.maximum(p * (1 - p), 1e-12)
        grad = np.array([np.sum((p - t) * x), np.sum(p - t)])
        hess = np.array([[np.sum(w * x * x), np.sum(w * x)], [np.sum(w * x), np.sum(w)]])
        hess += 1e-9 * np.eye(2)
        step = np.linalg.solve(hess, grad)
        a, b = a - step[0], b - step[1]
        if np.abs(step).max() < 1e-10:
            break
    if not a > 0:  # scores that anti-correlate with the labels: no order-preserving fit
        raise ValueError(f"the scores do not rank relevant candidates higher (fitted a = {a:.3g})")
    return Calibration(float(a), float(b))


def expected_calibration_error(
    probabilities: Sequence[float] | np.ndarray, labels: Sequence[int] | np.ndarray, bins: int = 10
) -> float:
    """Sum over equal-width probability bins of (bin share) x |mean label - mean probability|."""
    p = np.asarray(probabilities, dtype=np.float64)
    y = (np.asarray(labels) > 0).astype(np.float64)
    if p.size == 0:
        raise ValueError("no candidates to measure calibration on")
    index = np.minimum((p * bins).astype(int), bins - 1)
    total = 0.0
    for k in range(bins):
        inside = index == k
        if inside.any():
            total += inside.mean() * abs(y[inside].mean() - p[inside].mean())
    return float(total)


def held_out_ece(
    scores: np.ndarray, labels: np.ndarray, questions: Sequence[str], folds: int = 5, seed: int = 0
) -> dict[str, Any]:
    """Expected calibration error of ``sigmoid(score)`` and of Platt scaling fitted on the other
    question-grouped folds, both on each held-out fold (pooled)."""
    fold_of = question_folds(questions, folds, seed)
    fold = np.array([fold_of[q] for q in questions])
    calibrated = np.empty(len(scores))
    for f in range(folds):
        train, held = fold != f, fold == f
        calibrated[held] = fit_platt(scores[train], labels[train]).apply(scores[held])
    return {
        "ece_sigmoid": expected_calibration_error(expit(scores), labels),
        "ece_calibrated": expected_calibration_error(calibrated, labels),
        "candidates": int(len(scores)),
        "positives": int((labels > 0).sum()),
        "folds": folds,
    }
