"""The protocols' request/response models: document checks, rank_fields, score presentation."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from pydantic import ValidationError

from acare_ray.online.protocols.cohere import CohereRerankRequest, cohere_response
from acare_ray.online.protocols.tei import TeiRerankRequest, tei_response
from acare_ray.online.serving import RerankOutcome
from acare_ray.scoring import Mode


def reranked(scores, values, relevance="sigmoid", truncated: tuple[int, ...] = ()) -> RerankOutcome:
    """What the serving object answers for a request of ``len(scores)`` documents (M0)."""
    return RerankOutcome(
        model="m",
        mode=Mode.M0,
        scores=np.asarray(scores),
        values=np.asarray(values),
        relevance=relevance,
        tokens=7,
        limit=5,
        truncated=truncated,
    )


def test_relevance_is_the_sigmoid_of_log_odds_without_overflow(tiny_scorer):
    """The one rule's uncalibrated case (a checkpoint without a calibration)."""
    from acare_ray.online.service import RerankService
    from acare_ray.scoring import Mode

    service = RerankService(tiny_scorer, "tiny")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        scores = np.array([-1000.0, -2.0, 0.0, 3.5, 1000.0], dtype=np.float32)
        got, calibrated = service.relevance(scores, Mode.M3)
    assert not calibrated
    want = [0.0, 1 / (1 + np.exp(2.0)), 0.5, 1 / (1 + np.exp(-3.5)), 1.0]
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-300)


@pytest.mark.parametrize(
    ("documents", "loc"),
    [
        (["a", 3], ("documents", 1)),
        (["a", None], ("documents", 1)),
        ([{"text": 5}], ("documents", 0)),
        ([["a"]], ("documents", 0)),
    ],
)
def test_a_bad_document_error_points_at_the_item(documents, loc):
    with pytest.raises(ValidationError) as error:
        CohereRerankRequest(query="q", documents=documents)
    assert [e["loc"] for e in error.value.errors()] == [loc]


def test_rank_fields_choose_the_scored_text_in_order():
    body = CohereRerankRequest(
        query="q",
        documents=[{"title": "T", "text": "B", "url": "u"}, "plain", {"text": "only text"}],
        rank_fields=["title", "text"],
    )
    assert body.texts() == ["title: T\ntext: B", "plain", "text: only text"]
    assert body.document_payload(0) == {"title": "T", "text": "B", "url": "u"}
    assert body.document_payload(1) == {"text": "plain"}


def test_object_documents_need_text_unless_rank_fields_say_otherwise():
    with pytest.raises(ValidationError, match=r"documents\[0\]\.text is missing"):
        CohereRerankRequest(query="q", documents=[{"title": "T"}])
    with pytest.raises(ValidationError, match=r"documents\[0\]\.title must be a string"):
        CohereRerankRequest(query="q", documents=[{"title": 1}], rank_fields=["title"])


def test_cohere_results_follow_log_odds_with_ties_in_input_order():
    body = CohereRerankRequest(
        query="q", documents=["a", "b", "c", "d"], top_n=3, return_documents=True
    )
    scores = np.array([0.5, 2.0, 0.5, -1.0], dtype=np.float32)
    values = np.array([0.1, 0.2, 0.3, 0.4])  # whatever the route's rule made: placed, not remade
    out = cohere_response(
        body, reranked(scores, values, "calibrated", (2,)), request_id="r", version="2"
    )
    assert [r.index for r in out.results] == [1, 0, 2]
    assert [r.document for r in out.results] == [{"text": "b"}, {"text": "a"}, {"text": "c"}]
    assert [r.relevance_score for r in out.results] == [0.2, 0.1, 0.3]
    assert out.meta.relevance == "calibrated"
    assert out.meta.mode == "M0" and out.meta.api_version.version == "2"
    assert out.meta.warnings == ["truncated to 5 tokens: documents[2]"]


def test_tei_answers_order_by_log_odds_and_direction_is_case_insensitive():
    scores = np.array([-1.0, 3.0], dtype=np.float32)
    values = np.array([0.25, 0.75])  # the route's relevance, placed as given
    plain = tei_response(TeiRerankRequest(query="q", texts=["a", "b"]), reranked(scores, values))
    assert [(r.index, r.score, r.text) for r in plain] == [(1, 0.75, None), (0, 0.25, None)]
    raw = tei_response(
        TeiRerankRequest(query="q", texts=["a", "b"], raw_scores=True, return_text=True),
        reranked(scores, scores.astype(np.float64), "raw"),
    )
    assert [(r.score, r.text) for r in raw] == [(3.0, "b"), (-1.0, "a")]
    assert TeiRerankRequest(query="q", texts=[], truncation_direction="Left").search().keep_end
