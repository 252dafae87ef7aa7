"""Issue 23.1 on the HTTP app without Ray: what the request middleware and the routes record
(route template, status class, mode, documents, tokens, truncations), with bounded labels.

The exported names and the real Ray export are checked on a real cluster in
``test_metrics_cluster.py``."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from acare_ray.online.http import single_model_api
from acare_ray.online.metrics import METRICS, OTHER_ROUTE, exported_names
from acare_ray.online.service import Limits, RerankService
from acare_ray.online.serving import inline_score

DOCUMENTS = ["Ostrava is the capital of Velmoria.", "Paris is the capital of France."]
LONG = "word " * 200


class FakeRecorder:
    """Records the calls the app makes, in order."""

    def __init__(self) -> None:
        self.requests: list[tuple] = []
        self.scored_calls: list[tuple] = []

    def request(self, model, route, status, mode, seconds):
        assert seconds >= 0
        self.requests.append((model, route, status, mode))

    def scored(self, model, mode, documents, tokens, truncated):
        self.scored_calls.append((model, mode, documents, tokens, truncated))

    def refused(self, model, status): ...

    def batch(self, record): ...


@pytest.fixture(scope="module")
def service(tiny_scorer) -> RerankService:
    return RerankService(tiny_scorer, "tiny", Limits(max_documents=4))


def client(service, recorder, api_key=None) -> TestClient:
    api = single_model_api(service, inline_score(service), api_key=api_key, metrics=recorder)
    return TestClient(api)


def test_requests_are_counted_by_route_template_status_class_and_mode(service):
    recorder = FakeRecorder()
    http = client(service, recorder)
    full = {"original_question": "Where is Ostrava?", "reasoning": "It is a capital."}
    ok = http.post("/v2/rerank", json={"query": "capital", "documents": DOCUMENTS, **full})
    tei = http.post("/rerank", json={"query": "capital", "texts": DOCUMENTS, "mode": "M0"})
    empty = http.post("/v1/rerank", json={"query": "capital", "documents": ["", "x"]})
    bad_mode = http.post("/v1/rerank", json={"query": "q", "documents": ["x"], "mode": "M9"})
    models = http.get("/v1/models")
    missing = http.get("/no/such/secret-user-path")
    assert [r.status_code for r in (ok, tei, empty, bad_mode, models, missing)] == [
        200, 200, 422, 422, 200, 404,
    ]  # fmt: skip
    assert recorder.requests == [
        ("tiny", "/v2/rerank", 200, "M3"),
        ("tiny", "/rerank", 200, "M0"),
        ("tiny", "/v1/rerank", 422, "none"),
        ("tiny", "/v1/rerank", 422, "none"),
        ("tiny", "/v1/models", 200, "none"),
        ("tiny", OTHER_ROUTE, 404, "none"),
    ]
    tokens = [int(ok.headers["x-acare-tokens"]), int(tei.headers["x-acare-tokens"])]
    assert recorder.scored_calls == [
        ("tiny", "M3", 2, tokens[0], 0),
        ("tiny", "M0", 2, tokens[1], 0),
    ]


def test_truncated_documents_are_counted(service):
    recorder = FakeRecorder()
    body = {"query": "capital", "documents": [LONG, "Paris.", LONG], "max_tokens_per_doc": 16}
    response = client(service, recorder).post("/v2/rerank", json=body)
    assert response.status_code == 200, response.text
    assert response.headers["x-acare-truncated-count"] == "2"
    ((_, _, documents, tokens, truncated),) = recorder.scored_calls
    assert (documents, truncated) == (3, 2)
    assert tokens == int(response.headers["x-acare-tokens"])


def test_a_request_the_gate_refuses_counts_under_the_path_it_asked_for(service):
    """401 comes before routing: the route label is still the served path, never free text."""
    recorder = FakeRecorder()
    http = client(service, recorder, api_key="k")
    assert http.post("/rerank", json={"query": "q", "texts": ["x"]}).status_code == 401
    assert http.get("/made-up-path").status_code == 401
    assert [r[1:] for r in recorder.requests] == [
        ("/rerank", 401, "none"),
        (OTHER_ROUTE, 401, "none"),
    ]


def test_a_route_that_raises_counts_as_5xx(service):
    recorder = FakeRecorder()

    async def broken(job, _client):
        raise RuntimeError("model thread died")

    api = single_model_api(service, broken, metrics=recorder)
    response = TestClient(api, raise_server_exceptions=False).post(
        "/rerank", json={"query": "q", "texts": ["x"]}
    )
    assert response.status_code == 500
    assert recorder.requests == [("tiny", "/rerank", 500, "M0")]


def test_every_metric_has_bounded_label_keys_and_prometheus_names():
    allowed = {"route", "status_class", "mode", "model", "reason"}
    for spec in METRICS:
        assert set(spec.labels) <= allowed, spec
        assert spec.name.startswith("acare_")
    names = exported_names()
    assert "ray_acare_requests_total" in names and "ray_acare_batch_seconds_bucket" in names
    assert "ray_acare_requests" not in names
