"""What the Serve app refuses over real HTTP: client mistakes (4xx naming the field, never a
5xx), bodies over the limit, auth, no server path in an answer, and Serve's bounded queue
(503) (the ``main`` and ``guarded`` apps)."""

from __future__ import annotations

import concurrent.futures
import json

import cohere
import httpx
import numpy as np
import pytest
from scoring_support import QUERY
from serve_support import (
    API_KEY,
    DOCUMENTS,
    MAX_BODY_BYTES,
    MAX_DOCUMENTS,
    expected,
)

from acare_ray.online.models import short_model_name
from acare_ray.scoring import AgentContext

pytestmark = pytest.mark.slow
SERVE_APPS = ("main", "guarded")


def test_no_answer_shows_the_servers_checkpoint_path(http, checkpoint):
    """Issue 34: the id clients see is a short name, not the absolute checkpoint path (which
    leaks the server's file system and breaks clients that send the id back); the path stays
    behind /v1/status."""
    answers = [
        http.get("/v1/models"),
        http.get("/info"),
        http.post("/v1/rerank", json={"query": QUERY, "documents": DOCUMENTS}),
        http.post("/v2/rerank", json={"query": QUERY, "documents": DOCUMENTS}),
        http.post("/rerank", json={"query": QUERY, "texts": DOCUMENTS}),
        http.post("/v1/score", json={"text_1": QUERY, "text_2": DOCUMENTS}),
        http.post("/v2/rerank", json={"query": QUERY, "documents": [""]}),
    ]
    for response in answers:
        seen = response.text + " ".join(f"{k}: {v}" for k, v in response.headers.items())
        assert str(checkpoint) not in seen, (response.url, seen[:300])
    name = short_model_name(str(checkpoint))
    assert http.get("/v1/models").json()["data"][0]["id"] == name
    assert answers[3].json()["meta"]["model"] == name
    again = http.post("/v2/rerank", json={"model": name, "query": QUERY, "documents": DOCUMENTS})
    assert again.status_code == 200  # the id a client read is one it can send back


BAD_REQUESTS = [
    ("/v2/rerank", {"documents": ["a"]}, 422, "query"),
    ("/rerank", {"texts": ["a"]}, 422, "query"),
    ("/v2/rerank", {"query": "   ", "documents": ["a"]}, 422, "query"),
    ("/v2/rerank", {"query": "q", "documents": ["a", 7]}, 422, "documents[1]"),
    ("/v1/rerank", {"query": "q", "documents": ["a", None]}, 422, "documents[1]"),
    ("/v1/rerank", {"query": "q", "documents": ["a", {"title": "t"}]}, 422, "documents[1].text"),
    ("/rerank", {"query": "q", "texts": ["a", {"text": "b"}]}, 422, "texts[1]"),
    ("/v2/rerank", {"query": "q", "documents": ["a", ""]}, 422, "documents[1]"),
    ("/v2/rerank", {"query": "q", "documents": "a"}, 422, "documents"),
    ("/v2/rerank", {"query": "q", "documents": ["a"], "mode": "M2"}, 422, "original_question"),
    ("/v2/rerank", {"query": "q", "documents": ["a"], "mode": "full"}, 422, "original_question"),
    ("/rerank", {"query": "q", "texts": ["a"], "mode": "M1"}, 422, "reasoning"),
    ("/v2/rerank", {"query": "q", "documents": ["a"], "mode": "M7"}, 422, "mode"),
    ("/v2/rerank", {"query": "q", "documents": ["a"], "top_n": 0}, 422, "top_n"),
    (
        "/v2/rerank",
        {"query": "q", "documents": ["a"], "max_tokens_per_doc": -1},
        422,
        "max_tokens_per_doc",
    ),
    (
        "/v2/rerank",
        {"query": "q", "documents": ["a"], "orginal_question": "x"},
        422,
        "orginal_question",
    ),
    (
        "/rerank",
        {"query": "q", "texts": ["a"], "truncation_direction": "up"},
        422,
        "truncation_direction",
    ),
    ("/v2/rerank", {"query": "q", "documents": ["a"] * (MAX_DOCUMENTS + 1)}, 413, "documents"),
]


@pytest.mark.parametrize(("path", "body", "status", "field"), BAD_REQUESTS)
def test_client_mistakes_get_4xx_naming_the_field(http, path, body, status, field):
    response = http.post(path, json=body)
    assert response.status_code == status, response.text
    assert response.json()["message"].startswith(field), response.json()


def test_refusing_truncation_gets_413_for_a_document_that_does_not_fit(http):
    body = {"query": "q", "texts": ["short", "word " * 9000], "truncate": False}
    response = http.post("/rerank", json=body)
    assert response.status_code == 413
    assert response.json()["message"].startswith("texts[1]")
    assert http.post("/rerank", json=body | {"truncate": True}).status_code == 200


@pytest.mark.parametrize(
    "content",
    [
        b"{not json",
        b"[]",
        b'"just a string"',
        b"null",
        b'{"query": 5, "documents": ["a"]}',
        b'{"query": "q", "documents": [["nested"]]}',
        b'{"query": "q", "documents": ["a"], "top_n": "many"}',
        b'{"query": "q", "documents": ["a"], "mode": 3}',
        b'{"query": "q", "documents": ["a"], "return_documents": "perhaps"}',
        b'{"query": "q", "documents": ["a"], "original_question": ["x"]}',
        b'{"query": "q", "documents": [{"title": 3}], "rank_fields": ["title"]}',
        b'{"query": "\\ud800", "documents": ["a"]}',
    ],
)
@pytest.mark.parametrize("path", ["/v1/rerank", "/v2/rerank", "/rerank", "/v1/score"])
def test_no_client_mistake_gets_a_5xx(http, path, content):
    response = http.post(path, content=content, headers={"content-type": "application/json"})
    assert 400 <= response.status_code < 500, (response.status_code, response.text)
    assert response.json()["message"]


def test_body_over_the_limit_gets_413_declared_or_streamed(http):
    big = json.dumps({"query": "q", "documents": ["x" * 1000] * 250}).encode()
    assert len(big) > MAX_BODY_BYTES
    declared = http.post("/v2/rerank", content=big, headers={"content-type": "application/json"})
    assert declared.status_code == 413
    assert declared.json()["message"].startswith("body")

    def chunks():
        for i in range(0, len(big), 16384):
            yield big[i : i + 16384]

    streamed = http.post(
        "/v2/rerank", content=chunks(), headers={"content-type": "application/json"}
    )
    assert streamed.status_code == 413


def test_without_auth_configured_no_key_is_needed(http):
    assert http.get("/v1/status").json()["auth"] is False
    response = http.post("/v2/rerank", json={"query": "q", "documents": ["a"]})
    assert response.status_code == 200


def test_with_auth_configured_the_bearer_key_is_required(served):
    url = served["base"] + "/guarded"
    body = {"query": QUERY, "documents": DOCUMENTS[:2]}
    assert httpx.get(url + "/health").status_code == 200
    missing = httpx.post(url + "/v2/rerank", json=body)
    assert missing.status_code == 401
    assert missing.headers["www-authenticate"] == "Bearer"
    wrong = httpx.post(url + "/v2/rerank", json=body, headers={"authorization": "Bearer nope"})
    assert wrong.status_code == 401
    assert httpx.get(url + "/v1/models").status_code == 401

    co = cohere.ClientV2(api_key=API_KEY, base_url=url)
    response = co.rerank(model="acare", query=QUERY, documents=DOCUMENTS[:2])
    assert sorted(r.index for r in response.results) == [0, 1]


def test_overload_past_serves_bounded_queue_gets_503(served, scorer):
    """Serve's backstop: beyond ``max_ongoing_requests`` + ``max_queued_requests``, 503."""
    url = served["base"] + "/guarded/rerank"
    headers = {"authorization": f"Bearer {API_KEY}"}
    bodies = [{"query": f"{QUERY} {i}", "texts": DOCUMENTS, "raw_scores": True} for i in range(10)]

    def send(body):
        return httpx.post(url, json=body, headers=headers, timeout=60)

    with concurrent.futures.ThreadPoolExecutor(len(bodies)) as pool:
        responses = list(pool.map(send, bodies))
    statuses = [r.status_code for r in responses]
    assert set(statuses) <= {200, 503}, statuses
    # 2 ongoing + 1 queued can be accepted while the first batch waits; the rest overflow.
    assert statuses.count(503) >= len(bodies) - 3 - 2, statuses
    assert 200 in statuses
    for body, response in zip(bodies, responses):
        if response.status_code == 503:
            assert response.headers.get("retry-after") == "1"
            continue
        got = {r["index"]: r["score"] for r in response.json()}
        want = expected(scorer, AgentContext(body["query"]), DOCUMENTS)
        np.testing.assert_allclose([got[i] for i in range(len(DOCUMENTS))], want, atol=1e-4)
