"""``acare index`` and ``POST /v1/search`` in process (FastAPI TestClient around the real
service and the tiny Qwen3): the served list equals first stage + rerank + unseen-first computed
by hand; session memory per key, forgetting, ``seen_ids``; bounds; the upstream adapter."""

from __future__ import annotations

import json

import httpx
import numpy as np
import pytest
from agents_support import CORPUS
from fastapi.testclient import TestClient

from acare_ray.cli import main
from acare_ray.data.bm25 import BM25Index
from acare_ray.online.http import single_model_api
from acare_ray.online.search_routes import SearchSettings, search_routes
from acare_ray.online.service import Limits, RerankService
from acare_ray.online.serving import client_of, inline_score
from acare_ray.ranking.fusion import FusionConfig, fuse
from acare_ray.scoring import AgentContext, rank_order
from acare_ray.search.first_stage import BM25FirstStage, HttpFirstStage, UpstreamError
from acare_ray.search.index import document_text
from acare_ray.search.sessions import LocalSessions, SessionLimits, SessionMemory

QUERY = "capital population"
QUESTION = "What is the population of the capital of the country where Anna Berg was born?"
REASONING = "Anna Berg was born in Velmoria, so I need the capital of Velmoria."


def make_app(
    scorer, index_dir, keys=None, first_stage_k=8, max_top_k=8, calibration=None, first_stage=None
):
    service = RerankService(scorer, "tiny", Limits(max_documents=50), calibration=calibration)
    settings = SearchSettings(
        index=str(index_dir), first_stage_k=first_stage_k, max_top_k=max_top_k
    )
    received = []

    scored = inline_score(service)

    async def score(job, client):
        received.append(job)
        return await scored(job, client)

    routes = search_routes(
        first_stage or BM25FirstStage(str(index_dir)),
        LocalSessions(SessionMemory(settings.session_limits())),
        settings,
        max_documents=50,
        client_of=client_of,
    )
    app = single_model_api(service, score, api_key=keys, extra_routes=routes)
    return TestClient(app), received


@pytest.fixture(scope="module")
def app(tiny_scorer, index_dir):
    return make_app(tiny_scorer, index_dir)


def by_hand(scorer, k, top_k, seen=()):
    """BM25 over the corpus, the scorer over its top k, unseen first: (doc ids, log-odds)."""
    texts = [f"{r['title']}\n{r['text']}" for r in CORPUS]
    positions, _ = BM25Index(texts).search([QUERY], k)
    candidates = [CORPUS[int(i)] for i in positions[0]]
    documents = [document_text(c["title"], c["text"]) for c in candidates]
    scores = scorer.score(AgentContext(QUERY, question=QUESTION, reasoning=REASONING), documents)
    order = [int(i) for i in rank_order(scores)]
    order = [i for i in order if candidates[i]["doc_id"] not in seen] + [
        i for i in order if candidates[i]["doc_id"] in seen
    ]
    return [candidates[i]["doc_id"] for i in order[:top_k]], [
        float(scores[i]) for i in order[:top_k]
    ]


def test_acare_index_cli_writes_an_index_and_reports_bad_rows(tmp_path, capsys):
    corpus = tmp_path / "c.jsonl"
    rows = [
        {"doc_id": "a", "title": "A", "text": "alpha text"},
        {"doc_id": "b", "text": ""},
        {"doc_id": "a", "text": "again"},
        {"doc_id": 7, "text": "numeric id"},
    ]
    corpus.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["index", "--input", str(corpus), "--out", str(tmp_path / "idx")]) == 0
    assert "indexed 2 documents" in capsys.readouterr().out
    rejected = [
        json.loads(line) for line in (tmp_path / "idx" / "rejected.jsonl").read_text().splitlines()
    ]
    assert [(r["row"], r["error"]) for r in rejected] == [
        (1, "text is missing, empty or not a string"),
        (2, "doc_id 'a' repeats an earlier row"),
    ]
    found = BM25FirstStage(str(tmp_path / "idx")).search("numeric", 2)
    assert found[0].doc_id == "7" and found[0].rank == 1
    assert main(["index", "--input", str(tmp_path / "none.csv"), "--out", str(tmp_path / "x")]) == 2


def test_parquet_corpus_indexes_like_jsonl(tmp_path, index_dir):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(CORPUS), tmp_path / "c.parquet")
    assert (
        main(["index", "--input", str(tmp_path / "c.parquet"), "--out", str(tmp_path / "p")]) == 0
    )
    a = BM25FirstStage(str(tmp_path / "p")).search(QUERY, 5)
    b = BM25FirstStage(str(index_dir)).search(QUERY, 5)
    assert a == b


def test_search_equals_first_stage_then_rerank_computed_by_hand(app, tiny_scorer):
    client, _ = app
    body = {"query": QUERY, "original_question": QUESTION, "reasoning": REASONING, "top_k": 5}
    answer = client.post("/v1/search", json=body)
    assert answer.status_code == 200, answer.text
    got = answer.json()
    ids, scores = by_hand(tiny_scorer, 8, 5)
    assert [h["doc_id"] for h in got["results"]] == ids
    np.testing.assert_allclose([h["score"] for h in got["results"]], scores, atol=1e-5)
    assert got["mode"] == "M3" and got["usage"]["candidates"] == 8
    assert got["usage"]["first_stage"] == "bm25" and got["usage"]["input_tokens"] > 0
    assert all(not h["seen"] for h in got["results"])
    assert answer.headers["x-acare-tokens"] == str(got["usage"]["input_tokens"])


@pytest.mark.parametrize("setting", ["rrf:k=60,weight=0.5", "linear:alpha=0.3"])
def test_search_fuses_with_the_first_stage_as_fuse_by_hand(app, tiny_scorer, setting):
    """Issue 20/24: the search's order is fuse() of the reranker's log-odds with the BM25 ranks
    and scores, computed here by hand; ``fusion`` defaults to the checkpoint's fitted setting
    (none for this one: the reranker's order, ties by BM25 rank)."""
    client, _ = app
    body = {"query": QUERY, "original_question": QUESTION, "reasoning": REASONING, "top_k": 8}
    texts = [f"{r['title']}\n{r['text']}" for r in CORPUS]
    positions, bm25 = BM25Index(texts).search([QUERY], 8)
    candidates = [CORPUS[int(i)] for i in positions[0]]
    documents = [document_text(c["title"], c["text"]) for c in candidates]
    scores = tiny_scorer.score(
        AgentContext(QUERY, question=QUESTION, reasoning=REASONING), documents
    )
    config = FusionConfig.parse(setting)
    fused = fuse(scores, config, [float(x) for x in bm25[0]], list(range(1, 9)))
    answer = client.post("/v1/search", json=body | {"fusion": setting})
    assert answer.status_code == 200, answer.text
    got = answer.json()
    assert got["fusion"] == config.label == answer.headers["x-acare-fusion"]
    assert [h["doc_id"] for h in got["results"]] == [
        candidates[int(i)]["doc_id"] for i in fused.order
    ]
    np.testing.assert_allclose(
        [h["fused_score"] for h in got["results"]], fused.values[fused.order], atol=1e-6
    )
    default = client.post("/v1/search", json=body).json()
    assert default["fusion"] == "none"
    assert all("fused_score" not in h for h in default["results"])
    bad = client.post("/v1/search", json=body | {"fusion": "rrf:k=-1"})
    assert bad.status_code == 422 and "fusion" in bad.text


def test_first_stage_ranks_are_the_bm25_ranks(app, index_dir):
    client, _ = app
    got = client.post("/v1/search", json={"query": QUERY, "top_k": 5}).json()
    bm25 = {c.doc_id: (c.rank, c.score) for c in BM25FirstStage(str(index_dir)).search(QUERY, 8)}
    for hit in got["results"]:
        assert (hit["first_stage_rank"], hit["first_stage_score"]) == pytest.approx(
            bm25[hit["doc_id"]]
        )
        row = next(r for r in CORPUS if r["doc_id"] == hit["doc_id"])
        assert (hit["title"], hit["text"]) == (row["title"], row["text"])


def test_a_session_gets_unseen_documents_first_and_can_be_forgotten(app, tiny_scorer):
    client, _ = app
    body = {
        "query": QUERY,
        "original_question": QUESTION,
        "reasoning": REASONING,
        "top_k": 3,
        "session_id": "s-1",
    }
    first = [h["doc_id"] for h in client.post("/v1/search", json=body).json()["results"]]
    second = client.post("/v1/search", json=body).json()["results"]
    ids, _ = by_hand(tiny_scorer, 8, 3, seen=set(first))
    assert [h["doc_id"] for h in second] == ids
    assert not set(first) & {h["doc_id"] for h in second}
    assert client.get("/v1/sessions/s-1").json()["seen_ids"] == first + ids
    assert client.delete("/v1/sessions/s-1").json() == {"session_id": "s-1", "deleted": True}
    assert client.delete("/v1/sessions/s-1").json()["deleted"] is False
    again = client.post("/v1/search", json=body).json()["results"]
    assert [h["doc_id"] for h in again] == first


def test_seen_ids_from_a_stateless_client_go_last_and_are_marked(app, tiny_scorer):
    client, _ = app
    plain = client.post("/v1/search", json={"query": QUERY, "top_k": 8}).json()["results"]
    seen = [plain[0]["doc_id"], plain[2]["doc_id"]]
    got = client.post("/v1/search", json={"query": QUERY, "top_k": 8, "seen_ids": seen}).json()[
        "results"
    ]
    order = [h["doc_id"] for h in plain]
    assert [h["doc_id"] for h in got] == [d for d in order if d not in seen] + seen
    assert [h["seen"] for h in got] == [False] * 6 + [True, True]
    assert client.get("/v1/sessions/none").json()["seen_ids"] == []


def test_sessions_belong_to_their_api_key(tiny_scorer, index_dir):
    client, _ = make_app(tiny_scorer, index_dir, keys=("k1", "k2"))
    body = {"query": QUERY, "top_k": 2, "session_id": "same"}
    one = {"Authorization": "Bearer k1"}
    two = {"Authorization": "Bearer k2"}
    a = client.post("/v1/search", json=body, headers=one).json()["results"]
    b = client.post("/v1/search", json=body, headers=two).json()["results"]
    assert [h["doc_id"] for h in a] == [h["doc_id"] for h in b]
    assert client.get("/v1/sessions/same", headers=two).json()["seen_ids"] == [
        h["doc_id"] for h in b
    ]
    assert client.delete("/v1/sessions/same", headers=one).json()["deleted"] is True
    assert len(client.get("/v1/sessions/same", headers=two).json()["seen_ids"]) == 2
    assert client.post("/v1/search", json=body).status_code == 401


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        ({"query": " "}, 422, "query: query is empty"),
        ({"query": "q", "top_k": 9}, 422, "top_k: is 9, at most 8"),
        ({"query": "q", "top_k": 0}, 422, "top_k:"),
        ({"query": "q", "first_stage_k": 51}, 413, "first_stage_k: is 51, at most 50"),
        ({"query": "q", "session_id": ""}, 422, "session_id:"),
        ({"query": "q", "mode": "M3"}, 422, "original_question: mode M3 reads it"),
        ({"query": "q", "colour": 1}, 422, "colour:"),
    ],
)
def test_bad_search_requests_name_the_field(app, body, status, message):
    client, _ = app
    answer = client.post("/v1/search", json=body)
    assert answer.status_code == status, answer.text
    assert message in answer.json()["message"]


def test_max_tokens_per_doc_cuts_candidates_and_is_counted(app):
    client, received = app
    received.clear()
    full = client.post("/v1/search", json={"query": QUERY, "top_k": 8}).json()
    cut = client.post(
        "/v1/search", json={"query": QUERY, "top_k": 8, "max_tokens_per_doc": 4}
    ).json()
    assert received[1].limit == 4 and received[0].limit > 4
    assert cut["usage"]["input_tokens"] < full["usage"]["input_tokens"]
    assert received[1].bound < received[0].bound
    assert cut["warnings"] == ["8 candidates truncated to 4 tokens"]


def test_upstream_adapter_reads_the_documented_shape_and_refuses_a_bad_answer():
    calls = []

    def upstream(request: httpx.Request) -> httpx.Response:
        calls.append((request.headers.get("authorization"), json.loads(request.content)))
        if json.loads(request.content)["query"] == "bad":
            return httpx.Response(200, json={"results": [{"doc_id": "x"}]})
        return httpx.Response(
            200,
            json={
                "results": [
                    {"doc_id": "u1", "text": "one", "title": "T", "score": 3.0},
                    {"doc_id": 2, "text": "two"},
                ]
            },
        )

    stage = HttpFirstStage("http://up.test/search", "key", transport=httpx.MockTransport(upstream))
    found = stage.search("hello", 5)
    assert [(c.doc_id, c.rank, c.score, c.rerank_text) for c in found] == [
        ("u1", 1, 3.0, "T\none"),
        ("2", 2, None, "two"),
    ]
    assert calls[0] == ("Bearer key", {"query": "hello", "top_k": 5})
    with pytest.raises(UpstreamError, match="^upstream search answer is malformed"):
        stage.search("bad", 5)


def test_a_failing_upstream_search_is_a_502_naming_the_first_stage(tiny_scorer, index_dir):
    def upstream(request: httpx.Request) -> httpx.Response:
        if json.loads(request.content)["query"] == "down":
            raise httpx.ConnectError("connection refused")
        return httpx.Response(503, text="busy")

    stage = HttpFirstStage("http://up.test/search", transport=httpx.MockTransport(upstream))
    client, received = make_app(tiny_scorer, index_dir, first_stage=stage)
    for query, said in (
        ("down", "upstream search failed"),
        ("busy", "upstream search answered HTTP 503"),
    ):
        answer = client.post("/v1/search", json={"query": query})
        assert answer.status_code == 502, answer.text
        assert answer.json()["message"].startswith(f"first_stage: {said}")
    assert received == []  # nothing was scored


def test_search_settings_need_exactly_one_first_stage():
    with pytest.raises(ValueError, match="exactly one of index and upstream_url"):
        SearchSettings()
    with pytest.raises(ValueError, match="exactly one"):
        SearchSettings(index="i", upstream_url="http://x")


def test_session_memory_is_bounded_by_ttl_count_and_size():
    now = [0.0]
    memory = SessionMemory(
        SessionLimits(ttl_s=10, max_sessions_per_client=2, max_clients=2, max_seen=3),
        clock=lambda: now[0],
    )
    memory.remember("k", "a", ["1", "2", "3", "4"])
    assert memory.seen("k", "a") == ["2", "3", "4"]
    memory.remember("k", "b", ["x"])
    memory.remember("k", "c", ["y"])  # a is the least recently used: it goes
    assert memory.seen("k", "a") == [] and memory.seen("k", "b") == ["x"]
    memory.remember("k2", "a", ["z"])
    memory.remember("k3", "a", ["w"])  # k was used least recently: it goes
    assert memory.seen("k", "b") == [] and memory.seen("k2", "a") == ["z"]
    now[0] = 9.0
    assert memory.seen("k2", "a") == ["z"]  # reading refreshes it
    now[0] = 18.0
    assert memory.seen("k3", "a") == [] and memory.seen("k2", "a") == ["z"]
    now[0] = 40.0
    assert memory.counts() == {"clients": 0, "sessions": 0}


def test_every_route_answers_one_relevance_and_says_how_it_was_made(
    tiny_scorer, tiny_qwen3_copy, index_dir
):
    """A checkpoint calibrated for M3: /v1/search, /v1/rerank, /v2/rerank, /rerank, /score and
    the client the MCP tools call give each document the same relevance, the calibration of its
    score, and x-acare-relevance says what the body holds (raw values included)."""
    import asyncio

    from scipy.special import expit

    from acare_ray.clients.mcp_server import in_process_client
    from acare_ray.ranking.calibration import Calibration
    from acare_ray.ranking.checkpoint_settings import read_calibration, write_calibration

    write_calibration(tiny_qwen3_copy, "M3", Calibration(0.5, -1.0), {"note": "test"})
    client, _ = make_app(tiny_scorer, index_dir, calibration=read_calibration(tiny_qwen3_copy))
    context = {"original_question": QUESTION, "reasoning": REASONING}
    found = client.post("/v1/search", json={"query": QUERY, **context, "top_k": 4})
    assert found.status_code == 200 and found.headers["x-acare-relevance"] == "calibrated"
    hits = found.json()["results"]
    for hit in hits:
        assert hit["relevance_score"] == pytest.approx(expit(0.5 * hit["score"] - 1.0), abs=1e-9)
    docs = [document_text(h["title"], h["text"]) for h in hits]
    want = {d: h["relevance_score"] for d, h in zip(docs, hits)}

    def by_document(results, key):
        return {docs[r["index"]]: r[key] for r in results}

    answers = {
        "/v1/rerank": client.post(
            "/v1/rerank", json={"query": QUERY, "documents": docs, **context}
        ),
        "/v2/rerank": client.post(
            "/v2/rerank", json={"query": QUERY, "documents": docs, **context}
        ),
        "/rerank": client.post("/rerank", json={"query": QUERY, "texts": docs, **context}),
        "/score": client.post("/score", json={"text_1": QUERY, "text_2": docs, **context}),
    }
    for route, answer in answers.items():
        assert answer.status_code == 200, (route, answer.text)
        assert answer.headers["x-acare-relevance"] == "calibrated", route
    got = {
        "/v1/rerank": by_document(answers["/v1/rerank"].json()["results"], "relevance_score"),
        "/v2/rerank": by_document(answers["/v2/rerank"].json()["results"], "relevance_score"),
        "/rerank": by_document(answers["/rerank"].json(), "score"),
        "/score": by_document(answers["/score"].json()["data"], "score"),
    }
    for route, values in got.items():
        for doc, value in values.items():
            assert value == pytest.approx(want[doc], abs=1e-6), route
    assert answers["/v1/rerank"].json()["meta"]["relevance"] == "calibrated"

    async def through_the_mcp_client():
        async with in_process_client(str(tiny_qwen3_copy), str(index_dir), "cpu") as mcp:
            searched = await mcp.search(QUERY, **context, top_k=4)
            reranked = await mcp.rerank(QUERY, docs, **context)
        return searched, reranked

    searched, reranked = asyncio.run(through_the_mcp_client())
    for hit in searched.hits:
        assert hit.relevance_score == pytest.approx(expit(0.5 * hit.score - 1.0), abs=1e-9)
    for hit in reranked.hits:
        assert hit.relevance_score == pytest.approx(want[docs[hit.index]], abs=1e-6)

    # raw values: the header says raw wherever the body holds log-odds
    raw = {
        "/v1/rerank": client.post(
            "/v1/rerank",
            json={"query": QUERY, "documents": docs, **context, "use_activation": False},
        ),
        "/rerank": client.post(
            "/rerank", json={"query": QUERY, "texts": docs, **context, "raw_scores": True}
        ),
        "/score": client.post(
            "/score", json={"text_1": QUERY, "text_2": docs, **context, "use_activation": False}
        ),
    }
    for route, answer in raw.items():
        assert answer.status_code == 200 and answer.headers["x-acare-relevance"] == "raw", route
    assert raw["/v1/rerank"].json()["meta"]["relevance"] == "raw"
    scores = {docs[r["index"]]: r["score"] for r in raw["/score"].json()["data"]}
    for doc, hit in zip(docs, hits):
        assert scores[doc] == pytest.approx(hit["score"], abs=1e-5)


@pytest.mark.parametrize("backend", ["causal", "cross_encoder"])
def test_one_request_resolves_its_mode_once_and_tokenizes_its_context_once(
    backend, tiny_scorer, minilm_scorer, index_dir, monkeypatch
):
    """On every protocol a request's mode is resolved once (the service) and its context
    tokenized once (the token accounting; the scorer reuses those ids), with nothing cached
    from an earlier request: each request carries a context no other request has."""
    import acare_ray.online.service as service_module
    import acare_ray.scoring.scorer as scorer_module

    scorer = tiny_scorer if backend == "causal" else minilm_scorer
    backend_object = scorer.backend
    memo = backend_object.encoder.memo if backend == "causal" else backend_object.memo
    client, received = make_app(scorer, index_dir)
    counts = {"parse_mode": 0, "tokenized": 0}

    def counting(name, function):
        def wrapper(*args, **kwargs):
            counts[name] += 1
            return function(*args, **kwargs)

        return wrapper

    for module in (service_module, scorer_module):
        if hasattr(module, "parse_mode"):
            monkeypatch.setattr(module, "parse_mode", counting("parse_mode", module.parse_mode))
    real_ids = memo.ids

    def ids(context, mode, make):
        return real_ids(context, mode, counting("tokenized", make))

    monkeypatch.setattr(memo, "ids", ids)
    docs = ["Ostrava is the capital of Velmoria.", "Paris is the capital of France."]
    requests = {
        "/v1/rerank": lambda c: {"query": QUERY, "documents": docs, **c},
        "/v2/rerank": lambda c: {"query": QUERY, "documents": docs, **c},
        "/rerank": lambda c: {"query": QUERY, "texts": docs, **c},
        "/score": lambda c: {"text_1": QUERY, "text_2": docs, **c},
        "/v1/search": lambda c: {"query": QUERY, "top_k": 3, **c},
    }
    for i, (route, body) in enumerate(requests.items()):
        context = {"original_question": f"{QUESTION} ({backend} {i})", "reasoning": REASONING}
        counts.update(parse_mode=0, tokenized=0)
        answer = client.post(route, json=body(context))
        assert answer.status_code == 200, (route, answer.text)
        assert counts == {"parse_mode": 1, "tokenized": 1}, route
        assert received[-1].mode.value == "M3"
    # the memo is what made it once: the same context again is not tokenized at all
    counts.update(parse_mode=0, tokenized=0)
    assert client.post("/v2/rerank", json=requests["/v2/rerank"](context)).status_code == 200
    assert counts == {"parse_mode": 1, "tokenized": 0}


def test_a_request_walks_each_online_module_once_down_and_once_back(tiny_scorer, index_dir):
    """Route to score and back: on every call stack a request makes (the event loop's and the
    worker threads'), no module of ``acare_ray.online`` appears twice apart, i.e. no layer
    calls back into one it was called from. Checked on every protocol and /v1/search, through
    the real app over ASGI."""
    import asyncio
    import sys
    import threading

    client, _ = make_app(tiny_scorer, index_dir)
    app = client.app
    context = {"original_question": QUESTION, "reasoning": REASONING}
    docs = ["Ostrava is the capital of Velmoria.", "Paris is the capital of France."]
    requests = {
        "/v1/rerank": {"query": QUERY, "documents": docs, **context},
        "/v2/rerank": {"query": QUERY, "documents": docs, "first_stage_order": True, **context},
        "/rerank": {"query": QUERY, "texts": docs, **context},
        "/score": {"text_1": [QUERY, "other words"], "text_2": docs, **context},
        "/v1/search": {"query": QUERY, "top_k": 3, **context},
    }
    walks: set[tuple[str, ...]] = set()
    back_again: set[tuple[str, ...]] = set()

    def online_stack(frame) -> tuple[str, ...]:
        names = []
        while frame is not None:
            name = frame.f_globals.get("__name__", "")
            if name.startswith("acare_ray.online") and (not names or names[-1] != name):
                names.append(name)
            frame = frame.f_back
        return tuple(reversed(names))

    def profile(frame, event, arg):
        if event == "call" and frame.f_globals.get("__name__", "").startswith("acare_ray.online"):
            stack = online_stack(frame)
            walks.add(stack)
            if len(set(stack)) < len(stack):
                back_again.add(stack)

    async def send_all():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
            return {route: await http.post(route, json=body) for route, body in requests.items()}

    threading.setprofile(profile)
    sys.setprofile(profile)
    try:
        answers = asyncio.run(send_all())  # a new loop: its worker threads get the profile too
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    for route, answer in answers.items():
        assert answer.status_code == 200, (route, answer.text)
    # the walk was seen: the gate, a route, the serving object, the service
    assert any(
        w[:3] == ("acare_ray.online.http", "acare_ray.online.routes", "acare_ray.online.serving")
        for w in walks
    )
    assert any(w[-1] == "acare_ray.online.service" for w in walks)
    assert back_again == set(), sorted(back_again)
