"""The Serve app over real HTTP, protocol by protocol: the Cohere SDK (v1, v2), TEI and its
client, the vLLM score API, Jina, each mode, usage, truncation, the documented examples, the
checkpoint's fitted fusion and model listing (the ``main`` app)."""

from __future__ import annotations

import ast
import json
import re

import cohere
import numpy as np
import pytest
from online_support import cohere_rerank
from scipy.special import expit
from scoring_support import QUERY, QUESTION, REASONING
from serve_support import (
    DOCUMENTS,
    FITTED,
    FULL,
    MAX_DOCUMENTS,
    REPO,
    assert_ranked_like,
    expected,
    tokens_scored,
)

from acare_ray.online.models import short_model_name
from acare_ray.ranking.checkpoint_settings import read_fusion
from acare_ray.ranking.fusion import fuse
from acare_ray.scoring import ACARE_CONFIG_FILE, AgentContext, Mode

pytestmark = pytest.mark.slow
SERVE_APPS = ("main",)


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
