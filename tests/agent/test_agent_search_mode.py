"""Server-side agent-bench systems (issue 24 item 5) without a server: the session protocol of
``run_task`` against scripted answers, the checks on what a server returns, and the
``/v1/search`` body ``SearchEndpoint`` sends (a stdlib stand-in). The real app is in
``test_agent_bench_endpoint.py`` (slow)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from acare_ray.agent.bench import AgentBenchConfig, phase_stats
from acare_ray.agent.searchers import SearchEndpoint, SessionHit, SessionHits
from acare_ray.agent.simulate import run_task
from acare_ray.agent.tasks import Corpus, Task, write_corpus

TEXTS = {"a": "Alpha\nx alpha one", "b": "Beta\ny beta two", "c": "Gamma\nz gamma three"}


def small():
    corpus = Corpus(list(TEXTS), list(TEXTS.values()))
    step = {"question": "alpha", "answer": "x", "paragraph_support_idx": 0}
    task = Task("q1", "Q?", (step,), ("a",), frozenset({"a"}), ())
    return task, corpus


class Scripted:
    """A server-side system answering each search from ``answers`` (lists of (id, seen))."""

    name = "scripted (search)"
    server_sessions = True

    def __init__(self, answers, candidates=3, texts=TEXTS):
        self.answers = list(answers)
        self.candidates = candidates
        self.texts = texts
        self.requests = []
        self.ended = []

    def session_id(self, task_id):
        return f"s-{task_id}"

    def search(self, request):
        self.requests.append(request)
        hits = tuple(
            SessionHit(d, self.texts.get(d, "other"), seen) for d, seen in self.answers.pop(0)
        )
        return SessionHits(hits, 7, 0.001, 0.002, 0.0005, self.candidates)

    def end_session(self, session_id):
        self.ended.append(session_id)


def test_the_agent_keeps_the_unseen_hits_and_the_session_ends_with_the_task():
    task, corpus = small()
    server = Scripted([[("b", False)], [("a", False), ("b", True)]])
    result = run_task(task, corpus, server, budget=3, depth=2, first_stage_k=100)
    assert [s.returned for s in result.searches] == [("b",), ("a",)]
    assert result.solved and result.n_searches == 2
    assert [r.session_id for r in server.requests] == ["s-q1", "s-q1"]
    assert {(r.top_k, r.first_stage_k, r.original_question) for r in server.requests} == {
        (2, 100, "Q?")
    }
    assert server.ended == ["s-q1"]
    first = result.searches[0]
    assert (first.first_stage_s, first.rerank_s, first.session_s, first.tokens) == (
        0.001,
        0.002,
        0.0005,
        7,
    )


def test_a_seen_flag_that_contradicts_the_session_is_an_error():
    """Pins the check that makes a server's session memory testable: a server that forgot (or
    mixed up) the session answers an already-shown document as unseen, and the bench fails
    naming the task, the search and the document instead of counting it again."""
    task, corpus = small()
    server = Scripted([[("b", False)], [("b", False)]])
    with pytest.raises(ValueError, match=r"task q1 step 0 attempt 2 .*'b' marked seen=False"):
        run_task(task, corpus, server, budget=3, depth=2)
    assert server.ended == ["s-q1"]  # the session is still ended


def test_a_document_outside_the_corpus_or_a_different_first_stage_is_an_error():
    task, corpus = small()
    with pytest.raises(ValueError, match="'zz' is not this run's corpus document"):
        run_task(task, corpus, Scripted([[("zz", False)]]), depth=2)
    changed = TEXTS | {"b": "Beta\nanother text"}
    with pytest.raises(ValueError, match="'b' is not this run's corpus document"):
        run_task(task, corpus, Scripted([[("b", False)]], texts=changed), depth=2)
    with pytest.raises(ValueError, match="reranked 50 candidates, not 3"):
        run_task(task, corpus, Scripted([[("b", False)]], candidates=50), depth=2)


def test_search_endpoint_sends_one_search_body_and_forgets_the_session():
    calls = []

    class Handler(BaseHTTPRequestHandler):
        def answer(self, payload):
            data = json.dumps(payload).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self):  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            calls.append(("POST", self.path, body))
            hit = {"doc_id": "a", "title": "Alpha", "text": "x alpha one", "seen": False}
            hit |= {"score": 1.0, "relevance_score": 0.7, "first_stage_rank": 1}
            usage = {"input_tokens": 11, "candidates": 3, "first_stage_ms": 2.0}
            usage |= {"rerank_ms": 5.0, "session_ms": 1.0}
            self.answer({"results": [hit], "mode": "M3", "usage": usage})

        def do_DELETE(self):  # noqa: N802
            calls.append(("DELETE", self.path, None))
            self.answer({"session_id": "x", "deleted": True})

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    task, corpus = small()
    try:
        system = SearchEndpoint(f"http://127.0.0.1:{server.server_port}", mode="M3")
        assert system.name == "M3 (search)"
        result = run_task(task, corpus, system, depth=2, first_stage_k=100)
        system.close()
    finally:
        server.shutdown()
        server.server_close()
    session = system.session_id("q1")
    assert result.solved and result.searches[0].returned == ("a",)
    assert result.searches[0].session_s == pytest.approx(0.001)
    assert result.searches[0].first_stage_s == pytest.approx(0.002)
    (post, delete) = calls
    assert post[:2] == ("POST", "/v1/search")
    assert post[2] == {
        "query": "alpha",
        "original_question": "Q?",
        "reasoning": post[2]["reasoning"],
        "session_id": session,
        "top_k": 2,
        "mode": "M3",
        "first_stage_k": 100,
        "fusion": "none",  # an unfused system: the checkpoint's fitted setting must not apply
    }
    assert delete[:2] == ("DELETE", f"/v1/sessions/{session}")
    fused = SearchEndpoint("http://127.0.0.1:1", mode="M3", fusion="rrf")
    assert fused.name == "M3+rrf:k=60,weight=0.5 (search)"
    fused.close()


def test_write_corpus_is_index_input_that_serves_the_bench_texts(tmp_path):
    from acare_ray.search.first_stage import BM25FirstStage
    from acare_ray.search.index import build_index

    _, corpus = small()
    path = tmp_path / "corpus.jsonl"
    assert write_corpus(corpus, path) == 3
    build_index([path], tmp_path / "index")
    hits = BM25FirstStage(str(tmp_path / "index")).search("beta two", 3)
    positions, scores = corpus.search("beta two", 3)
    assert [h.doc_id for h in hits] == [corpus.ids[p] for p in positions]
    assert [h.rerank_text for h in hits] == [corpus.texts[p] for p in positions]
    assert [h.score for h in hits] == pytest.approx(list(scores))


def test_phase_stats_and_config():
    assert phase_stats([None, None]) is None
    stats = phase_stats([0.001, 0.003, None])
    assert stats["mean"] == pytest.approx(2.0) and stats["p50"] == pytest.approx(2.0)
    with pytest.raises(ValueError, match="--modes"):
        AgentBenchConfig(out="x", search_endpoint="http://h", modes=("M9",))
    with pytest.raises(ValueError, match="--mcp is empty"):
        AgentBenchConfig(out="x", mcp=" ")
    AgentBenchConfig(out="x", search_endpoint="http://h", fusion=("rrf",))
