"""The safe fusion fit (issue 32): a reranker worse than the first stage stores pass-through, a
better one stores its setting, a flat grid lands near the first stage, folds never share a
question, and the one question split is the one the published splits were drawn with."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from acare_ray.eval.splits import folds, question_keys, split_table, split_values
from acare_ray.ranking.fusion import FusionConfig, fuse, grid
from acare_ray.ranking.fusion_fit import (
    PASS_THROUGH,
    SafetyRule,
    choose,
    fit_safely,
    reranker_weight,
)


def _searches(quality: float, n_questions: int = 40, per_question: int = 2, seed: int = 0):
    """Searches of 10 candidates, one relevant, at a random first-stage rank. The reranker's
    score of the relevant document is ``quality`` + noise above the others' (below them when
    ``quality`` < 0)."""
    rng = np.random.default_rng(seed)
    searches, qrels, question_of = {}, {}, {}
    for q in range(n_questions):
        for s in range(per_question):
            sid = f"q{q}-s{s}"
            docs = [f"{sid}-d{i}" for i in range(10)]
            relevant = int(rng.integers(0, 10))
            scores = rng.normal(0, 1, 10)
            scores[relevant] += quality
            searches[sid] = (docs, scores, None, list(range(1, 11)))
            qrels[sid] = {d: int(i == relevant) for i, d in enumerate(docs)}
            question_of[sid] = f"q{q}"
    return searches, qrels, question_of


def test_a_reranker_worse_than_the_first_stage_stores_pass_through():
    searches, qrels, question_of = _searches(quality=-3.0)
    fit = fit_safely(searches, qrels, grid(), question_of)
    assert fit.decision == "pass-through" and fit.stored == PASS_THROUGH
    assert "first-stage order is stored" in fit.reason
    assert all(row["gain"] <= 1e-12 for row in fit.grid)
    # pass-through is exactly the order the agent arrived with, on every search
    for _docs, scores, fs_scores, fs_ranks in searches.values():
        assert fuse(scores, fit.stored, fs_scores, fs_ranks).order.tolist() == list(range(10))


def test_a_better_reranker_stores_its_setting_with_a_positive_lower_bound():
    searches, qrels, question_of = _searches(quality=3.0)
    fit = fit_safely(searches, qrels, grid(), question_of)
    assert fit.decision == "fused" and fit.stored == fit.chosen
    assert reranker_weight(fit.stored) > 0
    assert fit.cv["low"] >= 0 and fit.cv["mean"] > 0.1
    assert fit.fitted()["decision"] == "fused" and fit.fitted()["chosen"] == fit.stored.label
    assert len(fit.cv["fold_choices"]) == SafetyRule().folds


def test_a_flat_grid_lands_on_the_smallest_reranker_weight_within_noise():
    # three settings, gains over 30 questions: the best by mean is the noisy full reranker,
    # the middle one is within one standard error of it, the first stage is far below
    rng = np.random.default_rng(1)
    noise = rng.normal(0, 0.2, 30)
    gains = np.stack([np.zeros(30), 0.10 + noise * 0.5, 0.11 + noise])
    assert choose(gains, [0.0, 0.4, 1.0]) == 1
    # a clear winner is kept even at the largest weight
    clear = np.stack([np.zeros(30), 0.01 + rng.normal(0, 0.01, 30), 0.5 + rng.normal(0, 0.01, 30)])
    assert choose(clear, [0.0, 0.4, 1.0]) == 2


def test_too_few_questions_store_pass_through_and_say_why():
    searches, qrels, question_of = _searches(quality=3.0, n_questions=6)
    fit = fit_safely(searches, qrels, grid(), question_of)
    assert fit.decision == "pass-through" and fit.stored == PASS_THROUGH
    assert "6 judged question(s) cannot support 5-fold" in fit.reason


def test_a_search_without_a_question_is_named():
    searches, qrels, question_of = _searches(quality=3.0, n_questions=12)
    del question_of["q3-s1"]
    with pytest.raises(ValueError, match="search_id=q3-s1"):
        fit_safely(searches, qrels, grid(), question_of)


def test_folds_never_share_a_question_and_are_balanced():
    keys = [f"q{i}" for i in range(23)]
    assignment = folds(keys * 3, 5, seed=4)  # repeated keys: one question, one fold
    assert set(assignment) == set(keys)
    sizes = np.bincount(list(assignment.values()))
    assert sizes.max() - sizes.min() <= 1 and len(sizes) == 5
    assert folds(keys, 5, seed=4) == assignment
    assert folds(keys, 5, seed=5) != assignment
    with pytest.raises(ValueError, match="folds must be an integer in 2..23"):
        folds(keys, 24)


def _table(n_questions: int, sessions_per_question: int) -> pa.Table:
    rows = [
        {"search_id": f"q{q}-a{a}-s{s}", "session_id": f"q{q}-a{a}", "question_id": f"q{q}"}
        for q in range(n_questions)
        for a in range(sessions_per_question)
        for s in range(2)
    ]
    return pa.Table.from_pylist(rows)


def test_the_split_keeps_every_question_on_one_side():
    table = _table(60, 3)
    parts = split_table(table, test=10, validation=0.2, seed=3)
    seen = {name: set(part.column("question_id").to_pylist()) for name, part in parts.items()}
    assert len(seen["test"]) == 10 and len(seen["validation"]) == 10  # 20% of the other 50
    assert not (seen["test"] & seen["validation"] or seen["test"] & seen["train"])
    assert not seen["validation"] & seen["train"]
    assert sum(p.num_rows for p in parts.values()) == table.num_rows


def test_the_split_is_the_one_the_published_splits_were_drawn_with():
    """The trace test split (50 questions, seed 0) and the recipe's validation questions are
    the same draws as before the split moved into the package: test = the first 50 of a
    seed-0 permutation of the sorted questions, validation = the first 10% of a (0, 11)
    permutation of the rest."""
    table = _table(200, 2)
    values = sorted(set(table.column("question_id").to_pylist()))
    test = set(np.random.default_rng(0).permutation(values)[:50].tolist())
    rest = sorted(set(values) - test)
    held = set(np.random.default_rng([0, 11]).permutation(rest)[:15].tolist())
    parts = split_table(table, test=50, validation=0.1, seed=0)
    assert set(parts["test"].column("question_id").to_pylist()) == test
    assert set(parts["validation"].column("question_id").to_pylist()) == held


def test_question_keys_fall_back_to_the_question_text_then_the_session():
    table = pa.Table.from_pylist(
        [
            {"search_id": "a", "session_id": "s1", "question": "Who?"},
            {"search_id": "b", "session_id": "s2", "question": "Who?"},
            {"search_id": "c", "session_id": "s3", "question": None},
        ]
    )
    assert question_keys(table) == ["Who?", "Who?", "s3"]
    assert split_values(["x", "y", "z"], test=1, seed=0) == split_values(["z", "y", "x"], 1)


def test_fusion_config_of_pass_through_is_the_first_stage():
    assert FusionConfig("rrf", weight=0.0) == PASS_THROUGH
    assert reranker_weight(FusionConfig("linear", alpha=0.3)) == 0.3
