"""The peers' own client packages against a live app, unchanged (issue 34, "Done when").

One keyed application of ``serve_configs/local.yaml`` serving the tiny random Qwen3 is deployed
for the module; every client below is the real package, pointed at it by URL and key only:

- ``rerankers``: ``APIRanker.rank`` with the ``text-embeddings-inference`` provider (our
  ``/rerank``), and the ``cohere`` and ``jina`` providers (our ``/v1/rerank``);
- ``langchain-cohere``: ``CohereRerank(base_url=...)`` (``cohere.ClientV2``, our ``/v2/rerank``);
- LlamaIndex: ``llama-index-postprocessor-cohere-rerank``'s ``CohereRerank`` and
  ``llama-index-postprocessor-tei-rerank``'s ``TextEmbeddingInference``;
- the ``cohere`` SDK, ``Client`` (v1) and ``ClientV2`` (v2), here with a key (the unkeyed app of
  tests/online/test_serve_protocols.py checks their fields, documents and usage).

Each test compares what the client returns (order, indices, scores, counts, the objects it
builds) with a direct HTTP call to the same route, so a client that dropped, reordered or
misread a field fails. The tei-client package is tested in tests/online/test_serve_protocols.py.
"""

from __future__ import annotations

import pytest
from online_support import local_serve_config
from scoring_support import CAPITAL_DOCUMENTS, QUERY

from acare_ray.testing import deploy_serve_config, free_port

pytestmark = pytest.mark.slow

API_KEY_ENV = "ACARE_TEST_PEER_KEY"
API_KEY = "peer-clients-test-key"
DOCUMENTS = [
    *CAPITAL_DOCUMENTS,
    "Population statistics for capitals in Europe vary widely.",
    "Velmoria is a small country.",
]
# pyproject's dev extra: langchain-cohere and the LlamaIndex postprocessors need a newer pydantic
# and cohere than the floor (make test-floor), whose run skips their tests.
DEV_ONLY = "in the dev extra, not test: needs a newer pydantic and cohere than the floor"


@pytest.fixture(scope="module")
def served(ray_local, tiny_qwen3_dir):
    """The keyed app; yields its base URL, served model name, and an httpx client with the key."""
    import httpx
    from ray import serve

    config, app = local_serve_config(tiny_qwen3_dir, free_port(), "peers")
    app.update(runtime_env={"env_vars": {API_KEY_ENV: API_KEY}})
    app["args"].update(api_key_env=API_KEY_ENV, allow_unauthenticated=False)
    deploy_serve_config(config)
    base = f"http://127.0.0.1:{config['http_options']['port']}"
    headers = {"Authorization": f"Bearer {API_KEY}"}
    with httpx.Client(base_url=base, headers=headers, timeout=60) as http:
        (model,) = [m["id"] for m in http.get("/v1/models").json()["data"]]
        yield {"base": base, "model": model, "http": http}
    serve.shutdown()


def direct(served, path: str, documents=DOCUMENTS, query=QUERY) -> list[tuple[int, float]]:
    """``(index, score)`` best first, from a plain HTTP call to ``path`` with every document."""
    if path == "/rerank":
        response = served["http"].post(path, json={"query": query, "texts": documents})
        assert response.status_code == 200, response.text
        return [(r["index"], r["score"]) for r in response.json()]
    response = served["http"].post(path, json={"query": query, "documents": documents})
    assert response.status_code == 200, response.text
    return [(r["index"], r["relevance_score"]) for r in response.json()["results"]]


def assert_same_ranking(got: list[tuple[int, float]], want: list[tuple[int, float]]):
    """The client's ``(index, score)`` list is the direct call's, in its order."""
    assert [i for i, _ in got] == [i for i, _ in want]
    assert [s for _, s in got] == pytest.approx([s for _, s in want], abs=1e-6)


def test_the_direct_ranking_is_not_degenerate(served):
    """The comparisons below only mean something when the scores tell the documents apart."""
    for path in ("/rerank", "/v1/rerank", "/v2/rerank"):
        ranking = direct(served, path)
        assert sorted(i for i, _ in ranking) == list(range(len(DOCUMENTS)))
        scores = [s for _, s in ranking]
        assert scores == sorted(scores, reverse=True)
        assert len({round(s, 6) for s in scores}) == len(DOCUMENTS)


@pytest.mark.parametrize(
    ("provider", "path"),
    [("text-embeddings-inference", "/rerank"), ("cohere", "/v1/rerank"), ("jina", "/v1/rerank")],
)
def test_rerankers_api_ranker(served, provider, path):
    """rerankers' APIRanker (rerankers/models/api_rankers.py), made as its README makes it
    (``Reranker(..., model_type=<provider>, api_key=..., url=...)``), sends `model`, `top_n`
    (every document) and `return_text` / `return_documents` with a Bearer key, and reads
    `index` and `score` / `relevance_score` back."""
    from rerankers import Reranker
    from rerankers.models.api_rankers import APIRanker

    url = served["base"] + path
    ranker = Reranker(served["model"], model_type=provider, api_key=API_KEY, url=url, verbose=0)
    assert isinstance(ranker, APIRanker) and ranker.url == url
    ids = [f"doc-{i}" for i in range(len(DOCUMENTS))]
    ranked = ranker.rank(QUERY, DOCUMENTS, doc_ids=ids)
    want = direct(served, path)
    got = [(ids.index(r.document.doc_id), r.score) for r in ranked.results]
    assert_same_ranking(got, want)
    assert [r.rank for r in ranked.results] == list(range(1, len(DOCUMENTS) + 1))
    assert [r.document.text for r in ranked.results] == [DOCUMENTS[i] for i, _ in want]
    assert [r.document.doc_id for r in ranked.top_k(2)] == [ids[i] for i, _ in want[:2]]


def test_langchain_cohere_rerank(served):
    """langchain-cohere's CohereRerank(base_url=...): compress_documents keeps the top_n
    documents best first with their metadata and `relevance_score`; rerank(top_n=None) all."""
    pytest.importorskip("langchain_cohere", reason=DEV_ONLY)
    from langchain_cohere import CohereRerank
    from langchain_core.documents import Document

    reranker = CohereRerank(
        base_url=served["base"], cohere_api_key=API_KEY, model=served["model"], top_n=3
    )
    documents = [Document(page_content=d, metadata={"n": i}) for i, d in enumerate(DOCUMENTS)]
    want = direct(served, "/v2/rerank")
    kept = reranker.compress_documents(documents, QUERY)
    got = [(d.metadata["n"], d.metadata["relevance_score"]) for d in kept]
    assert_same_ranking(got, want[:3])
    assert [d.page_content for d in kept] == [DOCUMENTS[i] for i, _ in want[:3]]
    every = reranker.rerank(DOCUMENTS, QUERY, top_n=None)
    assert_same_ranking([(r["index"], r["relevance_score"]) for r in every], want)


def _nodes():
    from llama_index.core.schema import NodeWithScore, TextNode

    return [NodeWithScore(node=TextNode(text=d, id_=f"node-{i}")) for i, d in enumerate(DOCUMENTS)]


def test_llama_index_cohere_rerank_postprocessor(served):
    """llama-index-postprocessor-cohere-rerank's CohereRerank(base_url=...) (cohere.ClientV2)
    keeps the top_n nodes best first, each scored with its `relevance_score`."""
    pytest.importorskip("llama_index.postprocessor.cohere_rerank", reason=DEV_ONLY)
    from llama_index.postprocessor.cohere_rerank import CohereRerank

    postprocessor = CohereRerank(
        top_n=2, model=served["model"], api_key=API_KEY, base_url=served["base"], max_retries=1
    )
    kept = postprocessor.postprocess_nodes(_nodes(), query_str=QUERY)
    want = direct(served, "/v2/rerank")
    assert_same_ranking([(int(n.node.id_.split("-")[1]), n.score) for n in kept], want[:2])
    assert [n.node.get_content() for n in kept] == [DOCUMENTS[i] for i, _ in want[:2]]


def test_llama_index_tei_rerank_postprocessor(served):
    """llama-index-postprocessor-tei-rerank's TextEmbeddingInference posts `{query, texts}` to
    `<base_url>/rerank` with `auth_token` as the whole Authorization header (TEI's own
    convention: "Bearer <key>"), scores every node by `index` and keeps the top_n."""
    pytest.importorskip("llama_index.postprocessor.tei_rerank", reason=DEV_ONLY)
    from llama_index.postprocessor.tei_rerank import TextEmbeddingInference

    postprocessor = TextEmbeddingInference(
        top_n=3, base_url=served["base"], auth_token=f"Bearer {API_KEY}", model_name="acare"
    )
    kept = postprocessor.postprocess_nodes(_nodes(), query_str=QUERY)
    want = direct(served, "/rerank")
    assert_same_ranking([(int(n.node.id_.split("-")[1]), n.score) for n in kept], want[:3])

    by_function = TextEmbeddingInference(
        top_n=len(DOCUMENTS), base_url=served["base"], auth_token=lambda url: f"Bearer {API_KEY}"
    )
    every = by_function.postprocess_nodes(_nodes(), query_str=QUERY)
    assert_same_ranking([(int(n.node.id_.split("-")[1]), n.score) for n in every], want)


@pytest.mark.parametrize("version", [1, 2])
def test_cohere_sdk_with_a_key(served, version):
    """The cohere SDK's Client (v1, /v1/rerank) and ClientV2 (/v2/rerank) send the key as a
    Bearer token and read our results; a wrong key is the SDK's UnauthorizedError."""
    import cohere

    make = cohere.Client if version == 1 else cohere.ClientV2
    co = make(api_key=API_KEY, base_url=served["base"])
    response = co.rerank(model=served["model"], query=QUERY, documents=DOCUMENTS, top_n=4)
    want = direct(served, f"/v{version}/rerank")
    assert_same_ranking([(r.index, r.relevance_score) for r in response.results], want[:4])
    assert response.meta.billed_units.search_units == 1
    assert response.meta.tokens.input_tokens > 0
    wrong = make(api_key="not-the-key", base_url=served["base"])
    with pytest.raises(cohere.UnauthorizedError):
        wrong.rerank(model=served["model"], query=QUERY, documents=DOCUMENTS)
