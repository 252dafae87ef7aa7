"""First-stage fields and fusion on the HTTP app, without Ray (issue 20 part 2e).

The first test pins today's responses byte for byte: each expected body is written out by hand
from the service's own scores (the pre-fusion contract: results by log-odds, equal scores in
input order, ``relevance_score`` = sigmoid), so a request without the first-stage fields must
keep answering exactly that, whatever fusion the checkpoint has fitted.
"""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest
from fastapi.testclient import TestClient
from scipy.special import expit

from acare_ray.online.http import Scored, create_api
from acare_ray.online.service import RerankService, Search

QUERY = "capital population"
QUESTION = "What is the population of the capital of the country where Anna Berg was born?"
REASONING = "Anna Berg was born in Velmoria, so I need the capital of Velmoria and its population."
# The last document repeats the first: equal scores, so the tie rule shows.
DOCUMENTS = [
    "Ostrava is the capital of Velmoria and has a population of 1.2 million.",
    "Paris is the capital of France.",
    "Anna Berg is a singer from Velmoria.",
    "The capital of Zandor, Quell, counts 300,000 inhabitants.",
    "Velmoria is a small country.",
    "Ostrava is the capital of Velmoria and has a population of 1.2 million.",
]
HEADERS = ("x-acare-mode", "x-acare-tokens", "x-acare-batch-requests")


@pytest.fixture(scope="module")
def service(tiny_scorer) -> RerankService:
    return RerankService(tiny_scorer, "tiny")


def client_for(service, **options) -> TestClient:
    async def score(job, client):
        (scores,) = await asyncio.to_thread(service.score, [job])
        if isinstance(scores, Exception):
            raise scores
        return Scored(scores)

    return TestClient(create_api(service, score, **options))


def scored(service, search: Search) -> tuple[np.ndarray, int, str]:
    """(log-odds, tokens scored, mode) of ``search`` straight from the service."""
    job = service.prepare(search)
    (scores,) = service.score([job])
    return scores, service.tokens_scored(job), job.mode.value


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
    search = Search(
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
        },
    }
    headers = {"x-acare-mode": mode, "x-acare-tokens": str(tokens), "x-acare-batch-requests": "1"}
    return encoded(answer), headers


def expected_tei(service, body) -> tuple[bytes, dict[str, str]]:
    search = Search(
        query=body["query"], documents=body["texts"], original_question=body.get("original_question")
    )
    scores, tokens, mode = scored(service, search)
    answer = []
    for i in today_order(scores):
        value = float(scores[i]) if body.get("raw_scores") else float(expit(np.float64(scores[i])))
        answer.append(
            {"index": i, "score": value, **({"text": DOCUMENTS[i]} if body.get("return_text") else {})}
        )
    headers = {"x-acare-mode": mode, "x-acare-tokens": str(tokens), "x-acare-batch-requests": "1"}
    return encoded(answer), headers


def acare_headers(response) -> dict[str, str]:
    return {k: v for k, v in response.headers.items() if k.startswith("x-acare-")}


@pytest.mark.parametrize("path,body", COHERE_CASES)
def test_a_cohere_request_without_first_stage_fields_is_answered_as_before(service, path, body):
    """Pins issue 20's promise: without first-stage fields the Cohere body is today's, byte for
    byte (results by log-odds, ties in input order, no fusion field anywhere)."""
    client = client_for(service)
    response = client.post(path, json=body)
    assert response.status_code == 200, response.text
    want, headers = expected_cohere(service, path, body, response.json()["id"])
    assert response.content == want
    assert acare_headers(response) == headers


@pytest.mark.parametrize("body", TEI_CASES)
def test_a_tei_request_without_first_stage_fields_is_answered_as_before(service, body):
    """Pins issue 20's promise for the TEI shape (a bare list, usage in the headers)."""
    client = client_for(service)
    response = client.post("/rerank", json=body)
    assert response.status_code == 200, response.text
    want, headers = expected_tei(service, body)
    assert response.content == want
    assert acare_headers(response) == headers
