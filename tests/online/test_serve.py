"""The Serve app over real HTTP: Cohere SDK and TEI shapes, usage, batching, limits, auth,
overload.

Three applications are deployed once for the module, from ``serve_configs/local.yaml`` through
the same config path ``serve run <config>`` and ``serve deploy`` take:

- ``main`` at ``/``: the tiny Qwen3 saved as a trainer checkpoint (with ``acare.json`` and a
  fitted fusion, which requests without first-stage fields must not notice), no auth, small
  body and document limits;
- ``guarded`` at ``/guarded``: bearer key from an environment variable, and a tiny Serve queue
  (``max_ongoing_requests=2``, ``max_queued_requests=1``) whose batches wait 1.5 s for requests
  that can never arrive (2 < ``max_batch_size``), so a burst deterministically overflows
  Serve's backstop;
- ``burst`` at ``/burst``: one replica with a 2 s admission deadline and room in Serve's queue
  for the whole burst, so only admission by expected wait refuses work;
- ``fair`` at ``/fair``: two API keys (two clients), a 3 s admission deadline, each client
  holding at most half of it (``client_share``), small requests (``max_documents`` and
  ``max_request_tokens``), for the load test of fair shares;
- ``cancel`` at ``/cancel``: keyed, with a small forward batch (``scorer.max_batch_tokens``), so
  a large request takes many forward passes and a disconnect can stop it midway.
"""

from __future__ import annotations

import ast
import concurrent.futures
import copy
import json
import math
import random
import re
import shutil
import socket
import threading
import time
from pathlib import Path

import cohere
import httpx
import numpy as np
import pytest
from online_support import cohere_rerank, local_serve_config
from scipy.special import expit
from scoring_support import CAPITAL_DOCUMENTS, CONTEXT, QUERY, QUESTION, REASONING

from acare_ray.online.models import short_model_name
from acare_ray.ranking.checkpoint_settings import read_fusion, write_fusion
from acare_ray.ranking.fusion import FusionConfig, fuse
from acare_ray.scoring import ACARE_CONFIG_FILE, AgentContext, Mode, Scorer
from acare_ray.testing import deploy_serve_config, free_port

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
API_KEY_ENV = "ACARE_TEST_API_KEY"
API_KEY = "s3cret-test-key"
MAX_DOCUMENTS = 40
MAX_BODY_BYTES = 200_000
GUARDED_WAIT_S = 1.5
BURST_DEADLINE_S = 2.0
BURST_REQUESTS = 40
BURST_DOCUMENTS = 100
FAIR_KEYS_ENV = "ACARE_TEST_FAIR_KEYS"
KEY_A, KEY_B = "key-a-floods", "key-b-behaves"
FAIR_DEADLINE_S = 3.0
FAIR_SHARE = 0.5
FAIR_DOCUMENTS = 16
FAIR_MAX_TOKENS = 8000
FAIR_FLOODERS = 48
FAIR_B_REQUESTS = 16
CANCEL_FORWARD_TOKENS = 128
CANCEL_DOCUMENTS = 100
CANCEL_DOCUMENT_BYTES = 800

DOCUMENTS = [
    *CAPITAL_DOCUMENTS,
    "Population statistics for capitals in Europe vary widely.",
    "Velmoria is a small country.",
]
FULL = CONTEXT
FITTED = FusionConfig("linear", alpha=0.3)


def make_config(checkpoint: Path, port: int) -> dict:
    """serve_configs/local.yaml with the test model, port, limits, and the guarded app added."""
    config, main = local_serve_config(checkpoint, port, "main")
    main["args"].update(max_documents=MAX_DOCUMENTS, max_body_bytes=MAX_BODY_BYTES)
    guarded = copy.deepcopy(main)
    guarded.update(
        name="guarded",
        route_prefix="/guarded",
        runtime_env={"env_vars": {API_KEY_ENV: API_KEY}},
    )
    guarded["args"].update(api_key_env=API_KEY_ENV, allow_unauthenticated=False)
    guarded["deployments"][0].update(
        max_ongoing_requests=2,
        max_queued_requests=1,
        user_config={"max_batch_size": 4, "batch_wait_timeout_s": GUARDED_WAIT_S},
    )
    burst = copy.deepcopy(main)
    burst.update(name="burst", route_prefix="/burst")
    burst["args"].update(max_documents=BURST_DOCUMENTS, max_body_bytes=1_000_000)
    burst["deployments"][0].update(
        max_ongoing_requests=2 * BURST_REQUESTS,
        max_queued_requests=2 * BURST_REQUESTS,
        user_config={
            "max_batch_size": 4,
            "batch_wait_timeout_s": 0.005,
            "max_batch_tokens": 65536,
            "admission_deadline_s": BURST_DEADLINE_S,
            "admission_prior_tokens_per_s": 5000,
            # One client sends the whole burst: this app tests the deadline, not fair shares.
            "client_share": 1.0,
        },
    )
    fair = copy.deepcopy(guarded)
    fair.update(
        name="fair",
        route_prefix="/fair",
        runtime_env={"env_vars": {FAIR_KEYS_ENV: f"{KEY_A},{KEY_B}"}},
    )
    fair["args"].update(
        api_key_env=FAIR_KEYS_ENV,
        max_documents=FAIR_DOCUMENTS,
        max_body_bytes=1_000_000,
        max_request_tokens=FAIR_MAX_TOKENS,
    )
    fair["deployments"][0].update(
        max_ongoing_requests=64,
        max_queued_requests=64,
        user_config={
            "max_batch_size": 4,
            "batch_wait_timeout_s": 0.005,
            "max_batch_tokens": 65536,
            "admission_deadline_s": FAIR_DEADLINE_S,
            "admission_prior_tokens_per_s": 2000,
            "client_share": FAIR_SHARE,
            # The hard stop is twice the admission deadline, so a late answer is seen as late
            # (its latency measured) instead of being cut into a 504 at the deadline itself.
            "request_deadline_s": 2 * FAIR_DEADLINE_S,
        },
    )
    cancel = copy.deepcopy(fair)
    cancel.update(name="cancel", route_prefix="/cancel")
    cancel["args"].update(
        max_documents=BURST_DOCUMENTS,
        max_request_tokens=1_000_000,
        scorer={**cancel["args"].get("scorer", {}), "max_batch_tokens": CANCEL_FORWARD_TOKENS},
    )
    cancel["deployments"][0]["user_config"] = {
        "max_batch_size": 4,
        "batch_wait_timeout_s": 0.005,
        "admission_deadline_s": 60,
        "request_deadline_s": 110,
    }
    config["applications"] = [main, guarded, burst, fair, cancel]
    return config


@pytest.fixture(scope="module")
def checkpoint(tiny_qwen3_dir, tiny_scorer, tmp_path_factory) -> Path:
    """The tiny model as the trainer saves it: HF weights + tokenizer + ``acare.json``, with a
    fusion stored the way ``acare fit-fusion`` stores it."""
    folder = Path(shutil.copytree(tiny_qwen3_dir, tmp_path_factory.mktemp("ckpt") / "final"))
    (folder / ACARE_CONFIG_FILE).write_text(json.dumps(tiny_scorer.acare_config()))
    write_fusion(folder, FITTED, {"measure": "nDCG@10", "note": "test fixture"})
    return folder


@pytest.fixture(scope="module")
def scorer(checkpoint) -> Scorer:
    return Scorer.from_pretrained(str(checkpoint), device="cpu")


@pytest.fixture(scope="module")
def served(ray_local, checkpoint):
    from ray import serve

    config = make_config(checkpoint, free_port())
    deploy_serve_config(config)
    base = f"http://127.0.0.1:{config['http_options']['port']}"
    yield {"base": base, "config": config}
    serve.shutdown()


@pytest.fixture(scope="module")
def http(served):
    with httpx.Client(base_url=served["base"], timeout=60) as client:
        yield client


def expected(scorer: Scorer, context: AgentContext, documents, mode="auto") -> np.ndarray:
    return scorer.score(context, documents, mode).astype(np.float64)


def tokens_scored(scorer: Scorer, context: AgentContext, documents, mode="auto") -> int:
    """How many tokens the scorer really scores for this search (its ``stats.real_tokens``)."""
    before = scorer.stats.real_tokens
    scorer.score(context, documents, mode)
    return scorer.stats.real_tokens - before


def assert_ranked_like(indices: list[int], scores: np.ndarray, top_n: int | None = None):
    """``indices`` are the best ``top_n`` of ``scores``, best first (ties within 1e-5)."""
    assert len(indices) == (len(scores) if top_n is None else min(top_n, len(scores)))
    assert len(set(indices)) == len(indices)
    ranked = scores[indices]
    assert np.all(np.diff(ranked) <= 1e-5), ranked
    left_out = np.delete(scores, indices)
    if left_out.size:
        assert ranked.min() >= left_out.max() - 1e-5


def test_cohere_client_v2_with_context_scores_like_the_scorer(served, scorer):
    response = cohere_rerank(
        served["base"], "acare", DOCUMENTS, top_n=3, original_question=QUESTION, reasoning=REASONING
    )
    want = expected(scorer, FULL, DOCUMENTS)
    indices = [r.index for r in response.results]
    assert_ranked_like(indices, want, top_n=3)
    got = np.array([r.relevance_score for r in response.results])
    np.testing.assert_allclose(got, expit(want[indices]), atol=1e-5)
    assert response.meta.api_version.version == "2"
    assert response.meta.mode == "M3"
    assert response.meta.billed_units.search_units == 1
    assert response.meta.tokens.input_tokens == tokens_scored(scorer, FULL, DOCUMENTS)
    assert response.meta.tokens.output_tokens == 0


def test_cohere_client_v1_returns_documents_with_their_fields(served, scorer):
    co = cohere.Client(api_key="unused", base_url=served["base"])
    documents = [DOCUMENTS[0], {"text": DOCUMENTS[1], "id": "doc-1", "url": "https://x.test/1"}]
    response = co.rerank(
        query=QUERY,
        documents=documents,
        return_documents=True,
        request_options={"additional_body_parameters": {"original_question": QUESTION}},
    )
    want = expected(scorer, AgentContext(QUERY, question=QUESTION), DOCUMENTS[:2])
    assert_ranked_like([r.index for r in response.results], want)
    by_index = {r.index: r for r in response.results}
    assert by_index[0].document.text == DOCUMENTS[0]
    assert by_index[1].document.text == DOCUMENTS[1]
    assert by_index[1].document.id == "doc-1" and by_index[1].document.url == "https://x.test/1"
    for r in response.results:
        assert r.relevance_score == pytest.approx(expit(want[r.index]), abs=1e-5)
    assert response.meta.mode == "M2"
    assert response.meta.billed_units.search_units == 1
    assert response.meta.tokens.input_tokens == tokens_scored(
        scorer, AgentContext(QUERY, question=QUESTION), DOCUMENTS[:2]
    )


@pytest.mark.parametrize("path", ["/v1/rerank", "/v2/rerank"])
def test_cohere_shape_top_n_and_return_documents_semantics(http, scorer, path):
    body = {"query": QUERY, "documents": DOCUMENTS, "reasoning": REASONING}
    want = expected(scorer, AgentContext(QUERY, reasoning=REASONING), DOCUMENTS)

    full = http.post(path, json=body).json()
    assert_ranked_like([r["index"] for r in full["results"]], want)
    assert all("document" not in r for r in full["results"])

    top = http.post(path, json=body | {"top_n": 2, "return_documents": True}).json()
    assert [r["index"] for r in top["results"]] == [r["index"] for r in full["results"]][:2]
    assert [r["document"] for r in top["results"]] == [
        {"text": DOCUMENTS[r["index"]]} for r in top["results"]
    ]

    more = http.post(path, json=body | {"top_n": 50}).json()
    assert len(more["results"]) == len(DOCUMENTS)

    usage = tokens_scored(scorer, AgentContext(QUERY, reasoning=REASONING), DOCUMENTS)
    for payload in (full, top, more):
        assert payload["meta"]["billed_units"] == {"search_units": 1}
        assert payload["meta"]["tokens"] == {"input_tokens": usage, "output_tokens": 0}


def test_tei_rerank_scores_are_sigmoid_or_raw_log_odds(http, scorer):
    body = {"query": QUERY, "texts": DOCUMENTS, "original_question": QUESTION}
    want = expected(scorer, AgentContext(QUERY, question=QUESTION), DOCUMENTS)

    plain = http.post("/rerank", json=body)
    assert plain.status_code == 200
    assert int(plain.headers["x-acare-tokens"]) == tokens_scored(
        scorer, AgentContext(QUERY, question=QUESTION), DOCUMENTS
    )
    assert_ranked_like([r["index"] for r in plain.json()], want)
    for r in plain.json():
        assert r["score"] == pytest.approx(expit(want[r["index"]]), abs=1e-5)
        assert "text" not in r

    raw = http.post("/rerank", json=body | {"raw_scores": True, "return_text": True}).json()
    for r in raw:
        assert r["score"] == pytest.approx(want[r["index"]], abs=1e-4)
        assert r["text"] == DOCUMENTS[r["index"]]


@pytest.mark.parametrize("mode", ["M0", "M1", "M2", "M3", "question", "auto"])
def test_each_mode_scores_like_the_scorer_in_that_mode(http, scorer, mode):
    body = {
        "query": QUERY,
        "texts": DOCUMENTS,
        "original_question": QUESTION,
        "reasoning": REASONING,
        "mode": mode,
        "raw_scores": True,
    }
    response = http.post("/rerank", json=body)
    resolved = FULL.resolve_mode(mode)
    assert response.headers["x-acare-mode"] == resolved.value
    got = {r["index"]: r["score"] for r in response.json()}
    want = expected(scorer, FULL, DOCUMENTS, resolved)
    np.testing.assert_allclose([got[i] for i in range(len(DOCUMENTS))], want, atol=1e-4)


def test_max_tokens_per_doc_truncates_and_says_so(http, scorer):
    long_doc = "Ostrava is the capital of Velmoria and home to many museums and parks " * 4
    body = {"query": QUERY, "documents": ["Paris.", long_doc], "max_tokens_per_doc": 6}
    response = http.post("/v2/rerank", json=body)
    assert response.status_code == 200
    result = response.json()
    assert result["meta"]["warnings"] == ["truncated to 6 tokens: documents[1]"]
    assert response.headers["x-acare-truncated"] == "1"

    tokenizer = scorer.backend.encoder.tokenizer
    first_six = tokenizer.decode(
        tokenizer(" " + long_doc, add_special_tokens=False)["input_ids"][:6]
    )
    want = expected(scorer, AgentContext(QUERY), ["Paris.", first_six.strip()])
    got = {r["index"]: r["relevance_score"] for r in result["results"]}
    np.testing.assert_allclose([got[0], got[1]], expit(want), atol=1e-5)
    untruncated = expected(scorer, AgentContext(QUERY), [long_doc])[0]
    assert abs(untruncated - want[1]) > 1e-4, "the cut must change what the model reads"


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/rerank", {"query": QUERY, "documents": []}),
        ("/v2/rerank", {"query": QUERY, "documents": [], "original_question": QUESTION}),
    ],
)
def test_empty_documents_answer_200_with_no_results(http, path, body):
    response = http.post(path, json=body)
    assert response.status_code == 200
    payload = response.json()
    assert (payload == []) if path == "/rerank" else (payload["results"] == [])


def test_tei_client_health_info_and_rerank_work_unchanged(served, scorer):
    """The real `tei-client` package (HttpClient: health and info read /info, rerank checks
    the model type first) against the live app; TEI's scores are sigmoid(log-odds)."""
    from tei_client import HttpClient

    client = HttpClient(served["base"], timeout=60)
    assert client.health()
    info = client.info()
    assert info.server_model_type.value == "reranker"
    assert info.max_input_length == scorer.backend.encoder.config.max_length
    assert info.max_client_batch_size == MAX_DOCUMENTS
    ranks = client.rerank(QUERY, DOCUMENTS, return_text=True).ranks
    want = expected(scorer, AgentContext(QUERY), DOCUMENTS)
    assert [r.index for r in ranks] == list(np.argsort(-want, kind="stable"))
    np.testing.assert_allclose([r.score for r in ranks], expit(np.sort(want)[::-1]), atol=1e-5)
    assert ranks[0].text == DOCUMENTS[ranks[0].index]
    raw = client.rerank(QUERY, DOCUMENTS, raw_scores=True).ranks
    np.testing.assert_allclose([r.score for r in raw], np.sort(want)[::-1], atol=1e-4)


def test_tei_rerank_answers_as_tei_does(http, scorer):
    """TEI's own behaviour (text-embeddings-inference router/src/http/server.rs `rerank`, and
    its ErrorResponse): empty texts is a 400 `{error, error_type: empty}`; `model` and `top_n`
    are ignored; booleans are strict; errors carry TEI's keys; usage and time in its headers."""
    empty = http.post("/rerank", json={"query": QUERY, "texts": []})
    assert empty.status_code == 400
    assert empty.json()["error"] == "`texts` cannot be empty"
    assert empty.json()["error_type"] == "empty"
    body = {"query": QUERY, "texts": DOCUMENTS}
    plain = http.post("/rerank", json=body)
    extras = http.post("/rerank", json=body | {"model": "BAAI/bge-reranker-base", "top_n": 1})
    assert extras.status_code == 200 and extras.json() == plain.json()
    assert len(extras.json()) == len(DOCUMENTS)
    assert plain.headers["x-compute-tokens"] == plain.headers["x-acare-tokens"]
    assert int(plain.headers["x-compute-tokens"]) == tokens_scored(
        scorer, AgentContext(QUERY), DOCUMENTS
    )
    assert int(plain.headers["x-compute-characters"]) == len(QUERY) + sum(map(len, DOCUMENTS))
    assert int(plain.headers["x-total-time"]) >= 0
    strict = http.post("/rerank", json=body | {"raw_scores": "yes"})
    assert strict.status_code == 422
    assert strict.json()["error_type"] == "validation"
    assert strict.json()["error"].startswith("raw_scores")
    cohere = http.post("/v2/rerank", json={"query": QUERY, "documents": ["a"], "top_n": 0})
    assert "error" not in cohere.json()  # TEI's keys only on TEI routes


def _score_response_shape(payload: dict, pairs: int) -> list[float]:
    """vLLM's ScoreResponse fields (vllm/entrypoints/pooling/score/protocol.py)."""
    assert payload["id"] and payload["object"] == "list" and isinstance(payload["created"], int)
    assert payload["model"] and payload["usage"]["prompt_tokens"] > 0
    assert payload["usage"]["total_tokens"] == payload["usage"]["prompt_tokens"]
    assert [d["index"] for d in payload["data"]] == list(range(pairs))
    assert {d["object"] for d in payload["data"]} == {"score"}
    return [d["score"] for d in payload["data"]]


@pytest.mark.parametrize("path", ["/score", "/v1/score"])
def test_vllm_score_api_one_query_many_texts_pairs_and_activation(http, scorer, path):
    """vLLM's own score tests re-expressed (tests/entrypoints/pooling/score/
    test_online_score.py: text_1 str + text_2 list, list + list as pairs, str + str,
    use_activation), with our scorer as the reference instead of Hugging Face's."""
    q2 = "capital of Velmoria"
    one = http.post(path, json={"model": "any", "text_1": QUERY, "text_2": DOCUMENTS[:2]})
    assert one.status_code == 200, one.text
    want = expected(scorer, AgentContext(QUERY), DOCUMENTS[:2])
    np.testing.assert_allclose(_score_response_shape(one.json(), 2), expit(want), atol=1e-5)
    pairs = http.post(path, json={"text_1": [QUERY, q2], "text_2": DOCUMENTS[:2]}).json()
    want_pairs = [
        expected(scorer, AgentContext(QUERY), DOCUMENTS[:1])[0],
        expected(scorer, AgentContext(q2), DOCUMENTS[1:2])[0],
    ]
    np.testing.assert_allclose(_score_response_shape(pairs, 2), expit(want_pairs), atol=1e-5)
    single = http.post(path, json={"queries": QUERY, "documents": DOCUMENTS[0]}).json()
    np.testing.assert_allclose(_score_response_shape(single, 1), expit(want[:1]), atol=1e-5)
    raw = http.post(path, json={"data_1": QUERY, "data_2": DOCUMENTS[:2], "use_activation": False})
    np.testing.assert_allclose(_score_response_shape(raw.json(), 2), want, atol=1e-4)
    on = http.post(path, json={"text_1": QUERY, "text_2": DOCUMENTS[:2], "use_activation": True})
    assert [d["score"] for d in on.json()["data"]] == [d["score"] for d in one.json()["data"]]
    context = {"original_question": QUESTION, "mode": "M2"}
    with_context = http.post(path, json={"text_1": QUERY, "text_2": DOCUMENTS[:2], **context})
    want_m2 = expected(scorer, AgentContext(QUERY, question=QUESTION), DOCUMENTS[:2], "M2")
    np.testing.assert_allclose(
        _score_response_shape(with_context.json(), 2), expit(want_m2), atol=1e-5
    )


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"text_1": ["a", "b", "c"], "text_2": ["x", "y"]}, "text_1 has 3 items and text_2 2"),
        ({"text_1": "a"}, "give one pair of fields"),
        ({"text_1": "a", "documents": ["x"]}, "give one pair of fields"),
        ({"text_1": "a", "text_2": []}, "text_2 is empty"),
        ({"text_1": "a", "text_2": ["x", " "]}, "text_2[1] is empty"),
        ({"text_1": "a", "text_2": "x", "truncate_prompt_tokens": 10}, "truncate_prompt_tokens"),
    ],
)
def test_vllm_score_mistakes_get_a_422_that_says_what_to_do(http, body, field):
    response = http.post("/v1/score", json=body)
    assert response.status_code == 422
    assert field in response.json()["message"]


def test_v1_rerank_speaks_vllm_and_jina_too(http, scorer):
    """vLLM's rerank tests re-expressed (tests/entrypoints/pooling/score/test_online_rerank.py:
    top_n, use_activation) plus its response fields (top-level model and usage) and its
    default top_n 0 = all; the cohere SDK v1 test above checks these leave Cohere working."""
    body = {"model": "m", "query": QUERY, "documents": DOCUMENTS}
    default = http.post("/v1/rerank", json=body | {"top_n": 0}).json()
    assert len(default["results"]) == len(DOCUMENTS)
    assert default["model"] and default["usage"]["prompt_tokens"] == tokens_scored(
        scorer, AgentContext(QUERY), DOCUMENTS
    )
    assert default["usage"]["total_tokens"] == default["usage"]["prompt_tokens"]
    top = http.post("/v1/rerank", json=body | {"top_n": 2}).json()
    assert [r["index"] for r in top["results"]] == [r["index"] for r in default["results"][:2]]
    raw = http.post("/v1/rerank", json=body | {"use_activation": False}).json()
    want = expected(scorer, AgentContext(QUERY), DOCUMENTS)
    got = {r["index"]: r["relevance_score"] for r in raw["results"]}
    np.testing.assert_allclose([got[i] for i in range(len(DOCUMENTS))], want, atol=1e-4)
    refused = http.post("/v1/rerank", json=body | {"truncate_prompt_tokens": 100})
    assert refused.status_code == 422 and "max_tokens_per_doc" in refused.json()["message"]
    v2 = http.post("/v2/rerank", json={"query": QUERY, "documents": DOCUMENTS}).json()
    assert "usage" not in v2 and "model" not in v2  # Cohere v2's shape stays its own


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


def burst_documents(seed: int) -> list[str]:
    """``BURST_DOCUMENTS`` distinct paragraphs of about 60-90 words."""
    rng = random.Random(seed)
    words = [
        "the",
        "capital",
        "of",
        "Velmoria",
        "Ostrava",
        "counts",
        "about",
        "million",
        "people",
        "and",
        "its",
        "river",
        "port",
        "museum",
        "bridge",
        "census",
        "district",
        "population",
        "grew",
        "after",
        "the",
        "war",
        "while",
        "Quell",
        "in",
        "Zandor",
        "stayed",
        "small",
    ]
    return [
        " ".join(rng.choice(words) for _ in range(rng.randint(60, 90))) + "."
        for _ in range(BURST_DOCUMENTS)
    ]


def test_a_burst_gets_answers_or_fast_503s_never_a_timeout(served, scorer):
    """Issue 12.3: a burst of 100-document requests against one replica with a 2 s admission
    deadline. Every request gets 200 or a quick 503 with Retry-After; none waits for a timeout."""
    base = served["base"] + "/burst"
    with httpx.Client(base_url=base, timeout=60) as client:
        for i in range(2):  # warm up and measure the replica's throughput
            warm = {"query": f"warm {i}", "texts": burst_documents(1000 + i)}
            assert client.post("/rerank", json=warm).status_code == 200
        before = client.get("/v1/status").json()["admission"]
    assert before["measured"] and before["queued_tokens"] == 0, before

    bodies = [
        {
            "query": f"{QUERY} {i}",
            "texts": burst_documents(i),
            "original_question": QUESTION,
            "raw_scores": True,
        }
        for i in range(BURST_REQUESTS)
    ]
    start = threading.Barrier(BURST_REQUESTS)

    def send(body):
        with httpx.Client(base_url=base, timeout=60) as client:
            start.wait()
            sent = time.monotonic()
            try:
                response = client.post("/rerank", json=body)
            except httpx.HTTPError as err:  # a client timeout would land here
                return err, time.monotonic() - sent
            return response, time.monotonic() - sent

    began = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(BURST_REQUESTS) as pool:
        outcomes = list(pool.map(send, bodies))
    elapsed = time.monotonic() - began

    errors = [r for r, _ in outcomes if not isinstance(r, httpx.Response)]
    assert not errors, errors
    statuses = [r.status_code for r, _ in outcomes]
    assert set(statuses) <= {200, 503}, statuses
    assert 200 in statuses and 503 in statuses, statuses
    refused = [(r, s) for r, s in outcomes if r.status_code == 503]
    answered = [(b, r, s) for b, (r, s) in zip(bodies, outcomes) if r.status_code == 200]
    refusal_s = sorted(s for _, s in refused)
    print(
        f"burst of {BURST_REQUESTS} x {BURST_DOCUMENTS} documents in {elapsed:.1f} s: "
        f"{len(answered)} x 200 (slowest {max(s for *_, s in answered):.2f} s), "
        f"{len(refused)} x 503 (median {refusal_s[len(refusal_s) // 2]:.3f} s, "
        f"slowest {refusal_s[-1]:.3f} s); throughput before {before['tokens_per_s']} tokens/s"
    )
    for response, _ in refused:
        assert response.json()["message"].startswith("overloaded"), response.text
        assert int(response.headers["retry-after"]) >= 1
    # Refused at once, never after queueing until the deadline. The bounds are loose because
    # the proxy alone takes 0.1-0.3 s per request in a burst on a loaded 2-core machine.
    assert refusal_s[-1] < 0.75 * BURST_DEADLINE_S, refusal_s
    assert refusal_s[len(refusal_s) // 2] < 0.5 * BURST_DEADLINE_S, refusal_s
    for body, response, _ in answered:
        got = {r["index"]: r["score"] for r in response.json()}
        context = AgentContext(body["query"], question=QUESTION)
        want = expected(scorer, context, body["texts"])
        np.testing.assert_allclose([got[i] for i in range(BURST_DOCUMENTS)], want, atol=1e-4)
        assert int(response.headers["x-acare-tokens"]) == tokens_scored(
            scorer, context, body["texts"]
        )
    after = httpx.get(base + "/v1/status").json()["admission"]
    assert after["queued_tokens"] == 0 and after["queued_requests"] == 0, after
    assert after["refused"] - before["refused"] == len(refused)
    assert after["admitted"] - before["admitted"] == len(answered)


def test_batching_retuned_at_runtime_groups_concurrent_requests(served, http, scorer):
    config = copy.deepcopy(served["config"])
    deployment = config["applications"][0]["deployments"][0]
    before = http.get("/v1/status").json()
    original = deployment["user_config"]
    deployment["user_config"] = {
        "max_batch_size": 8,
        "batch_wait_timeout_s": 1.0,
        "max_batch_tokens": 1_000_000,
    }
    try:
        deploy_serve_config(config)
        health = http.get("/v1/status").json()
        assert health["batching"] == deployment["user_config"]
        assert health["replica"] == before["replica"], "user_config must not restart the replica"

        queries = [f"{QUERY} {i}" for i in range(6)]

        def send(query):
            return http.post(
                "/rerank", json={"query": query, "texts": DOCUMENTS, "raw_scores": True}
            )

        with concurrent.futures.ThreadPoolExecutor(len(queries)) as pool:
            responses = list(pool.map(send, queries))
        sizes = [int(r.headers["x-acare-batch-requests"]) for r in responses]
        assert max(sizes) > 1, sizes
        for query, response in zip(queries, responses):
            got = {r["index"]: r["score"] for r in response.json()}
            want = expected(scorer, AgentContext(query), DOCUMENTS)
            np.testing.assert_allclose([got[i] for i in range(len(DOCUMENTS))], want, atol=1e-4)
        assert http.get("/v1/status").json()["batches"]["largest"] == max(sizes)
    finally:
        deployment["user_config"] = original
        deploy_serve_config(config)


def test_the_app_serves_a_trainer_checkpoint_directory(http, checkpoint, scorer):
    assert (checkpoint / ACARE_CONFIG_FILE).is_file()
    (card,) = http.get("/v1/models").json()["data"]
    name = short_model_name(str(checkpoint))
    assert card["id"] == name == f"{checkpoint.parent.name}/final" and "source" not in card
    assert http.get("/v1/status").json()["sources"] == {name: str(checkpoint)}
    assert card["backend"] == "causal_lm"
    response = http.post("/rerank", json={"query": QUERY, "texts": DOCUMENTS, "raw_scores": True})
    got = {r["index"]: r["score"] for r in response.json()}
    want = expected(scorer, AgentContext(QUERY), DOCUMENTS, Mode.M0)
    np.testing.assert_allclose([got[i] for i in range(len(DOCUMENTS))], want, atol=1e-4)


def test_models_list_and_openapi_docs_describe_the_api(http, checkpoint):
    models = http.get("/v1/models").json()
    assert models["models"][0]["name"] == short_model_name(str(checkpoint))
    assert models["models"][0]["endpoints"] == ["rerank"]
    spec = http.get("/openapi.json").json()
    assert {"/v1/rerank", "/v2/rerank", "/rerank", "/health", "/v1/models"} <= set(spec["paths"])
    for name in ("CohereRerankRequest", "TeiRerankRequest"):
        fields = spec["components"]["schemas"][name]["properties"]
        assert {"original_question", "reasoning", "mode"} <= set(fields)
    docs = http.get("/docs")
    assert docs.status_code == 200 and "swagger" in docs.text.lower()


def doc_blocks(language: str) -> list[str]:
    text = (REPO / "docs" / "online.md").read_text()
    return re.findall(rf"```{language}\n(.*?)```", text, flags=re.S)


def test_the_documented_python_example_runs(served, scorer, capsys):
    """The example prints the ``top_n`` best documents, best first, each with the relevance the
    model gives it under the full context of the request (it used to be checked for printing
    two lines only, whatever they held)."""
    (code,) = doc_blocks("python")
    namespace: dict = {}
    exec(
        compile(code.replace("http://localhost:8000", served["base"]), "online.md", "exec"),
        namespace,
    )
    call = next(
        node
        for node in ast.walk(ast.parse(code))
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "rerank"
    )
    args = {k.arg: k.value for k in call.keywords}
    extra = ast.literal_eval(args["request_options"])["additional_body_parameters"]
    documents, top_n = namespace["documents"], ast.literal_eval(args["top_n"])
    context = AgentContext(
        ast.literal_eval(args["query"]),
        question=extra["original_question"],
        reasoning=extra["reasoning"],
    )
    want = expected(scorer, context, documents, Mode.M3)
    best = np.argsort(-want, kind="stable")[:top_n]
    printed = [line.split("  ", 1) for line in capsys.readouterr().out.splitlines()]
    assert [text for _, text in printed] == [documents[i] for i in best]
    np.testing.assert_allclose([float(score) for score, _ in printed], expit(want[best]), atol=6e-4)


def test_the_documented_curl_requests_succeed(http):
    requests = [b for b in doc_blocks("bash") if b.startswith("curl")]
    assert len(requests) == 2
    for block in requests:
        path = re.search(r"http://localhost:8000(\S+)", block).group(1)
        payload = json.loads(re.search(r"-d '(.*)'", block, flags=re.S).group(1))
        response = http.post(path, json=payload)
        assert response.status_code == 200, response.text
        assert response.headers["x-acare-mode"] in ("M2", "M3")


def test_the_served_checkpoints_fitted_fusion_is_the_default(http, checkpoint):
    """Issue 20 part 2e: the fusion stored with the checkpoint (read once at replica start) is
    what a request with a first stage and no ``fusion`` gets; the served order equals fuse() of
    the served log-odds by hand, and ``fusion: none`` turns it off for one request."""
    assert read_fusion(checkpoint) == FITTED
    first_stage = [0.5, 4.0, 2.5, None, 9.0, 1.0]
    body = {"query": QUERY, "texts": DOCUMENTS, "raw_scores": True}
    tei = http.post("/rerank", json=body | {"first_stage_scores": first_stage})
    assert tei.status_code == 200, tei.text
    assert tei.headers["x-acare-fusion"] == FITTED.label
    answer = tei.json()
    scores = np.empty(len(DOCUMENTS))
    for r in answer:
        scores[r["index"]] = r["score"]
    fused = fuse(scores, FITTED, first_stage)
    assert [r["index"] for r in answer] == [int(i) for i in fused.order]
    assert [r["fused_score"] for r in answer] == [float(fused.values[i]) for i in fused.order]
    assert [r["first_stage_rank"] for r in answer] == [
        int(fused.first_stage_rank[i]) for i in fused.order
    ]
    cohere_body = {"query": QUERY, "documents": DOCUMENTS, "first_stage_scores": first_stage}
    v2 = http.post("/v2/rerank", json=cohere_body).json()
    assert v2["meta"]["fusion"] == FITTED.label
    assert [r["index"] for r in v2["results"]] == [int(i) for i in fused.order]
    off = http.post("/v2/rerank", json=cohere_body | {"fusion": "none"}).json()
    assert off["meta"]["fusion"] == "none"
    assert all("fused_score" not in r for r in off["results"])
    # Without a first stage nothing is fused, fitted setting or not.
    plain = http.post("/v2/rerank", json={"query": QUERY, "documents": DOCUMENTS})
    assert "fusion" not in plain.json()["meta"] and "x-acare-fusion" not in plain.headers
    assert all(set(r) == {"index", "relevance_score"} for r in plain.json()["results"])


def fair_request(
    scorer: Scorer, documents: int = FAIR_DOCUMENTS, extra_bytes: int = 0, seed: int = 0
) -> dict:
    """A maximal request for the ``fair`` app: ``documents`` digit strings (one token per byte,
    the most work per byte the token bound allows) as long as ``max_request_tokens`` allows,
    plus ``extra_bytes`` on the last document (1: one byte over the cap)."""
    from acare_ray.online.service import Limits, RerankInput, RerankService

    service = RerankService(scorer, "fair", Limits(max_request_tokens=FAIR_MAX_TOKENS))
    rng = random.Random(seed)

    def texts(length: int) -> list[str]:
        return ["".join(rng.choice("0123456789") for _ in range(length)) for _ in range(documents)]

    def bound(length: int) -> int:
        return service.token_bound(RerankInput(QUERY, ["0" * length] * documents), Mode.M0)

    length = 1
    while bound(length + 1) <= FAIR_MAX_TOKENS:
        length += 1
    docs = texts(length)
    for i in range(FAIR_MAX_TOKENS - bound(length)):  # fewer than `documents`: one byte each
        docs[i] += "7"
    docs[-1] += "7" * extra_bytes
    exact = service.token_bound(RerankInput(QUERY, docs), Mode.M0)
    assert exact == FAIR_MAX_TOKENS + extra_bytes, exact
    return {"query": QUERY, "texts": docs}


def keyed(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (the value ``q`` of the samples are at or below)."""
    ranked = sorted(values)
    return ranked[max(0, math.ceil(q * len(ranked)) - 1)]


def test_a_client_flooding_maximal_requests_cannot_push_another_past_its_deadline(served, scorer):
    """Issue 21 (done when: load test). Client A (one API key) floods the ``fair`` replica with
    maximal requests from many threads, each sending its next one as soon as the last is
    answered (or once ``Retry-After`` has passed after a refusal); client B (another key) sends ordinary requests one after another meanwhile.

    What the fair share guarantees, and what is asserted: A holds at most ``client_share`` of
    the admission deadline's work (beyond it 429), so B, holding nothing when it sends, is
    never rate limited and finds at most A's share (and one of A's requests) ahead of it. So
    every B request is answered 200 (after retrying a 503 with ``Retry-After``, should one
    come), B's p95 latency stays under the admission deadline the app is configured with
    (without the share, A keeps the queue at the deadline and B waits past it), A gets 429s
    while A is not starved either, and the replica's queue drains afterwards."""
    base = served["base"] + "/fair"
    maximal = fair_request(scorer)
    with httpx.Client(base_url=base, timeout=60) as client:
        # Maximal: one byte or one document more is refused (413) by the same app.
        over = fair_request(scorer, extra_bytes=1)
        assert client.post("/rerank", json=over, headers=keyed(KEY_A)).status_code == 413
        more = fair_request(scorer, documents=FAIR_DOCUMENTS + 1)
        assert client.post("/rerank", json=more, headers=keyed(KEY_A)).status_code == 413
        assert client.post("/rerank", json=maximal, headers=keyed(KEY_A)).status_code == 200
        b_body = {"query": QUERY, "texts": DOCUMENTS[:4], "raw_scores": True}
        alone = []
        for _ in range(3):  # B's latency with the replica to itself, for the report
            sent = time.monotonic()
            assert client.post("/rerank", json=b_body, headers=keyed(KEY_B)).status_code == 200
            alone.append(time.monotonic() - sent)
        before = client.get("/v1/status", headers=keyed(KEY_B)).json()
    assert before["admission"]["measured"] and before["admission"]["queued_tokens"] == 0

    stop = threading.Event()
    a_outcomes: list[tuple[int, float, str | None]] = []

    def flood(seed: int) -> None:
        body = fair_request(scorer, seed=seed)
        with httpx.Client(base_url=base, timeout=60) as client:
            while not stop.is_set():
                sent = time.monotonic()
                response = client.post("/rerank", json=body, headers=keyed(KEY_A))
                a_outcomes.append(
                    (
                        response.status_code,
                        time.monotonic() - sent,
                        response.headers.get("retry-after"),
                    )
                )
                if response.status_code != 200:  # refused: back when Retry-After says
                    stop.wait(int(response.headers.get("retry-after", "1")))

    flooders = [threading.Thread(target=flood, args=(seed,)) for seed in range(FAIR_FLOODERS)]
    for thread in flooders:
        thread.start()
    b_latencies: list[float] = []
    b_refusals: list[tuple[int, str | None]] = []
    try:
        with httpx.Client(base_url=base, timeout=60) as client:
            # B starts once A holds all it may: A has been refused at least once.
            waited = time.monotonic()
            while all(status == 200 for status, *_ in a_outcomes):
                assert time.monotonic() - waited < 60, a_outcomes[-5:]
                time.sleep(0.05)
            for _ in range(FAIR_B_REQUESTS):
                for _attempt in range(10):
                    sent = time.monotonic()
                    response = client.post("/rerank", json=b_body, headers=keyed(KEY_B))
                    if response.status_code == 200:
                        b_latencies.append(time.monotonic() - sent)
                        break
                    b_refusals.append((response.status_code, response.headers.get("retry-after")))
                    assert response.status_code == 503, response.text
                    time.sleep(int(response.headers["retry-after"]))
                else:
                    pytest.fail(f"B was never answered: {b_refusals}")
    finally:
        stop.set()
        for thread in flooders:
            thread.join()
    after = httpx.get(base + "/v1/status", headers=keyed(KEY_B)).json()["admission"]

    a_statuses = [status for status, *_ in a_outcomes]
    a_answered = sorted(s for status, s, _ in a_outcomes if status == 200)
    p95 = percentile(b_latencies, 0.95)
    print(
        f"fair share {FAIR_SHARE} of a {FAIR_DEADLINE_S:g} s deadline; replica "
        f"{after['tokens_per_s']} tokens/s: B alone {min(alone):.3f}-{max(alone):.3f} s; "
        f"while A floods: B {len(b_latencies)} x 200, p50 {percentile(b_latencies, 0.5):.3f} s, "
        f"p95 {p95:.3f} s, max {max(b_latencies):.3f} s, refusals {b_refusals}; "
        f"A {a_statuses.count(200)} x 200 (p50 {percentile(a_answered, 0.5):.3f} s), "
        f"{a_statuses.count(429)} x 429, {a_statuses.count(503)} x 503"
    )
    assert len(b_latencies) == FAIR_B_REQUESTS
    assert p95 < FAIR_DEADLINE_S, sorted(b_latencies)
    # B never holds work when it sends, so its share can never refuse it.
    assert all(status == 503 for status, _ in b_refusals), b_refusals
    assert set(a_statuses) <= {200, 429, 503}, a_statuses
    assert a_statuses.count(429) > 0 and a_statuses.count(200) > 0, a_statuses
    for status, _, retry_after in a_outcomes:
        if status != 200:
            assert int(retry_after) >= 1
    assert after["rate_limited"] - before["admission"]["rate_limited"] == a_statuses.count(429)
    assert after["queued_tokens"] == 0 and after["queued_requests"] == 0, after
    assert after["clients_queued"] == 0, after


def post_then_disconnect(base: str, path: str, body: dict, headers: dict[str, str]):
    """Send a request on a raw connection and return the socket: closing it is the client
    going away before the answer."""
    url = httpx.URL(base + path)
    payload = json.dumps(body).encode()
    lines = [
        f"POST {url.raw_path.decode()} HTTP/1.1",
        f"host: {url.host}:{url.port}",
        "content-type: application/json",
        f"content-length: {len(payload)}",
        *(f"{k}: {v}" for k, v in headers.items()),
        "",
        "",
    ]
    sock = socket.create_connection((url.host, url.port))
    sock.sendall("\r\n".join(lines).encode() + payload)
    return sock


def test_a_disconnected_request_frees_its_replica_within_a_forward_pass(served, scorer):
    """Issue 21 (done when: cancellation). A client sends a large request to the ``cancel``
    app (a forward pass holds one of its documents, so the request takes a hundred) and closes its
    connection early. The replica stops the work between forward passes: ``/v1/status``
    counts a cancelled batch, and the admission queue (tokens, requests, the client's share)
    is empty again long before the request would have finished; a small request sent next is
    answered before the rest of the large one could have been scored."""
    base = served["base"] + "/cancel"
    rng = random.Random(7)
    digits = ["".join(rng.choice("0123456789") for _ in range(CANCEL_DOCUMENT_BYTES))]
    large = {
        "query": QUERY,
        "texts": [d[i:] + d[:i] for d in digits for i in range(CANCEL_DOCUMENTS)],
    }
    small = {"query": QUERY, "texts": DOCUMENTS[:2]}
    status = keyed(KEY_B)
    with httpx.Client(base_url=base, timeout=120, headers=keyed(KEY_A)) as client:
        small_s = []
        for _ in range(3):
            sent = time.monotonic()
            assert client.post("/rerank", json=small).status_code == 200
            small_s.append(time.monotonic() - sent)
        sent = time.monotonic()
        assert client.post("/rerank", json=large).status_code == 200
        full_s = time.monotonic() - sent
        before = client.get("/v1/status", headers=status).json()
    # A document is 800 tokens (one digit each), more than a forward pass holds: one pass each.
    passes = CANCEL_DOCUMENTS

    sent = time.monotonic()
    sock = post_then_disconnect(served["base"], "/cancel/rerank", large, keyed(KEY_A))
    try:
        while (
            httpx.get(base + "/v1/status", headers=status).json()["admission"]["queued_requests"]
            == 0
        ):
            assert time.monotonic() - sent < full_s, "the large request was never admitted"
            time.sleep(0.02)
        time.sleep(full_s / 5)  # well into its forward passes
    finally:
        sock.close()
    closed = time.monotonic()
    remaining_s = full_s - (closed - sent)
    while True:
        now = httpx.get(base + "/v1/status", headers=status).json()
        if now["batches"]["cancelled"] > before["batches"]["cancelled"]:
            break
        assert time.monotonic() - closed < 2 * full_s, now
        time.sleep(0.02)
    freed_s = time.monotonic() - closed
    with httpx.Client(base_url=base, timeout=120, headers=keyed(KEY_A)) as client:
        asked = time.monotonic()
        assert client.post("/rerank", json=small).status_code == 200
        after_s = time.monotonic() - asked
    print(
        f"cancel: large request {full_s:.2f} s (>= {passes} forward passes, "
        f"{full_s / passes:.3f} s each), small request {min(small_s):.3f} s; closed after "
        f"{closed - sent:.2f} s, replica free {freed_s:.3f} s later "
        f"({freed_s / (full_s / passes):.1f} passes), small request then {after_s:.3f} s; "
        f"the large one had {remaining_s:.2f} s of work left"
    )
    assert now["batches"]["cancelled"] == before["batches"]["cancelled"] + 1, now
    admission = now["admission"]
    assert admission["queued_tokens"] == 0 and admission["queued_requests"] == 0, admission
    assert admission["clients_queued"] == 0, admission
    assert freed_s < remaining_s / 2, (freed_s, remaining_s)
    assert freed_s + after_s < remaining_s, (freed_s, after_s, remaining_s)
