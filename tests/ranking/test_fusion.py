"""Fusion (acare_ray/ranking/fusion.py) against hand computations, ranx, and its input checks."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from acare_ray.ranking.fusion import (
    FusionConfig,
    first_stage_ranks,
    fit,
    fuse,
    grid,
    order,
    ranked_run,
)

SCORES = [2.0, 0.5, 1.0, 0.5]
FIRST = [1.0, 3.0, None, 2.0]  # first-stage ranks by the rule: [3, 1, 4, 2]


def test_first_stage_rank_is_rank_then_score_then_position_missing_last():
    assert first_stage_ranks(4, FIRST).tolist() == [3, 1, 4, 2]
    assert first_stage_ranks(3).tolist() == [1, 2, 3]
    assert first_stage_ranks(3, [1.0, 1.0, 1.0]).tolist() == [1, 2, 3]
    # given ranks win over scores; a candidate without a rank follows the ranked ones
    assert first_stage_ranks(4, FIRST, [2, 1, None, 3]).tolist() == [2, 1, 4, 3]


def test_rrf_equals_the_hand_computation_and_ties_go_to_the_first_stage():
    fused = fuse(SCORES, FusionConfig("rrf", k=60, weight=0.5), FIRST)
    # reranker ranks: 0 -> 1, 2 -> 2, 1 and 3 tie at 0.5 -> first stage decides: 1 -> 3, 3 -> 4
    expected = [
        0.5 / 61 + 0.5 / 63,
        0.5 / 63 + 0.5 / 61,
        0.5 / 62 + 0.5 / 64,
        0.5 / 64 + 0.5 / 62,
    ]
    assert fused.values.tolist() == pytest.approx(expected, abs=0, rel=1e-15)
    # 0 and 1 tie exactly, as do 2 and 3: the better first-stage rank goes first
    assert fused.order.tolist() == [1, 0, 3, 2]
    weighted = fuse(SCORES, FusionConfig("rrf", k=10, weight=0.8), FIRST)
    assert weighted.values[2] == pytest.approx(0.8 / 12 + 0.2 / 14)


def test_linear_equals_the_hand_computation_with_a_missing_first_stage_score():
    # mm(scores) = [1, 0, 1/3, 0]; mm(first stage over the scored ones) = [0, 1, -, 0.5], missing 0
    fused = fuse(SCORES, FusionConfig("linear", alpha=0.5), FIRST)
    assert fused.values.tolist() == pytest.approx([0.5, 0.5, 1 / 6, 0.25])
    assert fused.order.tolist() == [1, 0, 3, 2]
    fused = fuse(SCORES, FusionConfig("linear", alpha=0.8), FIRST)
    assert fused.values.tolist() == pytest.approx([0.8, 0.2, 0.8 / 3, 0.1])
    assert fused.order.tolist() == [0, 2, 1, 3]


def test_ranks_only_fusion_when_the_first_stage_gives_no_scores():
    rrf = fuse(SCORES, FusionConfig("rrf", weight=0.5))  # the first stage is the list order
    assert rrf.values.tolist() == pytest.approx(
        [1 / 61, 0.5 / 63 + 0.5 / 62, 0.5 / 62 + 0.5 / 63, 1 / 64]
    )
    assert rrf.order.tolist() == [0, 1, 2, 3]
    linear = fuse(SCORES, FusionConfig("linear", alpha=0.5), first_stage_ranks_=[4, 3, 2, 1])
    # -rank normalised: [0, 1/3, 2/3, 1]
    assert linear.values.tolist() == pytest.approx([0.5, 1 / 6, 0.5, 0.5])
    assert linear.order.tolist() == [3, 2, 0, 1]


def test_none_keeps_the_scores_and_breaks_ties_by_first_stage_rank():
    fused = fuse(SCORES, FusionConfig(), FIRST)
    assert fused.values.tolist() == SCORES
    assert fused.order.tolist() == [0, 2, 1, 3]
    assert order([1.0, 1.0, 1.0], np.array([3, 1, 2])).tolist() == [1, 2, 0]


def test_weight_one_is_the_reranker_and_zero_the_first_stage():
    for config in (FusionConfig("rrf", weight=1.0), FusionConfig("linear", alpha=1.0)):
        assert fuse(SCORES, config, FIRST).order.tolist() == [0, 2, 1, 3]
    for config in (FusionConfig("rrf", weight=0.0), FusionConfig("linear", alpha=0.0)):
        assert fuse(SCORES, config, FIRST).order.tolist() == [1, 3, 0, 2]


def test_bad_first_stage_input_names_the_field_and_index():
    with pytest.raises(ValueError, match=r"first_stage_scores\[1\] must be finite"):
        fuse(SCORES, FusionConfig("rrf"), [1.0, float("nan"), 2.0, 3.0])
    with pytest.raises(ValueError, match=r"first_stage_scores\[0\] must be finite"):
        fuse(SCORES, FusionConfig("linear"), [float("inf"), 1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="first_stage_scores has 2 entries, expected 4"):
        fuse(SCORES, FusionConfig("rrf"), [1.0, 2.0])
    with pytest.raises(ValueError, match=r"first_stage_ranks\[2\] must be an integer >= 1"):
        fuse(SCORES, FusionConfig("rrf"), first_stage_ranks_=[1, 2, 0, 3])
    with pytest.raises(ValueError, match=r"candidates\[1\] is NaN"):
        fuse([1.0, float("nan")], FusionConfig("rrf"))


def test_config_text_form_round_trips_and_bad_settings_are_refused():
    for text in ("none", "rrf:k=60,weight=0.3", "linear:alpha=0.7"):
        assert FusionConfig.parse(text).label == text
    assert FusionConfig.parse("rrf") == FusionConfig("rrf", k=60, weight=0.5)
    config = FusionConfig("linear", alpha=0.25)
    assert FusionConfig.from_dict(config.as_dict()) == config
    for bad in ("bm25", "rrf:k=0", "rrf:weight=1.5", "linear:alpha=x", "rrf:beta=1"):
        with pytest.raises(ValueError, match="fusion"):
            FusionConfig.parse(bad)


def test_ranked_run_keeps_the_order_under_trec_eval_sorting():
    from acare_ray.eval.ir_metrics import rank_docs

    # doc ids that trec_eval would order the other way on a score tie
    doc_ids = ["a", "b", "c"]
    run = ranked_run(doc_ids, [0, 1, 2])
    assert rank_docs(run) == ["a", "b", "c"]


def test_fit_picks_the_grid_point_with_the_best_ndcg():
    # the first stage is right on both searches, the reranker on neither: weight 0 wins
    searches = {
        "q1": (["a", "b", "c"], np.array([0.0, 1.0, 2.0]), [3.0, 2.0, 1.0], None),
        "q2": (["d", "e"], np.array([5.0, 9.0]), [2.0, 1.0], None),
    }
    qrels = {"q1": {"a": 1, "b": 0, "c": 0}, "q2": {"d": 1, "e": 0}}
    best, table = fit(searches, qrels, grid(["rrf"]))
    assert best == FusionConfig("rrf", weight=0.0)
    assert len(table) == 11 and table[0]["nDCG@10"] == pytest.approx(1.0)
    assert table[-1]["nDCG@10"] < 1.0
    with pytest.raises(ValueError, match="no search has a relevant candidate"):
        fit(searches, {"q1": {"a": 0}}, grid(["rrf"]))


# ranx's fusion in a fresh interpreter with numba's JIT off: the same Python code, run as
# written instead of compiled first (compiling it took ~25 s of this test on 2 cores).
RANX_FUSE = """
import json, sys, warnings
import ranx
scores, first = json.load(sys.stdin)
doc_ids = [f"d{i}" for i in range(len(scores))]
reranker = ranx.Run({"q": dict(zip(doc_ids, scores))})
stage = ranx.Run({"q": dict(zip(doc_ids, first))})
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    rrf = ranx.fuse([reranker, stage], method="rrf", params={"k": 60}).to_dict()["q"]
    wsum = ranx.fuse(
        [reranker, stage], norm="min-max", method="wsum", params={"weights": [0.3, 0.7]}
    ).to_dict()["q"]
print(json.dumps({"rrf": [rrf[d] for d in doc_ids], "wsum": [wsum[d] for d in doc_ids]}))
"""


def test_rrf_and_linear_agree_with_ranx():
    """Cross-check against an independent implementation (ranx's rrf and min-max wsum)."""
    pytest.importorskip("ranx")
    rng = np.random.default_rng(3)
    scores = rng.normal(size=12)
    first = rng.normal(size=12) * 5 + 10
    done = subprocess.run(
        [sys.executable, "-c", RANX_FUSE],
        input=json.dumps([scores.tolist(), first.tolist()]),
        env=os.environ | {"NUMBA_DISABLE_JIT": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    ranx_values = json.loads(done.stdout)
    ours = fuse(scores, FusionConfig("rrf", k=60, weight=0.5), first.tolist())
    assert ours.values.tolist() == pytest.approx([0.5 * v for v in ranx_values["rrf"]])
    ours = fuse(scores, FusionConfig("linear", alpha=0.3), first.tolist())
    assert ours.values.tolist() == pytest.approx(ranx_values["wsum"])
