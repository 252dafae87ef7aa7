"""First-stage fields and fusion on the HTTP app, without Ray (issue 20 part 2e).

The first test pins today's responses byte for byte: each expected body is written out by hand
from the service's own scores (the pre-fusion contract: results by log-odds, equal scores in
input order, ``relevance_score`` = sigmoid), so a request without the first-stage fields must
keep answering exactly that, whatever fusion the checkpoint has fitted.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient
from scipy.special import expit
from scoring_support import CAPITAL_DOCUMENTS, QUERY, QUESTION, REASONING

from acare_ray.online.http import single_model_api
from acare_ray.online.service import RerankInput, RerankService
from acare_ray.online.serving import inline_score
from acare_ray.ranking.fusion import FusionConfig, fuse

# The last document repeats the first: equal scores, so the tie rule shows.
DOCUMENTS = [*CAPITAL_DOCUMENTS, "Velmoria is a small country.", CAPITAL_DOCUMENTS[0]]
FIRST_STAGE = [12.5, 3.0, None, 7.25, 9.0, 1.0]
# What a checkpoint may have fitted: requests without a first stage must not notice it.
FITTED = [None, FusionConfig("rrf", k=60, weight=0.3), FusionConfig("linear", alpha=0.2)]


@pytest.fixture(scope="module")
def service(tiny_scorer) -> RerankService:
    return RerankService(tiny_scorer, "tiny")


def client_for(service, **options) -> TestClient:
    return TestClient(single_model_api(service, inline_score(service), **options))


def scored(service, search: RerankInput) -> tuple[np.ndarray, int, str]:
    """(log-odds, tokens scored, mode) of ``search`` straight from the service."""
    job = service.prepare(search)
    (out,) = service.score([job])
    return out.scores, out.tokens, job.mode.value


def today_order(scores: np.ndarray) -> list[int]:
    return sorted(range(len(scores)), key=lambda i: (-scores[i], i))


def encoded(body) -> bytes:
    """The bytes FastAPI writes for a JSON body."""
    return json.dumps(body, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()


COHERE_CASES = [
    ("/v2/rerank", {"query": QUERY, "documents": DOCUMENTS}),
    (
        "/v2/rerank",
        {
            "model": "acare",
            "query": QUERY,
            "documents": DOCUMENTS,
            "top_n": 3,
            "return_documents": True,
            "original_question": QUESTION,
            "reasoning": REASONING,
        },
    ),
    (
        "/v1/rerank",
        {
            "query": QUERY,
            "documents": [{"text": d, "id": f"d{i}"} for i, d in enumerate(DOCUMENTS)],
            "return_documents": True,
            "reasoning": REASONING,
            "mode": "M1",
        },
    ),
]
TEI_CASES = [
    {"query": QUERY, "texts": DOCUMENTS},
    {"query": QUERY, "texts": DOCUMENTS, "raw_scores": True, "return_text": True},
    {"query": QUERY, "texts": DOCUMENTS, "original_question": QUESTION},
]


def expected_cohere(service, path, body, request_id) -> tuple[bytes, dict[str, str]]:
    version = path[2]
    documents = [d if isinstance(d, str) else d["text"] for d in body["documents"]]
    search = RerankInput(
        query=body["query"],
        documents=documents,
        original_question=body.get("original_question"),
        reasoning=body.get("reasoning"),
        mode=body.get("mode", "auto"),
        max_tokens_per_doc=4096 if version == "2" else None,
    )
    scores, tokens, mode = scored(service, search)
    results = []
    for i in today_order(scores)[: body.get("top_n")]:
        result = {"index": i, "relevance_score": float(expit(np.float64(scores[i])))}
        if body.get("return_documents"):
            doc = body["documents"][i]
            result["document"] = {"text": doc} if isinstance(doc, str) else doc
        results.append(result)
    answer = {
        "id": request_id,
        "results": results,
        "meta": {
            "api_version": {"version": version},
            "billed_units": {"search_units": 1},
            "tokens": {"input_tokens": tokens, "output_tokens": 0},
            "model": "tiny",
            "mode": mode,
            "relevance": "sigmoid",  # issue 35: an uncalibrated checkpoint says so
        },
    }
    if version == "1":  # issue 34: vLLM's and Jina's top-level fields on the v1 route
        answer |= {"model": "tiny", "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
    headers = {"x-acare-mode": mode, "x-acare-tokens": str(tokens), "x-acare-batch-requests": "1"}
    headers["x-acare-relevance"] = "sigmoid"
    return encoded(answer), headers


def expected_tei(service, body) -> tuple[bytes, dict[str, str]]:
    search = RerankInput(
        query=body["query"],
        documents=body["texts"],
        original_question=body.get("original_question"),
    )
    scores, tokens, mode = scored(service, search)
    answer = []
    for i in today_order(scores):
        value = float(scores[i]) if body.get("raw_scores") else float(expit(np.float64(scores[i])))
        answer.append(
            {
                "index": i,
                "score": value,
                **({"text": DOCUMENTS[i]} if body.get("return_text") else {}),
            }
        )
    headers = {"x-acare-mode": mode, "x-acare-tokens": str(tokens), "x-acare-batch-requests": "1"}
    # the header says what the body holds: the log-odds themselves with raw_scores
    headers["x-acare-relevance"] = "raw" if body.get("raw_scores") else "sigmoid"
    return encoded(answer), headers


def acare_headers(response) -> dict[str, str]:
    return {k: v for k, v in response.headers.items() if k.startswith("x-acare-")}


@pytest.mark.parametrize("fitted", FITTED, ids=lambda f: f.label if f else "unfitted")
@pytest.mark.parametrize("path,body", COHERE_CASES)
def test_a_cohere_request_without_first_stage_fields_is_answered_as_before(
    service, path, body, fitted
):
    """Pins issue 20's promise: without first-stage fields the Cohere body is today's, byte for
    byte (results by log-odds, ties in input order, no fusion field anywhere), even when the
    checkpoint has a fitted fusion: there is no first stage to fuse with."""
    client = client_for(service, fitted_fusion=fitted)
    response = client.post(path, json=body)
    assert response.status_code == 200, response.text
    want, headers = expected_cohere(service, path, body, response.json()["id"])
    assert response.content == want
    assert acare_headers(response) == headers


@pytest.mark.parametrize("fitted", FITTED, ids=lambda f: f.label if f else "unfitted")
@pytest.mark.parametrize("body", TEI_CASES)
def test_a_tei_request_without_first_stage_fields_is_answered_as_before(service, body, fitted):
    """Pins issue 20's promise for the TEI shape (a bare list, usage in the headers)."""
    client = client_for(service, fitted_fusion=fitted)
    response = client.post("/rerank", json=body)
    assert response.status_code == 200, response.text
    want, headers = expected_tei(service, body)
    assert response.content == want
    assert acare_headers(response) == headers


def fused_by_hand(service, scores_search: RerankInput, config, first_stage=None):
    scores, _, _ = scored(service, scores_search)
    return scores, fuse(scores, config, first_stage)


@pytest.mark.parametrize("path", ["/v1/rerank", "/v2/rerank"])
@pytest.mark.parametrize("setting", ["rrf:k=5,weight=0.4", "linear:alpha=0.3", "none"])
def test_a_fused_cohere_request_equals_fuse_by_hand(service, path, setting):
    """Issue 20 part 2e: with first_stage_scores and a fusion setting the results follow
    fuse() of the served log-odds (top_n cut from the fused order), each carrying its
    first-stage rank and (unless none) its fused value; relevance_score stays sigmoid(score)."""
    body = {
        "query": QUERY,
        "documents": DOCUMENTS,
        "reasoning": REASONING,
        "top_n": 4,
        "first_stage_scores": FIRST_STAGE,
        "fusion": setting,
    }
    response = client_for(service, fitted_fusion=FusionConfig("linear", alpha=0.9)).post(
        path, json=body
    )
    assert response.status_code == 200, response.text
    config = FusionConfig.parse(setting)
    search = RerankInput(QUERY, DOCUMENTS, reasoning=REASONING, max_tokens_per_doc=None)
    if path == "/v2/rerank":
        search = RerankInput(QUERY, DOCUMENTS, reasoning=REASONING, max_tokens_per_doc=4096)
    scores, fused = fused_by_hand(service, search, config, FIRST_STAGE)
    answer = response.json()
    assert [r["index"] for r in answer["results"]] == [int(i) for i in fused.order[:4]]
    for r in answer["results"]:
        i = r["index"]
        assert r["relevance_score"] == float(expit(np.float64(scores[i])))
        assert r["first_stage_rank"] == int(fused.first_stage_rank[i])
        if config.enabled:
            assert r["fused_score"] == float(fused.values[i])
        else:
            assert "fused_score" not in r
    assert answer["meta"]["fusion"] == config.label
    assert response.headers["x-acare-fusion"] == config.label
    # None of the first-stage scores is missing from the ranks: the third (null) ranks last.
    ranks = {r["index"]: r["first_stage_rank"] for r in answer["results"]}
    assert ranks.get(2, 6) == 6


def test_a_fused_tei_request_equals_fuse_by_hand(service):
    """Issue 20 part 2e on the TEI shape: fused order, raw scores beside the fused value."""
    body = {
        "query": QUERY,
        "texts": DOCUMENTS,
        "raw_scores": True,
        "first_stage_order": True,
        "fusion": "rrf:k=2,weight=0.5",
    }
    response = client_for(service).post("/rerank", json=body)
    assert response.status_code == 200, response.text
    config = FusionConfig.parse(body["fusion"])
    scores, fused = fused_by_hand(service, RerankInput(QUERY, DOCUMENTS), config)
    answer = response.json()
    assert [r["index"] for r in answer] == [int(i) for i in fused.order]
    for r in answer:
        assert r["score"] == float(scores[r["index"]])
        assert r["fused_score"] == float(fused.values[r["index"]])
        assert r["first_stage_rank"] == r["index"] + 1  # list order is the first stage
    assert response.headers["x-acare-fusion"] == config.label


@pytest.mark.parametrize(
    "fitted", [FusionConfig("linear", alpha=0.25), FusionConfig("rrf", k=3, weight=0.6), None]
)
def test_without_a_fusion_field_the_checkpoints_fitted_setting_is_used(service, fitted):
    """Issue 20 part 2e: ``fusion`` absent (or ``auto``) means the served checkpoint's fitted
    setting; ``none`` when it has none (log-odds order, ties by first-stage rank)."""
    client = client_for(service, fitted_fusion=fitted)
    want = fitted or FusionConfig()
    scores, fused = fused_by_hand(
        service, RerankInput(QUERY, DOCUMENTS, max_tokens_per_doc=4096), want
    )
    for extra in ({}, {"fusion": "auto"}, {"fusion": " auto "}):
        body = {"query": QUERY, "documents": DOCUMENTS, "first_stage_order": True, **extra}
        answer = client.post("/v2/rerank", json=body).json()
        assert answer["meta"]["fusion"] == want.label
        assert [r["index"] for r in answer["results"]] == [int(i) for i in fused.order]
        assert [r.get("fused_score") for r in answer["results"]] == [
            float(fused.values[i]) if want.enabled else None for i in fused.order
        ]
    # The exact duplicate documents tie; the earlier one (first-stage rank) wins.
    order = [r["index"] for r in answer["results"]]
    if not want.enabled:
        assert order.index(0) < order.index(5)
    # "none" turns the fitted setting off for this request.
    body = {"query": QUERY, "documents": DOCUMENTS, "first_stage_order": True, "fusion": "none"}
    answer = client.post("/v2/rerank", json=body).json()
    assert answer["meta"]["fusion"] == "none"
    assert all("fused_score" not in r for r in answer["results"])
    assert [r["index"] for r in answer["results"]] == today_order(scores)


BAD = [
    ('"first_stage_scores": [1, 2, 3]', "first_stage_scores: has 3 entries, expected 6"),
    (
        '"first_stage_scores": [1, 2, 3, 4, 5, 6, 7]',
        "first_stage_scores: has 7 entries, expected 6",
    ),
    (
        '"first_stage_scores": [1, NaN, 3, 4, 5, 6]',
        "first_stage_scores[1]: Input should be a finite",
    ),
    (
        '"first_stage_scores": [1, 2, Infinity, 4, 5, 6]',
        "first_stage_scores[2]: Input should be a finite",
    ),
    (
        '"first_stage_scores": [1, 2, 3, -Infinity, 5, 6]',
        "first_stage_scores[3]: Input should be a finite",
    ),
    (
        '"first_stage_scores": [1, 2, 3, 4, 1e400, 6]',
        "first_stage_scores[4]: Input should be a finite",
    ),
    (
        '"first_stage_scores": [1, 2, 3, 4, 5, "6"]',
        "first_stage_scores[5]: Input should be a valid number",
    ),
    (
        '"first_stage_scores": [1, 2, 3, 4, 5, true]',
        "first_stage_scores[5]: Input should be a valid number",
    ),
    ('"first_stage_scores": 3', "first_stage_scores: Input should be a valid list"),
    ('"first_stage_order": "maybe"', "first_stage_order: Input should be a valid boolean"),
    ('"first_stage_order": true, "fusion": "borda"', "fusion: fusion method must be one of"),
    ('"first_stage_order": true, "fusion": "rrf:k=0"', "fusion: fusion k must be > 0"),
    (
        '"first_stage_order": true, "fusion": "linear:alpha=2"',
        "fusion: fusion alpha must be in [0, 1]",
    ),
    ('"first_stage_order": true, "fusion": "rrf:weight=x"', "weight is not a number"),
    ('"first_stage_order": true, "fusion": 3', "fusion: Input should be a valid string"),
    ('"fusion": "rrf"', "fusion: 'rrf' needs the first stage"),
    (
        '"fusion": "linear:alpha=0.5", "first_stage_order": false',
        "fusion: 'linear:alpha=0.5' needs",
    ),
]


@pytest.mark.parametrize("path,documents", [("/v2/rerank", "documents"), ("/rerank", "texts")])
@pytest.mark.parametrize("fields,message", BAD)
def test_bad_first_stage_fields_get_a_4xx_naming_the_field(
    service, path, documents, fields, message
):
    """Issue 20 part 2e: wrong lengths, NaN, inf, non-numbers and bad settings are client
    mistakes (4xx, never 5xx), each naming the field and index."""
    texts = json.dumps(DOCUMENTS)
    content = f'{{"query": "q", "{documents}": {texts}, {fields}}}'
    response = client_for(service).post(
        path, content=content, headers={"content-type": "application/json"}
    )
    assert response.status_code == 422, response.text
    assert message in response.json()["message"], response.json()
    if "entries" in message:
        assert f"one per item of {documents}" in response.json()["message"]


def test_missing_first_stage_scores_rank_last_and_empty_requests_still_answer(service):
    """A null first-stage score is a document the first stage did not score (last); an empty
    request with a first stage is answered like any empty request."""
    client = client_for(service)
    body = {"query": QUERY, "texts": DOCUMENTS, "first_stage_scores": FIRST_STAGE}
    answer = client.post("/rerank", json=body).json()
    ranks = {r["index"]: r["first_stage_rank"] for r in answer}
    assert ranks == {0: 1, 4: 2, 3: 3, 1: 4, 5: 5, 2: 6}
    empty = client.post(
        "/v2/rerank", json={"query": QUERY, "documents": [], "first_stage_scores": []}
    )
    assert empty.status_code == 200 and empty.json()["results"] == []


def test_the_documented_fused_request_is_answered_fused(service):
    """docs/online.md's first-stage example, posted as it is written."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "online.md").read_text()
    (body,) = [json.loads(b) for b in re.findall(r"```json\n(.*?)```", text, flags=re.S)]
    response = client_for(service).post("/v2/rerank", json=body)
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["meta"]["fusion"] == body["fusion"]
    assert sorted(r["first_stage_rank"] for r in answer["results"]) == [1, 2, 3]
    assert all("fused_score" in r for r in answer["results"])


def test_a_pass_through_checkpoint_keeps_the_order_the_documents_came_in(service):
    """Issue 32: the safety rule stored the first-stage order; a request without first-stage
    fields is answered in its own document order (the agent's list is never made worse), and
    `fusion: none` still asks for the reranker's order."""
    from acare_ray.ranking.fusion_fit import PASS_THROUGH

    client = client_for(service, fitted_fusion=PASS_THROUGH)
    body = {"query": "capital", "documents": DOCUMENTS}
    kept = client.post("/v1/rerank", json=body)
    assert kept.status_code == 200
    assert [r["index"] for r in kept.json()["results"]] == list(range(len(DOCUMENTS)))
    assert kept.headers["x-acare-fusion"] == PASS_THROUGH.label
    tei = client.post("/rerank", json={"query": "capital", "texts": DOCUMENTS}).json()
    assert [r["index"] for r in tei] == list(range(len(DOCUMENTS)))
    raw = client.post("/v1/rerank", json={**body, "fusion": "none"}).json()
    scores = {r["index"]: r["relevance_score"] for r in raw["results"]}
    assert [r["index"] for r in raw["results"]] == sorted(scores, key=lambda i: -scores[i])
    assert [r["index"] for r in raw["results"]] != list(range(len(DOCUMENTS)))  # not trivial
