"""Calibrated relevance (issue 35): Platt scaling recovers a known calibration, at least halves
the expected calibration error of sigmoid on offset log-odds, never changes an order, and a
calibrated checkpoint's relevance_score on every API is the stored calibration applied to
the score (said in meta.relevance and x-acare-relevance)."""

from __future__ import annotations

import numpy as np
import pytest
from fastapi.testclient import TestClient
from scipy.special import expit

from acare_ray.online.http import single_model_api
from acare_ray.online.service import RerankService
from acare_ray.online.serving import inline_score
from acare_ray.ranking.calibration import (
    Calibration,
    expected_calibration_error,
    fit_platt,
    held_out_ece,
)
from acare_ray.ranking.checkpoint_settings import read_calibration, write_calibration


def _draw(a: float, b: float, n: int = 4000, seed: int = 0):
    rng = np.random.default_rng(seed)
    scores = rng.normal(0, 2, n)
    labels = (rng.random(n) < expit(a * scores + b)).astype(int)
    questions = [f"q{i // 8}" for i in range(n)]
    return scores, labels, questions


def test_platt_scaling_recovers_a_known_calibration():
    scores, labels, _ = _draw(0.7, -2.5)
    fitted = fit_platt(scores, labels)
    assert fitted.a == pytest.approx(0.7, abs=0.08) and fitted.b == pytest.approx(-2.5, abs=0.2)


def test_calibration_halves_the_held_out_error_of_sigmoid_on_offset_log_odds():
    """The LCE situation: log-odds with an arbitrary offset (here +2.5 too high)."""
    scores, labels, questions = _draw(1.0, -2.5)
    report = held_out_ece(scores, labels, questions, folds=5)
    assert report["ece_calibrated"] <= 0.5 * report["ece_sigmoid"]
    assert report["ece_sigmoid"] > 0.1 and report["candidates"] == len(scores)


def test_calibration_keeps_the_order_and_refuses_what_it_cannot_fit():
    scores = np.array([3.0, -1.0, 0.5, 2.0])
    assert np.argsort(-Calibration(0.4, -1.2).apply(scores)).tolist() == [0, 3, 2, 1]
    with pytest.raises(ValueError, match="relevant and non-relevant"):
        fit_platt(scores, [1, 1, 1, 1])
    with pytest.raises(ValueError, match="order-preserving"):
        Calibration(-1.0, 0.0)
    assert expected_calibration_error([0.9, 0.1], [1, 0]) == pytest.approx(0.1)


def test_a_calibrated_checkpoints_relevance_is_the_stored_calibration_of_score(
    tiny_scorer, tiny_qwen3_copy
):
    write_calibration(tiny_qwen3_copy, "M3", Calibration(0.5, -1.0), {"note": "test"})
    calibration = read_calibration(tiny_qwen3_copy)
    assert set(calibration) == {"M3"}
    service = RerankService(tiny_scorer, "tiny", calibration=calibration)

    client = TestClient(single_model_api(service, inline_score(service)))
    docs = ["Paris is in France.", "Bread is baked.", "The Seine flows through Paris."]
    context = {"original_question": "Which river?", "reasoning": "Paris has a river."}
    m3 = client.post("/v1/rerank", json={"query": "river", "documents": docs, **context})
    assert m3.status_code == 200 and m3.headers["x-acare-relevance"] == "calibrated"
    assert m3.json()["meta"]["relevance"] == "calibrated"
    raw = client.post("/v1/rerank", json={"query": "river", "documents": docs, **context,
                                           "use_activation": False}).json()  # fmt: skip
    log_odds = {r["index"]: r["relevance_score"] for r in raw["results"]}
    for r in m3.json()["results"]:
        assert r["relevance_score"] == pytest.approx(expit(0.5 * log_odds[r["index"]] - 1.0))
    tei = client.post("/rerank", json={"query": "river", "texts": docs, **context}).json()
    for r in tei:
        assert r["score"] == pytest.approx(expit(0.5 * log_odds[r["index"]] - 1.0))
    # a mode without a calibration answers sigmoid and says so
    m0 = client.post("/v1/rerank", json={"query": "river", "documents": docs})
    assert m0.headers["x-acare-relevance"] == "sigmoid"
    assert m0.json()["meta"]["relevance"] == "sigmoid"
