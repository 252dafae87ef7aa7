"""Issue 21.3/21.4 on the HTTP app without Ray: cost bounds before tokenizing, fair shares,
body-read deadline, bounded errors, auth that fails closed, a minimal public /health, and a
property-based fuzz of the API (no 5xx; every 4xx names the field)."""

from __future__ import annotations

import asyncio
import dataclasses
import json

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from online_support import admission_screen, admitted_scoring

from acare_ray.online.admission import Admission
from acare_ray.online.app_args import AppArgs
from acare_ray.online.http import parse_keys, single_model_api
from acare_ray.online.service import Limits, RerankInput, RerankService
from acare_ray.scoring import AgentContext

DOCUMENTS = ["Ostrava is the capital of Velmoria.", "Paris is the capital of France."]
MAX_DOCUMENTS = 8


@pytest.fixture(scope="module")
def service(tiny_scorer) -> RerankService:
    limits = Limits(max_documents=MAX_DOCUMENTS, max_body_bytes=64_000, max_request_tokens=4000)
    return RerankService(tiny_scorer, "tiny", limits)


def app(service, admission=None, **options) -> TestClient:
    admission = admission or Admission(deadline_s=10.0, prior_tokens_per_s=1e6)
    return TestClient(single_model_api(service, admitted_scoring(service, admission), **options))


def test_the_token_cap_refuses_before_anything_is_tokenized(service, monkeypatch):
    """Pins issue 21.3: fields were tokenized whole before any cap; now a request over
    max_request_tokens by its byte bound is refused (413, naming the field) untokenized."""

    def boom(*_, **__):
        raise AssertionError("tokenized")

    monkeypatch.setattr(service.layout, "fit", boom)
    monkeypatch.setattr(service.layout, "context_tokens", boom)
    with pytest.raises(Exception) as refused:
        service.prepare(RerankInput(query="q", documents=["word " * 1000] * MAX_DOCUMENTS))
    assert refused.value.status == 413 and refused.value.field == "documents"
    assert "max_tokens_per_doc" in refused.value.message


@pytest.mark.parametrize("backend", ["tiny_scorer", "minilm_scorer"])
def test_the_bound_is_never_below_what_the_model_computes(request, backend):
    """Pins issue 21.3 (admission's bytes/4 estimate was up to 4x low): the bound admission
    counts is at least the tokens the scorer really computes, for every mode."""
    scorer = request.getfixturevalue(backend)
    svc = RerankService(scorer, "x")
    texts = ["ééé ααα 中文 emoji 🙂 " * 20, "a b c d e f", "x" * 3000]
    for fields in ({}, {"original_question": "why? " * 50, "reasoning": "because " * 80}):
        job = svc.prepare(RerankInput(query="q " * 30, documents=texts, **fields))
        before = scorer.stats.real_tokens
        svc.score([job])
        assert job.bound >= scorer.stats.real_tokens - before


def test_max_documents_is_refused_while_validating(service):
    """Pins issue 21.3: the count was checked after the whole body was parsed into jobs."""
    client = app(service)
    body = {"query": "q", "documents": ["a"] * (MAX_DOCUMENTS + 1)}
    response = client.post("/v2/rerank", json=body)
    assert response.status_code == 413
    assert response.json()["message"].startswith("documents")
    spec = client.get("/openapi.json").json()["components"]["schemas"]
    assert spec["CohereRerankRequest"]["properties"]["documents"]["maxItems"] == MAX_DOCUMENTS


@pytest.mark.parametrize("first", ["q", ["q"] * (MAX_DOCUMENTS + 1)])
def test_the_score_api_holds_max_documents_too(service, first):
    """vLLM's score route takes one query against many texts or many pairs: both are bounded
    by max_documents (413 naming the field) before anything is tokenized or scored."""
    client = app(service)
    body = {"text_1": first, "text_2": ["a"] * (MAX_DOCUMENTS + 1)}
    before = service.scorer.stats.real_tokens
    response = client.post("/v1/score", json=body)
    assert response.status_code == 413
    assert response.json()["message"].startswith("text_2: has")
    assert service.scorer.stats.real_tokens == before
    ok = client.post("/v1/score", json={"text_1": "q", "text_2": ["a"] * MAX_DOCUMENTS})
    assert ok.status_code == 200 and len(ok.json()["data"]) == MAX_DOCUMENTS


def test_a_body_that_never_arrives_gets_408(service):
    """Pins issue 21.3: there was no body-read deadline."""
    api = single_model_api(
        RerankService(service.scorer, "x", Limits(body_read_timeout_s=0.05)), None
    )
    sent = []

    async def run():
        scope = {
            "type": "http",
            "method": "POST",
            "path": "/rerank",
            "root_path": "",
            "headers": [(b"content-type", b"application/json")],
            "query_string": b"",
            "client": ("10.0.0.1", 1),
            "server": ("t", 80),
            "scheme": "http",
            "http_version": "1.1",
        }

        async def receive():
            await asyncio.sleep(3600)

        async def send(message):
            sent.append(message)

        await api(scope, receive, send)

    asyncio.run(run())
    assert sent[0]["status"] == 408
    assert json.loads(sent[1]["body"])["message"].startswith("body")


def _blank_second_document(prepare):
    """``prepare`` that lets through a document the scorer refuses (a job gone bad after it
    was validated), so the scorer's own error reaches the HTTP layer."""

    def prepared(search):
        job = prepare(search)
        return dataclasses.replace(job, documents=(job.documents[0], " ", *job.documents[2:]))

    return prepared


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/rerank", {"query": "q", "texts": ["a", "b"]}, "texts[1]"),
        ("/v2/rerank", {"query": "q", "documents": ["a", "b"]}, "documents[1]"),
    ],
)
def test_a_document_the_scorer_refuses_is_named_as_the_client_sent_it(
    service, monkeypatch, path, body, field
):
    """Pins issue 22: a ValueError from scoring was always reported on `documents`, which a TEI
    client never sent (its field is `texts`); the 422 names the client's own field and index."""
    monkeypatch.setattr(service, "prepare", _blank_second_document(service.prepare))
    response = app(service).post(path, json=body)
    assert response.status_code == 422
    assert response.json()["message"].startswith(f"{field}: ")


@pytest.mark.parametrize(
    ("refusal", "field"),
    [
        (lambda: AgentContext(" "), "query"),
        (lambda: AgentContext("q", reasoning=5), "reasoning"),
        (lambda: AgentContext("q", question=5), "original_question"),
        (lambda: AgentContext("q").resolve_mode("M2"), "original_question"),
    ],
)
def test_a_context_the_scorer_refuses_is_not_blamed_on_the_documents(
    service, monkeypatch, refusal, field
):
    """Pins issue 22: a ValueError the scorer raised about the query, question or reasoning
    was reported on `documents`; the 422 names the request's own field for it."""

    def score_resolved(*_, **__):
        refusal()

    monkeypatch.setattr(service.scorer, "score_resolved", score_resolved)
    response = app(service).post("/rerank", json={"query": "q", "texts": ["a"]})
    assert response.status_code == 422
    assert response.json()["message"].startswith(f"{field}: ")


def test_echoed_fields_that_are_not_unicode_get_422_not_500(service):
    """Pins issue 21.4: an echoed extra field with a lone surrogate gave a 500 after the work."""
    content = (
        b'{"query": "q", "documents": [{"text": "a", "x": "\\ud800"}], "return_documents": true}'
    )
    response = app(service).post(
        "/v2/rerank", content=content, headers={"content-type": "application/json"}
    )
    assert response.status_code == 422
    assert response.json()["message"].startswith("documents[0]")


def test_error_messages_and_the_truncated_header_are_bounded(service):
    """Pins issue 21.4: errors echoed unbounded input; x-acare-truncated could pass 4 KB."""
    client = app(service)
    response = client.post("/rerank", json={"query": "q", "texts": ["a"], "mode": "M" * 50_000})
    assert response.status_code == 422 and len(response.text) < 1000
    wide = RerankService(service.scorer, "x", Limits(max_documents=2000))
    docs = ["one two three four five six seven"] * 1500
    response = app(wide).post(
        "/v2/rerank", json={"query": "q", "documents": docs, "max_tokens_per_doc": 2}
    )
    assert response.status_code == 200
    assert len(response.headers["x-acare-truncated"]) < 1024
    assert response.headers["x-acare-truncated-count"] == "1500"


def test_health_says_only_up_or_down_and_status_needs_the_key(service):
    """Pins issue 21.4 / 23.5: /health showed model path, replica and auth settings to anyone."""
    up = [True]
    client = app(
        service, api_key="k1, k2\n", status=lambda: {"replica": "r"}, healthy=lambda: up[0]
    )
    assert client.get("/health").json() == {"status": "ok"}
    up[0] = False
    down = client.get("/health")
    assert down.status_code == 503 and down.json() == {"status": "down"}
    assert client.get("/v1/status").status_code == 401
    for key in ("k1", "k2"):
        status = client.get("/v1/status", headers={"authorization": f"Bearer {key}"}).json()
        sources = {"tiny": service.scorer.source}  # paths only behind the key (issue 34)
        assert status == {"model": "tiny", "sources": sources, "auth": True, "replica": "r"}


def test_keys_are_stripped_and_a_missing_key_refuses_to_start(monkeypatch):
    """Pins issue 21.2: a key file with a trailing newline made every request 401, and a
    missing secret served without auth."""
    assert parse_keys("s3cret\n") == ("s3cret",)
    assert parse_keys(" a ,b\n\n") == ("a", "b")
    monkeypatch.setenv("ACARE_TEST_KEY", "s3cret\n")
    assert AppArgs(api_key_env="ACARE_TEST_KEY").api_keys() == ("s3cret",)
    monkeypatch.setenv("ACARE_TEST_KEY", " \n")
    with pytest.raises(ValueError, match="allow_unauthenticated"):
        AppArgs(api_key_env="ACARE_TEST_KEY").api_keys()
    monkeypatch.delenv("ACARE_TEST_KEY")
    with pytest.raises(ValueError, match="ACARE_TEST_KEY"):
        AppArgs(api_key_env="ACARE_TEST_KEY").api_keys()
    with pytest.raises(ValueError):
        AppArgs(api_key_env=None).api_keys()
    assert AppArgs(api_key_env="ACARE_TEST_KEY", allow_unauthenticated=True).api_keys() == ()


def test_a_client_over_its_share_gets_429_and_others_still_get_in():
    """Pins issue 21.3 (no per-key limit): a client that already holds its share of the
    deadline's work is refused; another client with nothing queued is admitted."""
    admission = Admission(deadline_s=10.0, prior_tokens_per_s=100.0, client_share=0.5)
    assert admission.admit(400, "heavy", now=0.0).admitted  # 4 s of work
    refused = admission.admit(200, "heavy", now=0.0)  # 6 s > 5 s share
    assert not refused.admitted and refused.refusal(10.0).status == 429
    assert refused.retry_after_s == 1
    assert admission.admit(100, "light", now=0.0).admitted
    admission.done(400, "heavy")
    assert admission.admit(200, "heavy", now=0.0).admitted
    assert admission.snapshot(now=0.0)["rate_limited"] == 1


def test_a_client_holding_its_whole_share_is_refused_before_its_body_is_read(service):
    """Pins the load test's finding (issue 21.3): a client over its share got its 429 only after
    its body was parsed and tokenized, so one that ignored Retry-After cost the replica that
    work on every refusal. The screen now turns it away before reading (an unparseable body
    still gets 429), while another client is read and answered."""
    admission = Admission(deadline_s=10.0, prior_tokens_per_s=100.0, client_share=0.5)
    assert admission.admit(500, "key:0", now=0.0).admitted  # 5 s: the whole share
    keys = ("heavy-key", "light-key")
    client = app(service, admission, screen=admission_screen(admission), api_key=keys)
    heavy = client.post(
        "/rerank", content=b"{not json", headers={"authorization": "Bearer heavy-key"}
    )
    assert heavy.status_code == 429, heavy.text
    assert int(heavy.headers["retry-after"]) >= 1
    light = client.post(
        "/rerank",
        json={"query": "capital", "texts": DOCUMENTS},
        headers={"authorization": "Bearer light-key"},
    )
    assert light.status_code == 200, light.text
    assert admission.snapshot(now=0.0)["rate_limited"] == 1
    admission.done(500, "key:0")
    assert admission.screen("key:0").admitted


VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-5, 5000)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=30),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=12,
)
FIELDS = [
    "query",
    "documents",
    "texts",
    "top_n",
    "return_documents",
    "max_tokens_per_doc",
    "rank_fields",
    "original_question",
    "reasoning",
    "mode",
    "raw_scores",
    "return_text",
    "truncate",
    "truncation_direction",
    "model",
    "priority",
]
DOCS = st.lists(
    st.text(max_size=40)
    | st.fixed_dictionaries({"text": st.text(max_size=40)}, optional={"title": VALUES}),
    max_size=MAX_DOCUMENTS + 2,
)
BODIES = st.fixed_dictionaries(
    {},
    optional={
        **{name: VALUES for name in FIELDS},
        "query": st.text(max_size=40) | VALUES,
        "documents": DOCS | VALUES,
        "texts": st.lists(st.text(max_size=40), max_size=MAX_DOCUMENTS + 2) | VALUES,
        "mode": st.sampled_from(["auto", "M0", "M1", "M2", "M3", "full", "bogus"]) | VALUES,
    },
)


@pytest.fixture(scope="module")
def fuzz_client(service):
    return app(service)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(path=st.sampled_from(["/v1/rerank", "/v2/rerank", "/rerank"]), body=BODIES)
def test_fuzzed_bodies_never_get_a_5xx_and_every_4xx_names_a_field(fuzz_client, path, body):
    """Issue 21 done-when: a property-based fuzz of the HTTP API. Any JSON body to any rerank
    route gets 200 or a 4xx whose message starts with the request field at fault."""
    response = fuzz_client.post(path, json=body)
    assert response.status_code < 500, (response.status_code, response.text)
    if response.status_code >= 400:
        message = response.json()["message"]
        named = (*FIELDS, "body", "deadline")
        assert message.split(":")[0].split("[")[0].split(".")[0] in named, message
