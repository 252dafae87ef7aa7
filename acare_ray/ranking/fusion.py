"""Fusion of the reranker's scores with the first stage's, and the one tie rule of every system.

A reranker replaces an order the agent already had (BM25, the agent's own search tool). Fusion
keeps what that first stage got right: per search, the reranker's raw scores (the score
contract: log-odds) are combined with the first stage's scores or ranks into a **fused value**;
the order follows the fused value. ``score`` never changes; the fused value is its own field.

Methods (:class:`FusionConfig`; ``weight`` and ``alpha`` are the reranker's share, so 1 is the
reranker alone and 0 the first stage alone):

- ``none``: the fused value is the raw score.
- ``rrf`` (reciprocal rank fusion): ``weight / (k + r) + (1 - weight) / (k + f)``, ``r`` the
  candidate's 1-based rank by reranker score and ``f`` its first-stage rank. Ranks only, so it
  works when the first stage gives no scores.
- ``linear``: ``alpha * mm(score) + (1 - alpha) * mm(first_stage_score)``, ``mm`` the per-search
  min-max normalisation ``(x - min) / (max - min)`` over the search's candidates that have the
  value (0 for all when they are all equal). A candidate without a first-stage score gets 0,
  the minimum (a document outside the first stage's top k); when no candidate has one,
  ``-first_stage_rank`` takes the place of the scores (ranks-only linear fusion).

**First-stage order** (:func:`first_stage_ranks`): ``first_stage_rank`` ascending where given,
then ``first_stage_score`` descending, then list position; missing ranks and scores go last.
Without ranks or scores it is the list order.

**Tie rule** (:func:`order`), the same for every system (a mode, a fused system, the first
stage): value descending, ties broken by first-stage rank ascending (which itself ends on list
position). So no two candidates ever tie, and the order never depends on doc ids.

Pure numpy; no Ray, no torch.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

METHODS = ("none", "rrf", "linear")
DEFAULT_RRF_K = 60.0
GRID = tuple(round(0.1 * i, 1) for i in range(11))
"""The default fitting grid of ``weight`` (rrf) and ``alpha`` (linear): 0.0, 0.1, ..., 1.0."""


@dataclass(frozen=True)
class FusionConfig:
    """How to fuse: ``method`` ``none`` | ``rrf`` | ``linear``; ``k`` and ``weight`` for rrf,
    ``alpha`` for linear (see the module docstring). Text form (:meth:`parse`, :attr:`label`):
    ``none``, ``rrf:k=60,weight=0.5``, ``linear:alpha=0.5``."""

    method: str = "none"
    k: float = DEFAULT_RRF_K
    weight: float = 0.5
    alpha: float = 0.5

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"fusion method must be one of {METHODS}, got {self.method!r}")
        for name in ("k", "weight", "alpha"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"fusion {name} must be a number, got {value!r}")
            if not math.isfinite(value):
                raise ValueError(f"fusion {name} must be finite, got {value!r}")
            object.__setattr__(self, name, float(value))
        if self.k <= 0:
            raise ValueError(f"fusion k must be > 0, got {self.k}")
        for name in ("weight", "alpha"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"fusion {name} must be in [0, 1], got {getattr(self, name)}")

    @property
    def enabled(self) -> bool:
        return self.method != "none"

    @property
    def label(self) -> str:
        """The text form, also the suffix of a fused system's name (``M3+rrf:k=60,weight=0.5``)."""
        if self.method == "rrf":
            return f"rrf:k={self.k:g},weight={self.weight:g}"
        if self.method == "linear":
            return f"linear:alpha={self.alpha:g}"
        return "none"

    @classmethod
    def parse(cls, text: str) -> FusionConfig:
        """``"rrf"``, ``"rrf:k=60,weight=0.7"``, ``"linear:alpha=0.3"``, ``"none"``."""
        method, _, rest = text.strip().partition(":")
        params: dict[str, float] = {}
        for part in filter(None, (p.strip() for p in rest.split(","))):
            name, eq, value = part.partition("=")
            if not eq or name.strip() not in ("k", "weight", "alpha"):
                raise ValueError(f"fusion {text!r}: expected name=value with k, weight or alpha")
            try:
                params[name.strip()] = float(value)
            except ValueError:
                raise ValueError(f"fusion {text!r}: {name.strip()} is not a number") from None
        return cls(method.strip(), **params)

    def as_dict(self) -> dict[str, Any]:
        return {"method": self.method, "k": self.k, "weight": self.weight, "alpha": self.alpha}

    @classmethod
    def from_dict(cls, value: Mapping[str, Any]) -> FusionConfig:
        return cls(**{k: value[k] for k in ("method", "k", "weight", "alpha") if k in value})


@dataclass(frozen=True)
class Fused:
    """Per candidate (input order): ``values`` (the fused values; the raw scores for ``none``)
    and ``first_stage_rank`` (1-based); ``order``: candidate indices, best first."""

    values: np.ndarray
    order: np.ndarray
    first_stage_rank: np.ndarray


def _optional(values: Sequence[Any] | None, n: int, field: str, integral: bool) -> np.ndarray:
    """``values`` as float64 with NaN for missing (None); NaN or inf given -> ValueError."""
    if values is None:
        return np.full(n, np.nan)
    if len(values) != n:
        raise ValueError(f"{field} has {len(values)} entries, expected {n} (one per candidate)")
    out = np.full(n, np.nan)
    for i, value in enumerate(values):
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float | np.number):
            raise ValueError(f"{field}[{i}] must be a number, got {value!r}")
        value = float(value)
        if not math.isfinite(value):
            raise ValueError(f"{field}[{i}] must be finite, got {value}")
        if integral and (not value.is_integer() or value < 1):
            raise ValueError(f"{field}[{i}] must be an integer >= 1, got {value:g}")
        out[i] = value
    return out


def first_stage_ranks(
    n: int,
    scores: Sequence[float | None] | None = None,
    ranks: Sequence[int | None] | None = None,
) -> np.ndarray:
    """1-based first-stage rank of each of ``n`` candidates (int64, a permutation of 1..n):
    given ``ranks`` ascending, then ``scores`` descending, then list position; missing last.

    Raises ``ValueError`` naming ``first_stage_scores[i]`` / ``first_stage_ranks[i]`` for NaN,
    inf or a wrong length."""
    s = _optional(scores, n, "first_stage_scores", integral=False)
    r = _optional(ranks, n, "first_stage_ranks", integral=True)
    keys = (
        np.arange(n),
        np.where(np.isnan(s), np.inf, -s),
        np.where(np.isnan(r), np.inf, r),
    )
    by_first_stage = np.lexsort(keys)
    out = np.empty(n, dtype=np.int64)
    out[by_first_stage] = np.arange(1, n + 1)
    return out


def order(values: Sequence[float] | np.ndarray, first_stage_rank: np.ndarray) -> np.ndarray:
    """Candidate indices best first: ``values`` descending, ties by ``first_stage_rank``
    ascending (the tie rule of every system). NaN -> ValueError naming the index."""
    values = np.asarray(values, dtype=np.float64).reshape(-1)
    bad = np.flatnonzero(np.isnan(values))
    if bad.size:
        raise ValueError(f"score of candidates[{bad[0]}] is NaN")
    return np.lexsort((np.asarray(first_stage_rank), -values))


def _minmax(values: np.ndarray) -> np.ndarray:
    low, high = values.min(), values.max()
    if high == low:
        return np.zeros_like(values)
    return (values - low) / (high - low)


def fuse(
    scores: Sequence[float] | np.ndarray,
    config: FusionConfig,
    first_stage_scores: Sequence[float | None] | None = None,
    first_stage_ranks_: Sequence[int | None] | None = None,
) -> Fused:
    """Fuse one search's reranker ``scores`` (raw log-odds, candidate order) with its first
    stage (scores and/or ranks aligned with the candidates; None for none / a missing entry).

    Returns the fused values and the order under the tie rule. Without first-stage scores or
    ranks the first stage is the list order. NaN scores, NaN/inf first-stage values and wrong
    lengths raise ``ValueError`` naming the field and index.
    """
    raw = np.asarray(scores, dtype=np.float64).reshape(-1)
    n = raw.size
    bad = np.flatnonzero(np.isnan(raw))
    if bad.size:
        raise ValueError(f"score of candidates[{bad[0]}] is NaN")
    fs_rank = first_stage_ranks(n, first_stage_scores, first_stage_ranks_)
    if n == 0 or config.method == "none":
        values = raw
    elif config.method == "rrf":
        rerank_rank = np.empty(n, dtype=np.float64)
        rerank_rank[order(raw, fs_rank)] = np.arange(1, n + 1)
        values = config.weight / (config.k + rerank_rank) + (1.0 - config.weight) / (
            config.k + fs_rank
        )
    else:
        fs = _optional(first_stage_scores, n, "first_stage_scores", integral=False)
        if np.isnan(fs).all():
            first = _minmax(-fs_rank.astype(np.float64))
        else:
            present = ~np.isnan(fs)
            first = np.zeros(n)
            first[present] = _minmax(fs[present])
        values = config.alpha * _minmax(raw) + (1.0 - config.alpha) * first
    return Fused(values=values, order=order(values, fs_rank), first_stage_rank=fs_rank)


def ranked_run(doc_ids: Sequence[str], ranking: Iterable[int]) -> dict[str, float]:
    """``{doc_id: -rank}`` of an order (candidate indices, best first): a run whose trec_eval
    order is exactly that order (distinct values, so trec_eval's doc-id tie-break never acts)."""
    return {str(doc_ids[i]): -float(rank) for rank, i in enumerate(ranking, start=1)}


def fit(
    searches: Mapping[str, tuple[Sequence[str], np.ndarray, Any, Any]],
    qrels: Mapping[str, Mapping[str, int]],
    configs: Sequence[FusionConfig],
    measure: str = "nDCG@10",
) -> tuple[FusionConfig, list[dict[str, Any]]]:
    """The config of ``configs`` with the best mean ``measure`` over the searches with a
    relevant candidate, and every config's mean (grid order; the first best wins a tie).

    ``searches[search_id] = (doc_ids, reranker scores, first_stage_scores, first_stage_ranks)``.
    """
    from acare_ray.eval.ir_metrics import evaluate

    judged = {q: qrels[q] for q in searches if any(r > 0 for r in qrels.get(q, {}).values())}
    if not judged:
        raise ValueError("no search has a relevant candidate: nothing to fit the fusion on")
    if not configs:
        raise ValueError("no fusion config to fit")
    table = []
    for config in configs:
        run = {}
        for q in judged:
            doc_ids, scores, fs_scores, fs_ranks = searches[q]
            run[q] = ranked_run(doc_ids, fuse(scores, config, fs_scores, fs_ranks).order)
        mean = evaluate(judged, run, [measure]).mean
        table.append({"fusion": config.label, measure: next(iter(mean.values()))})
    best = max(range(len(configs)), key=lambda i: (table[i][measure], -i))
    return configs[best], table


def grid(
    methods: Sequence[str] = ("rrf", "linear"), k: float = DEFAULT_RRF_K
) -> list[FusionConfig]:
    """The default fitting grid: ``weight`` (rrf, at ``k``) or ``alpha`` (linear) over
    :data:`GRID`."""
    out = []
    for method in methods:
        if method == "rrf":
            out += [FusionConfig("rrf", k=k, weight=w) for w in GRID]
        elif method == "linear":
            out += [FusionConfig("linear", alpha=a) for a in GRID]
        else:
            raise ValueError(f"fusion method to fit must be rrf or linear, got {method!r}")
    return out


def resolve_fusion(setting: str | FusionConfig | None, fitted: FusionConfig | None) -> FusionConfig:
    """The fusion a surface uses: ``setting`` when given (text form or config), else (None or
    ``"auto"``) the checkpoint's ``fitted`` setting, else ``none``."""
    if isinstance(setting, FusionConfig):
        return setting
    if setting is None or setting.strip() == "auto":
        return fitted or FusionConfig()
    return FusionConfig.parse(setting)
