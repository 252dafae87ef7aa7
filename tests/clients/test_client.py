"""acare_ray.clients.http_client: bodies, answers, and the retry policy (503/429 + Retry-After within a
budget, connection errors a bounded number of times), sync and async, on httpx mock transports."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from acare_ray.clients.http_client import AcareClient, AcareError, AsyncAcareClient

RERANKED = {
    "id": "x",
    "results": [{"index": 1, "relevance_score": 0.8}, {"index": 0, "relevance_score": 0.3}],
    "meta": {"tokens": {"input_tokens": 17, "output_tokens": 0}, "mode": "M3"},
}


def scripted(answers: list[httpx.Response | Exception], seen: list[httpx.Request]):
    """A handler that records each request and plays ``answers`` in order."""

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    return handle


def test_rerank_sends_the_context_fields_and_retries_503_and_429():
    seen: list[httpx.Request] = []
    answers = [
        httpx.Response(503, headers={"retry-after": "0"}, json={"message": "busy"}),
        httpx.Response(429, headers={"retry-after": "0"}, json={"message": "share"}),
        httpx.Response(200, json=RERANKED),
    ]
    client = AcareClient(
        "http://acare.test/", "k", transport=httpx.MockTransport(scripted(answers, seen))
    )
    out = client.rerank(
        "q",
        ["a", "b"],
        original_question="Q?",
        reasoning="r",
        top_n=2,
        instruction="Find it",
        max_tokens_per_doc=64,
    )
    assert [(h.index, h.relevance_score) for h in out.hits] == [(1, 0.8), (0, 0.3)]
    assert (out.tokens, out.mode, client.refused) == (17, "M3", 2)
    assert len(seen) == 3
    assert all(r.url == "http://acare.test/v2/rerank" for r in seen)
    assert seen[-1].headers["authorization"] == "Bearer k"
    assert json.loads(seen[-1].content) == {
        "model": "acare",
        "query": "q",
        "documents": ["a", "b"],
        "top_n": 2,
        "original_question": "Q?",
        "reasoning": "r",
        "instruction": "Find it",
        "max_tokens_per_doc": 64,
    }


def test_refusals_past_the_budget_raise_with_the_server_message():
    """A Retry-After that would end past the budget is not waited for."""
    seen: list[httpx.Request] = []
    answers = [httpx.Response(503, headers={"retry-after": "30"}, json={"message": "overloaded"})]
    client = AcareClient(
        "http://acare.test",
        retry_budget_s=5,
        transport=httpx.MockTransport(scripted(answers, seen)),
    )
    with pytest.raises(AcareError, match="still refused after 5 s: HTTP 503: overloaded") as err:
        client.search("q")
    assert err.value.status == 503 and len(seen) == 1


def test_a_client_error_is_final_and_names_the_field():
    seen: list[httpx.Request] = []
    answers = [httpx.Response(422, json={"message": "top_k: must be >= 1"})]
    client = AcareClient(
        "http://acare.test", transport=httpx.MockTransport(scripted(answers, seen))
    )
    with pytest.raises(AcareError, match="HTTP 422: top_k: must be >= 1") as err:
        client.search("q", top_k=0)
    assert err.value.status == 422 and len(seen) == 1


def test_connection_errors_are_retried_a_bounded_number_of_times():
    seen: list[httpx.Request] = []
    down = httpx.ConnectError("refused")
    answers: list = [down, down, down]
    client = AcareClient(
        "http://acare.test",
        retries=2,
        connect_retry_wait_s=0,
        transport=httpx.MockTransport(scripted(answers, seen)),
    )
    with pytest.raises(AcareError, match="refused") as err:
        client.rerank("q", ["a"])
    assert err.value.status == 0 and len(seen) == 3


def test_async_client_searches_and_forgets_with_the_same_policy():
    seen: list[httpx.Request] = []
    hit = {
        "doc_id": "d1",
        "text": "t",
        "title": None,
        "score": 1.5,
        "relevance_score": 0.8,
        "first_stage_rank": 3,
        "first_stage_score": 2.0,
        "seen": False,
    }
    answers = [
        httpx.Response(503, headers={"retry-after": "0"}),
        httpx.Response(
            200, json={"results": [hit], "session_id": "s/1", "mode": "M1", "usage": {"tokens": 9}}
        ),
        httpx.Response(200, json={"deleted": True}),
    ]

    async def go():
        async with AsyncAcareClient(
            "http://acare.test", transport=httpx.MockTransport(scripted(answers, seen))
        ) as client:
            found = await client.search("q", reasoning="r", session_id="s/1", seen_ids=["d0"])
            forgot = await client.forget("s/1")
            return found, forgot, client.refused

    found, forgot, refused = asyncio.run(go())
    assert [h.doc_id for h in found.hits] == ["d1"] and found.hits[0].first_stage_rank == 3
    assert (found.session_id, found.mode, found.usage, forgot, refused) == (
        "s/1",
        "M1",
        {"tokens": 9},
        True,
        1,
    )
    assert json.loads(seen[1].content) == {
        "query": "q",
        "reasoning": "r",
        "session_id": "s/1",
        "seen_ids": ["d0"],
    }
    assert seen[2].method == "DELETE" and seen[2].url.raw_path == b"/v1/sessions/s%2F1"


def test_a_rerank_answered_500_by_a_dead_replica_is_sent_again_a_bounded_number_of_times():
    """Issue 23.3: Ray Serve's proxy answers 500 for a request whose replica died holding it;
    a rerank (safe to repeat) is resent, counted in ``server_errors``; before, it failed."""
    seen: list[httpx.Request] = []
    dead = httpx.Response(500, text="Internal Server Error")
    answers = [dead, httpx.Response(502, text="Bad Gateway"), httpx.Response(200, json=RERANKED)]
    client = AcareClient(
        "http://acare.test",
        retries=2,
        connect_retry_wait_s=0,
        transport=httpx.MockTransport(scripted(answers, seen)),
    )
    assert [h.index for h in client.rerank("q", ["a", "b"]).hits] == [1, 0]
    assert (len(seen), client.server_errors, client.refused) == (3, 2, 0)
    answers[:] = [dead, dead, dead]
    with pytest.raises(AcareError, match="HTTP 500") as err:
        client.rerank("q", ["a"])
    assert err.value.status == 500 and len(seen) == 6 and client.server_errors == 4


def test_a_search_answered_500_is_not_sent_again():
    """A search may have been recorded in its session by the first try: a 5xx is final."""
    seen: list[httpx.Request] = []
    answers = [httpx.Response(500, text="Internal Server Error")]
    client = AcareClient(
        "http://acare.test", transport=httpx.MockTransport(scripted(answers, seen))
    )
    with pytest.raises(AcareError, match="HTTP 500"):
        client.search("q", session_id="s")
    assert len(seen) == 1 and client.server_errors == 0


def test_any_call_answered_408_is_sent_again_since_the_server_never_ran_it():
    """A 408 means the body did not arrive, so nothing ran: a search is resent too. Ray Serve
    answers one (through our body deadline) when it hands a request whose replica died to
    another replica without the body the first had read (a CI run of the replica-kill test)."""
    seen: list[httpx.Request] = []
    lost = httpx.Response(408, json={"message": "body: not received within 30 s"})
    answers = [
        lost,
        httpx.Response(200, json={"results": [], "session_id": "s", "mode": "M3", "usage": {}}),
    ]
    client = AcareClient(
        "http://acare.test",
        retries=1,
        connect_retry_wait_s=0,
        transport=httpx.MockTransport(scripted(answers, seen)),
    )
    client.search("q", session_id="s")
    assert len(seen) == 2 and client.server_errors == 1
    answers[:] = [lost, lost]
    with pytest.raises(AcareError, match="HTTP 408") as err:
        client.rerank("q", ["a"])
    assert err.value.status == 408 and len(seen) == 4 and client.server_errors == 2


def test_the_async_client_resends_a_rerank_answered_500():
    seen: list[httpx.Request] = []
    answers = [
        httpx.Response(500, text="Internal Server Error"),
        httpx.Response(200, json=RERANKED),
    ]

    async def go():
        transport = httpx.MockTransport(scripted(answers, seen))
        async with AsyncAcareClient(
            "http://acare.test", connect_retry_wait_s=0, transport=transport
        ) as client:
            out = await client.rerank("q", ["a", "b"])
            return out, client.server_errors

    out, resent = asyncio.run(go())
    assert [h.index for h in out.hits] == [1, 0] and resent == 1 and len(seen) == 2
