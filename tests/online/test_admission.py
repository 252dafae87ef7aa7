"""Admission by expected wait without Ray: the estimator, and the HTTP app's 503 and usage."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from online_support import admission_screen, admitted_scoring

from acare_ray.online.admission import Admission, Overloaded
from acare_ray.online.http import single_model_api
from acare_ray.online.service import RerankService

DOCUMENTS = ["Ostrava is the capital of Velmoria.", "Paris is the capital of France."]


def test_before_any_batch_the_prior_is_the_throughput():
    admission = Admission(deadline_s=2.0, prior_tokens_per_s=1000.0)
    assert not admission.measured and admission.tokens_per_s == 1000.0
    assert admission.expected_wait_s() == 0.0


def test_expected_wait_grows_with_the_tokens_queued_ahead():
    admission = Admission(deadline_s=100.0, prior_tokens_per_s=1000.0)
    waits = []
    for _ in range(4):
        waits.append(admission.check(now=0.0).expected_wait_s)
        assert admission.admit(500, now=0.0).admitted
    assert waits == [0.0, 0.5, 1.0, 1.5]
    assert admission.queued_tokens == 2000 and admission.queued_requests == 4
    admission.done(500)
    assert admission.expected_wait_s(now=0.0) == pytest.approx(1.5)
    assert admission.queued_requests == 3


def test_a_request_is_refused_exactly_when_its_expected_start_is_after_the_deadline():
    admission = Admission(deadline_s=2.0, prior_tokens_per_s=1000.0)
    assert admission.admit(2000, now=0.0).admitted, "nothing ahead: any request starts at once"
    at_deadline = admission.admit(10, now=0.0)
    assert at_deadline.admitted and at_deadline.expected_wait_s == 2.0, "2.0 s is not late"
    refused = admission.admit(10, now=0.0)
    assert not refused.admitted
    assert refused.expected_wait_s == pytest.approx(2.01)
    assert admission.queued_tokens == 2010, "a refused request adds no work"
    assert (admission.admitted, admission.refused) == (2, 1)
    admission.done(10)
    assert admission.admit(10, now=0.0).admitted


@pytest.mark.parametrize(
    ("queued", "retry_after"),
    [(2001, 1), (2500, 1), (3000, 1), (3001, 2), (9400, 8)],
)
def test_retry_after_is_the_time_until_the_work_ahead_fits_the_deadline(queued, retry_after):
    admission = Admission(deadline_s=2.0, prior_tokens_per_s=1000.0)
    admission.admit(queued, now=0.0)
    decision = admission.check(now=0.0)
    assert not decision.admitted
    assert decision.retry_after_s == retry_after
    assert isinstance(decision.retry_after_s, int)
    refusal = decision.refusal(admission.deadline_s)
    assert isinstance(refusal, Overloaded) and refusal.retry_after_s == retry_after
    assert "deadline of 2 s" in refusal.message


def test_measured_batches_replace_the_prior_and_recent_ones_weigh_more():
    admission = Admission(deadline_s=2.0, prior_tokens_per_s=100.0, decay=0.5)
    admission.batch_started(4000, now=0.0)
    admission.batch_finished(4000, seconds=2.0)
    assert admission.measured and admission.tokens_per_s == pytest.approx(2000.0)
    admission.batch_finished(3000, seconds=1.0)  # 3000 tokens/s
    # (0.5 * 4000 + 3000) / (0.5 * 2 + 1)
    assert admission.tokens_per_s == pytest.approx(2500.0)
    for _ in range(20):
        admission.batch_finished(3000, seconds=1.0)
    assert admission.tokens_per_s == pytest.approx(3000.0, rel=1e-4)
    rate = admission.tokens_per_s
    admission.batch_finished(0, seconds=1.0)  # a failed batch is no sample
    admission.batch_finished(100, seconds=0.0)
    assert admission.tokens_per_s == rate


def test_the_running_batch_counts_as_done_as_far_as_it_should_have_got():
    admission = Admission(deadline_s=1.0, prior_tokens_per_s=1000.0)
    admission.admit(3000, now=10.0)
    admission.admit(500, now=10.0)  # wait 3.0 s > 1 s: refused
    admission.batch_started(3000, now=10.0)
    assert admission.expected_wait_s(now=10.0) == pytest.approx(3.0)
    assert admission.expected_wait_s(now=11.5) == pytest.approx(1.5)
    assert not admission.check(now=11.5).admitted
    assert admission.check(now=12.0).admitted
    # Running late: the running batch is never counted as more than done.
    admission.admit(500, now=12.0)
    assert admission.expected_wait_s(now=20.0) == pytest.approx(0.5)
    admission.batch_finished(3000, seconds=10.0)
    admission.done(3000)
    assert admission.tokens_per_s == pytest.approx(300.0)
    assert admission.expected_wait_s(now=20.0) == pytest.approx(500 / 300)


def test_screen_counts_a_refusal_and_configure_keeps_what_was_measured():
    admission = Admission(deadline_s=1.0, prior_tokens_per_s=1000.0)
    admission.admit(5000, now=0.0)
    assert not admission.screen(now=0.0).admitted
    assert admission.refused == 1 and admission.queued_tokens == 5000
    admission.batch_finished(1000, seconds=1.0)
    admission.configure(deadline_s=10.0, prior_tokens_per_s=5.0)
    assert admission.tokens_per_s == 1000.0
    assert admission.screen(now=0.0).admitted
    snapshot = admission.snapshot(now=0.0)
    assert snapshot["deadline_s"] == 10.0 and snapshot["queued_tokens"] == 5000
    assert snapshot["expected_wait_s"] == 5.0 and snapshot["refused"] == 1
    with pytest.raises(ValueError):
        Admission(deadline_s=0, prior_tokens_per_s=1.0)
    with pytest.raises(ValueError):
        Admission(deadline_s=1, prior_tokens_per_s=1.0, decay=1.0)


@pytest.mark.parametrize("clients", [1, 2, 3])
def test_refusal_wait_is_where_clients_sharing_a_replica_evenly_start_being_refused(clients):
    """``refusal_wait_s`` (what the autoscaling benchmark sizes its load with) against what
    ``admit`` does: each client sends 10-token requests in turn until one is refused."""
    admission = Admission(deadline_s=2.0, prior_tokens_per_s=100.0, client_share=0.4)
    refused = None
    for i in range(100):
        if not admission.admit(10, client=f"c{i % clients}", now=0.0).admitted:
            refused = admission.expected_wait_s(now=0.0)
            break
    assert refused is not None
    # the wait queued when the first request was refused: within one request (0.1 s) of it
    assert refused == pytest.approx(admission.refusal_wait_s(clients), abs=0.1 + 1e-9)
    assert admission.refusal_wait_s(clients) == min(2.0, 0.8 * clients)
    with pytest.raises(ValueError, match="clients"):
        admission.refusal_wait_s(0)


@pytest.fixture(scope="module")
def service(tiny_scorer) -> RerankService:
    return RerankService(tiny_scorer, "tiny")


def app_with(service: RerankService, admission: Admission, screens: bool = True) -> TestClient:
    """The HTTP app with admission wired the way the deployment wires it, scoring inline."""
    screen = admission_screen(admission) if screens else None
    return TestClient(
        single_model_api(service, admitted_scoring(service, admission), screen=screen)
    )


@pytest.mark.parametrize("path", ["/v1/rerank", "/v2/rerank", "/rerank"])
@pytest.mark.parametrize("where", ["screen", "admit"])
def test_a_refused_request_gets_503_with_retry_after(service, path, where):
    admission = Admission(deadline_s=1.0, prior_tokens_per_s=1000.0)
    admission.admit(3500, now=0.0)  # 3.5 s ahead, 2.5 s over the deadline
    # "admit": no early screen, refused once the request is read and its tokens are known.
    client = app_with(service, admission, screens=where == "screen")
    field = "texts" if path == "/rerank" else "documents"
    body = {"query": "capital", field: DOCUMENTS}
    response = client.post(path, json=body)
    assert response.status_code == 503, response.text
    assert response.headers["retry-after"] == "3"
    assert float(response.headers["x-acare-expected-wait-s"]) == pytest.approx(3.5, abs=0.1)
    assert response.json()["message"].startswith("overloaded")
    assert admission.queued_tokens == 3500 and admission.refused == 1


def test_an_unauthorized_request_gets_401_not_503(service):
    admission = Admission(deadline_s=1.0, prior_tokens_per_s=1.0)
    admission.admit(1000)
    client = TestClient(
        single_model_api(service, None, api_key="k", screen=admission_screen(admission))
    )
    response = client.post("/rerank", json={"query": "q", "texts": DOCUMENTS})
    assert response.status_code == 401


@pytest.mark.parametrize("path", ["/v1/rerank", "/v2/rerank", "/rerank"])
def test_every_answer_reports_the_tokens_the_scorer_really_scored(service, tiny_scorer, path):
    admission = Admission(deadline_s=1.0, prior_tokens_per_s=1000.0)
    client = app_with(service, admission)
    field = "texts" if path == "/rerank" else "documents"
    body = {"query": "capital population", field: DOCUMENTS, "reasoning": "Need the capital."}
    before = tiny_scorer.stats.real_tokens
    response = client.post(path, json=body)
    scored = tiny_scorer.stats.real_tokens - before
    assert response.status_code == 200, response.text
    assert scored > 0
    assert int(response.headers["x-acare-tokens"]) == scored
    if path != "/rerank":
        meta = response.json()["meta"]
        assert meta["tokens"] == {"input_tokens": scored, "output_tokens": 0}
        assert meta["billed_units"] == {"search_units": 1}
    assert admission.queued_tokens == 0 and admission.admitted == 1


def test_an_empty_request_reports_zero_tokens(service):
    client = app_with(service, Admission(deadline_s=1.0, prior_tokens_per_s=1000.0))
    response = client.post("/v2/rerank", json={"query": "q", "documents": []})
    assert response.status_code == 200
    assert response.headers["x-acare-tokens"] == "0"
    assert response.json()["meta"]["tokens"]["input_tokens"] == 0
