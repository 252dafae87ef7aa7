"""IR metrics with trec_eval semantics, TREC file writers, and paired significance tests.

Ranking follows trec_eval (``form_res_rels.c``) exactly: scores are stored as float32, sorted by
decreasing score, ties broken by decreasing docno (byte order, i.e. ``strcmp`` reversed). So two
scores that differ only beyond float32 precision are a tie, and the larger doc id ranks first.

Measures (``k`` is the cutoff; relevance levels < 0 count as unjudged, ``>= 1`` as relevant):

- ``nDCG@k`` (trec_eval ``ndcg_cut``): gain = relevance level, discount ``1/log2(rank+1)``,
  ideal DCG from all judged docs of the query (retrieved or not), 0 when nothing is relevant.
- ``Recall@k`` (``recall``): relevant in top k / all relevant; 0 when nothing is relevant.
- ``RR@k``: 1/rank of the first relevant doc within the top k, else 0 (trec_eval ``recip_rank``
  with a cutoff; ``MRR@k`` is its mean).

A query is evaluated when it has at least one judgment in ``qrels`` and a key in ``run`` (an
empty ranking counts and scores 0), as trec_eval and pytrec_eval do; means are over those queries.
``missing_as_zero=True`` also scores judged queries absent from the run as 0 (``trec_eval -c``,
which is what ``ir_measures`` does).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

Qrels = Mapping[str, Mapping[str, int]]
Run = Mapping[str, Mapping[str, float]]
DEFAULT_MEASURES = ("nDCG@10", "Recall@10", "Recall@20", "RR@10")
_NAMES = {"ndcg": "nDCG", "recall": "Recall", "r": "Recall", "rr": "RR", "mrr": "RR"}
_MEASURE = re.compile(r"^(ndcg|recall|r|rr|mrr)@([1-9][0-9]*)$", re.IGNORECASE)


def parse_measure(name: str) -> tuple[str, int]:
    """``"ndcg@10"`` -> ``("nDCG", 10)``; accepts nDCG, Recall/R, RR/MRR, any case."""
    match = _MEASURE.match(name.strip())
    if match is None:
        raise ValueError(f"unknown measure {name!r}: expected nDCG@k, Recall@k, R@k, RR@k or MRR@k")
    return _NAMES[match.group(1).lower()], int(match.group(2))


def rank_docs(scores: Mapping[str, float], qid: str = "?") -> list[str]:
    """Doc ids in trec_eval order: float32 score descending, then doc id descending."""
    keyed = []
    for doc_id, score in scores.items():
        value = np.float32(score)
        if math.isnan(value):
            raise ValueError(f"run[{qid!r}][{doc_id!r}]: score is NaN")
        keyed.append((value, doc_id))
    keyed.sort(reverse=True)
    return [doc_id for _, doc_id in keyed]


def _query_measures(
    qid: str, judged: Mapping[str, int], ranking: Sequence[str], wanted: Iterable[tuple[str, int]]
) -> dict[tuple[str, int], float]:
    for doc_id, rel in judged.items():
        if isinstance(rel, bool) or not isinstance(rel, int | np.integer):
            raise ValueError(f"qrels[{qid!r}][{doc_id!r}]: relevance {rel!r} is not an int")
    gains = [judged.get(doc_id, 0) for doc_id in ranking]
    levels = sorted((rel for rel in judged.values() if rel > 0), reverse=True)
    out = {}
    for kind, k in wanted:
        top = gains[:k]
        if kind == "nDCG":
            ideal = sum(rel / math.log2(i + 2) for i, rel in enumerate(levels[:k]))
            dcg = sum(rel / math.log2(i + 2) for i, rel in enumerate(top) if rel > 0)
            out[kind, k] = dcg / ideal if ideal > 0 else 0.0
        elif kind == "Recall":
            out[kind, k] = sum(rel > 0 for rel in top) / len(levels) if levels else 0.0
        else:
            first = next((i for i, rel in enumerate(top) if rel > 0), None)
            out[kind, k] = 0.0 if first is None else 1.0 / (first + 1)
    return out


@dataclass(frozen=True)
class Evaluation:
    """``per_query[measure][qid]`` and ``mean[measure]`` over the ``query_ids`` evaluated."""

    per_query: dict[str, dict[str, float]]
    mean: dict[str, float]
    query_ids: tuple[str, ...]


def evaluate(
    qrels: Qrels,
    run: Run,
    measures: Sequence[str] = DEFAULT_MEASURES,
    missing_as_zero: bool = False,
) -> Evaluation:
    """Evaluate ``run`` against ``qrels`` (``{qid: {docid: relevance}}``, ``{qid: {docid: score}}``).

    Measure names are canonicalised (``"mrr@10"`` is reported as ``"RR@10"``). Raises
    ``ValueError`` if no query is both judged and in the run (even with ``missing_as_zero``: that
    is almost always mismatched ids), on a NaN score, or on a non-integer relevance.
    """
    parsed = {f"{kind}@{k}": (kind, k) for kind, k in map(parse_measure, measures)}
    query_ids = tuple(sorted(q for q in run if qrels.get(q)))
    if not query_ids:
        raise ValueError(
            f"no query is in both run ({len(run)} queries) and qrels ({len(qrels)} queries)"
        )
    if missing_as_zero:
        query_ids = tuple(sorted(q for q in qrels if qrels[q]))
    per_query: dict[str, dict[str, float]] = {name: {} for name in parsed}
    for qid in query_ids:
        ranking = rank_docs(run.get(qid, {}), qid)
        values = _query_measures(qid, qrels[qid], ranking, parsed.values())
        for name, key in parsed.items():
            per_query[name][qid] = values[key]
    mean = {name: float(np.mean(list(vals.values()))) for name, vals in per_query.items()}
    return Evaluation(per_query=per_query, mean=mean, query_ids=query_ids)


def _check_id(value: str, what: str) -> None:
    if not isinstance(value, str) or not value or any(ch.isspace() for ch in value):
        raise ValueError(f"{what} {value!r} must be a non-empty string without whitespace")


def write_trec_run(run: Run, path: str | Path, tag: str = "acare") -> int:
    """Write ``qid Q0 docid rank score tag`` lines in trec_eval order; returns lines written."""
    _check_id(tag, "run tag")
    lines = []
    for qid in sorted(run):
        _check_id(qid, "query id")
        for rank, doc_id in enumerate(rank_docs(run[qid], qid), start=1):
            _check_id(doc_id, f"run[{qid!r}] doc id")
            lines.append(f"{qid} Q0 {doc_id} {rank} {float(run[qid][doc_id])!r} {tag}\n")
    Path(path).write_text("".join(lines), encoding="utf-8")
    return len(lines)


def write_trec_qrels(qrels: Qrels, path: str | Path) -> int:
    """Write ``qid 0 docid relevance`` lines; returns lines written."""
    lines = []
    for qid in sorted(qrels):
        _check_id(qid, "query id")
        for doc_id in sorted(qrels[qid]):
            _check_id(doc_id, f"qrels[{qid!r}] doc id")
            rel = qrels[qid][doc_id]
            if isinstance(rel, bool) or not isinstance(rel, int | np.integer):
                raise ValueError(f"qrels[{qid!r}][{doc_id!r}]: relevance {rel!r} is not an int")
            lines.append(f"{qid} 0 {doc_id} {int(rel)}\n")
    Path(path).write_text("".join(lines), encoding="utf-8")
    return len(lines)


# --- significance across queries ----------------------------------------------------------

Scores = Mapping[str, float] | Sequence[float] | np.ndarray


@dataclass(frozen=True)
class PairedTest:
    """Two systems on the same queries. ``ci`` is the bootstrap CI of ``mean_diff`` (b - a)."""

    method: str
    mean_a: float
    mean_b: float
    mean_diff: float
    p_value: float
    n_queries: int
    n_resamples: int
    ci: tuple[float, float] | None = None


def _paired(a: Scores, b: Scores) -> tuple[np.ndarray, np.ndarray]:
    if isinstance(a, Mapping) != isinstance(b, Mapping):
        raise TypeError("a and b must both be {qid: value} mappings or both be sequences")
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        if a.keys() != b.keys():
            only_a, only_b = sorted(a.keys() - b.keys()), sorted(b.keys() - a.keys())
            raise ValueError(f"query sets differ: only in a {only_a[:5]}, only in b {only_b[:5]}")
        keys = sorted(a)
        a, b = [a[k] for k in keys], [b[k] for k in keys]
    xa, xb = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if xa.ndim != 1 or xa.shape != xb.shape or xa.size < 2:
        raise ValueError(f"need two 1-D arrays of equal length >= 2, got {xa.shape} and {xb.shape}")
    if not (np.isfinite(xa).all() and np.isfinite(xb).all()):
        raise ValueError("per-query values must be finite")
    return xa, xb


def _resampled_means(values: np.ndarray, n_resamples: int, seed: int, draw: str) -> np.ndarray:
    if n_resamples < 1:
        raise ValueError(f"n_resamples must be >= 1, got {n_resamples}")
    rng, n = np.random.default_rng(seed), values.size
    out = np.empty(n_resamples)
    for start in range(0, n_resamples, 1000):  # chunks keep memory at 1000 x n
        size = min(1000, n_resamples - start)
        if draw == "signs":
            out[start : start + size] = (rng.choice([-1.0, 1.0], size=(size, n)) * values).mean(1)
        else:
            out[start : start + size] = values[rng.integers(0, n, size=(size, n))].mean(1)
    return out


def _percentile_ci(means: np.ndarray, confidence: float) -> tuple[float, float]:
    tail = (1 - confidence) / 2 * 100
    low, high = np.percentile(means, [tail, 100 - tail])
    return float(low), float(high)


def _check_confidence(confidence: float) -> None:
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")


def _paired_test(
    method: str, a: Scores, b: Scores, n_resamples: int, seed: int, confidence: float
) -> PairedTest:
    _check_confidence(confidence)
    xa, xb = _paired(a, b)
    diff = xb - xa
    observed = float(diff.mean())
    ci = None
    # The 1e-12 slack keeps float noise from breaking exact ties with the observed difference.
    if method == "randomization":
        means = _resampled_means(diff, n_resamples, seed, "signs")
        extreme = np.abs(means) >= abs(observed) - 1e-12
    else:
        means = _resampled_means(diff, n_resamples, seed, "rows")
        extreme = np.abs(means - observed) >= abs(observed) - 1e-12
        ci = _percentile_ci(means, confidence)
    p = (1 + int(extreme.sum())) / (1 + n_resamples)
    mean_a, mean_b = float(xa.mean()), float(xb.mean())
    return PairedTest(method, mean_a, mean_b, observed, p, diff.size, n_resamples, ci)


def paired_randomization_test(
    a: Scores, b: Scores, n_resamples: int = 10_000, seed: int = 0
) -> PairedTest:
    """Two-sided paired randomization test: flip the sign of each per-query difference at random.

    p = (1 + #{|permuted mean| >= |observed mean|}) / (1 + n_resamples); identical systems give 1.
    ``a`` and ``b`` are per-query values, as equal-length arrays or ``{qid: value}`` mappings.
    """
    return _paired_test("randomization", a, b, n_resamples, seed, 0.95)


def paired_bootstrap_test(
    a: Scores, b: Scores, n_resamples: int = 10_000, seed: int = 0, confidence: float = 0.95
) -> PairedTest:
    """Paired bootstrap over queries: percentile CI of the mean difference (b - a), and a two-sided
    p-value from the bootstrap distribution shifted to the null (mean difference 0)."""
    return _paired_test("bootstrap", a, b, n_resamples, seed, confidence)


def bootstrap_ci(
    values: Sequence[float] | np.ndarray,
    n_resamples: int = 10_000,
    seed: int = 0,
    confidence: float = 0.95,
) -> tuple[float, float, float]:
    """``(mean, low, high)``: percentile bootstrap CI of the mean of per-query values."""
    x = np.asarray(values, dtype=np.float64)
    if x.ndim != 1 or x.size == 0 or not np.isfinite(x).all():
        raise ValueError(f"values must be a non-empty 1-D array of finite numbers, got {x.shape}")
    _check_confidence(confidence)
    means = _resampled_means(x, n_resamples, seed, "rows")
    return (float(x.mean()), *_percentile_ci(means, confidence))


def holm_bonferroni(p_values: Sequence[float]) -> list[float]:
    """Holm-Bonferroni adjusted p-values, in input order (reject where adjusted <= alpha)."""
    p = np.asarray(p_values, dtype=np.float64)
    if p.ndim != 1 or ((p < 0) | (p > 1) | np.isnan(p)).any():
        raise ValueError(f"p_values must be a 1-D list of numbers in [0, 1], got {p_values!r}")
    order = np.argsort(p, kind="stable")
    scaled = (p.size - np.arange(p.size)) * p[order]
    adjusted = np.empty_like(p)
    adjusted[order] = np.minimum(1.0, np.maximum.accumulate(scaled))
    return adjusted.tolist()
