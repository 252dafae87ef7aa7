"""The Serve app under load over real HTTP: a burst gets answers or fast 503s, batching
retuned at runtime, fair shares between clients, a disconnect frees its replica (the
``main``, ``burst``, ``fair`` and ``cancel`` apps)."""

from __future__ import annotations

import concurrent.futures
import copy
import json
import math
import random
import socket
import threading
import time

import httpx
import numpy as np
import pytest
from scoring_support import QUERY, QUESTION
from serve_support import (
    BURST_DEADLINE_S,
    BURST_DOCUMENTS,
    BURST_REQUESTS,
    CANCEL_DOCUMENT_BYTES,
    CANCEL_DOCUMENTS,
    DOCUMENTS,
    FAIR_B_REQUESTS,
    FAIR_DEADLINE_S,
    FAIR_DOCUMENTS,
    FAIR_FLOODERS,
    FAIR_MAX_TOKENS,
    FAIR_SHARE,
    KEY_A,
    KEY_B,
    expected,
    tokens_scored,
)

from acare_ray.scoring import AgentContext, Mode, Scorer
from acare_ray.testing import deploy_serve_config

pytestmark = pytest.mark.slow
SERVE_APPS = ("main", "burst", "fair", "cancel")


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
