"""A small Python client for a running ``acare serve``: sync (:class:`AcareClient`) and async
(:class:`AsyncAcareClient`), over httpx.

Both cover ``POST /v2/rerank`` (Cohere v2 body plus the ACARe fields ``original_question``,
``reasoning``, ``mode``, ``instruction``), ``POST /v1/search`` and ``DELETE /v1/sessions/{id}``.

Retries: a 503 or 429 answer (an overloaded replica, or a client over its fair share) is sent
again after its ``Retry-After`` (1 s when it has none) for as long as ``retry_budget_s`` allows,
counted from the call's first attempt; a connection error is retried after
``connect_retry_wait_s``, at most ``retries`` times. A rerank answered 500 or 502 is sent again
the same way (``server_errors`` counts those resent): that is what a request gets from Ray
Serve's proxy when the replica holding it dies before answering (a replica killed, its node
lost), and scoring is a pure function, so a second try cannot do anything twice. Searches and
deletes are not resent on a 5xx (a session may have recorded the first try). Any call answered
408 is resent the same way: the server refused it before running it because its body did not
arrive, which is also what a request gets when Ray Serve hands it, after its first replica died,
to another replica without the body the first one had already read (it waits the server's
``body_read_timeout_s``, then 408). Any other error
status, or a call still refused when its budget runs out, raises :class:`AcareError` with the
status and the server's message. ``refused`` counts the 503/429 answers received (shared by all
threads or tasks).
``timeout_s`` bounds each attempt (httpx's connect/read/write/pool timeouts).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import httpx

RETRY_STATUSES = frozenset({429, 503})
# Resent, a bounded number of times, for calls that are safe to repeat (rerank).
SERVER_ERROR_STATUSES = frozenset({500, 502})
# Resent for every call: the server did not run it (its body never arrived).
NOT_RUN_STATUSES = frozenset({408})


class AcareError(RuntimeError):
    """The server refused a call (``status``, 0 for a connection failure) or kept refusing it."""

    def __init__(self, status: int, message: str) -> None:
        self.status = status
        super().__init__(message)


@dataclass(frozen=True)
class RerankHit:
    """One reranked document: its position in the request, its 0..1 relevance (the checkpoint's
    calibration where it has one, else sigmoid(log-odds)), the document when
    ``return_documents`` was set."""

    index: int
    relevance_score: float
    document: dict[str, Any] | None = None


@dataclass(frozen=True)
class Reranked:
    """A rerank answer: ``hits`` best first, ``tokens`` scored, the ``mode`` the model read."""

    hits: list[RerankHit]
    tokens: int
    mode: str | None
    raw: dict[str, Any] = field(repr=False)


@dataclass(frozen=True)
class SearchHit:
    """One ``/v1/search`` result (see docs/agents.md for every field)."""

    doc_id: str
    text: str
    title: str | None
    score: float
    relevance_score: float
    first_stage_rank: int
    first_stage_score: float | None
    seen: bool


@dataclass(frozen=True)
class Searched:
    """A ``/v1/search`` answer: ``hits`` in the served order, ``usage`` as the server sent it."""

    hits: list[SearchHit]
    session_id: str | None
    mode: str
    usage: dict[str, Any]
    raw: dict[str, Any] = field(repr=False)


def _drop_none(body: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in body.items() if v is not None}


def rerank_body(
    query: str,
    documents: Sequence[str | dict[str, Any]],
    *,
    original_question: str | None = None,
    reasoning: str | None = None,
    mode: str | None = None,
    top_n: int | None = None,
    instruction: str | None = None,
    max_tokens_per_doc: int | None = None,
    return_documents: bool | None = None,
    model: str | None = "acare",
) -> dict[str, Any]:
    """The ``/v2/rerank`` JSON body (fields left ``None`` are not sent)."""
    return _drop_none(
        {
            "model": model,
            "query": query,
            "documents": list(documents),
            "top_n": top_n,
            "original_question": original_question,
            "reasoning": reasoning,
            "mode": mode,
            "instruction": instruction,
            "max_tokens_per_doc": max_tokens_per_doc,
            "return_documents": return_documents,
        }
    )


def search_body(
    query: str,
    *,
    original_question: str | None = None,
    reasoning: str | None = None,
    session_id: str | None = None,
    top_k: int | None = None,
    seen_ids: Sequence[str] | None = None,
    mode: str | None = None,
    instruction: str | None = None,
    first_stage_k: int | None = None,
    max_tokens_per_doc: int | None = None,
    fusion: str | None = None,
) -> dict[str, Any]:
    """The ``/v1/search`` JSON body (fields left ``None`` are not sent)."""
    return _drop_none(
        {
            "query": query,
            "original_question": original_question,
            "reasoning": reasoning,
            "session_id": session_id,
            "top_k": top_k,
            "seen_ids": list(seen_ids) if seen_ids is not None else None,
            "mode": mode,
            "instruction": instruction,
            "first_stage_k": first_stage_k,
            "max_tokens_per_doc": max_tokens_per_doc,
            "fusion": fusion,
        }
    )


def parse_rerank(answer: dict[str, Any]) -> Reranked:
    meta = answer.get("meta") or {}
    hits = [
        RerankHit(int(r["index"]), float(r["relevance_score"]), r.get("document"))
        for r in answer["results"]
    ]
    tokens = int((meta.get("tokens") or {}).get("input_tokens") or 0)
    return Reranked(hits, tokens, meta.get("mode"), answer)


def parse_searched(answer: dict[str, Any]) -> Searched:
    hits = [
        SearchHit(
            doc_id=r["doc_id"],
            text=r["text"],
            title=r.get("title"),
            score=float(r["score"]),
            relevance_score=float(r["relevance_score"]),
            first_stage_rank=int(r["first_stage_rank"]),
            first_stage_score=r.get("first_stage_score"),
            seen=bool(r.get("seen", False)),
        )
        for r in answer["results"]
    ]
    return Searched(hits, answer.get("session_id"), answer["mode"], answer["usage"], answer)


def _message(response: httpx.Response) -> str:
    try:
        return str(response.json().get("message", response.text))
    except (ValueError, AttributeError):
        return response.text


class _Base:
    """What the sync and async clients share: settings, counters and the retry policy; each
    opens its own httpx client over ``transport`` (a test's mock, else the network)."""

    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        *,
        timeout_s: float = 120.0,
        retries: int = 5,
        retry_budget_s: float = 600.0,
        connect_retry_wait_s: float = 1.0,
        transport: httpx.BaseTransport | httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.retries = retries
        self.retry_budget_s = retry_budget_s
        self.connect_retry_wait_s = connect_retry_wait_s
        self.refused = 0
        self.server_errors = 0
        self._count = threading.Lock()
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._timeout = httpx.Timeout(timeout_s)
        self.http = self._open(transport)

    def _open(self, transport: Any) -> Any:
        raise NotImplementedError

    def _url(self, path: str) -> str:
        return f"{self.base_url}{path}"

    def _after(self, response: httpx.Response, deadline: float, url: str) -> float | None:
        """Seconds to wait before trying again, or None when ``response`` is final (raises
        :class:`AcareError` for an error that is)."""
        if response.status_code in RETRY_STATUSES:
            with self._count:
                self.refused += 1
            try:
                wait = max(0.0, float(response.headers.get("retry-after", "1") or 1))
            except ValueError:
                wait = 1.0
            if time.monotonic() + wait > deadline:
                raise AcareError(
                    response.status_code,
                    f"{url}: still refused after {self.retry_budget_s:g} s: "
                    f"HTTP {response.status_code}: {_message(response)}",
                )
            return wait
        if response.status_code >= 400:
            raise AcareError(
                response.status_code, f"{url}: HTTP {response.status_code}: {_message(response)}"
            )
        return None

    def _server_failed(self, response: httpx.Response, idempotent: bool) -> bool:
        """Whether to send a call answered ``response`` again: a 500/502 to a call safe to
        repeat, a 408 to any call (counted in ``server_errors``)."""
        status = response.status_code
        if status not in NOT_RUN_STATUSES and not (idempotent and status in SERVER_ERROR_STATUSES):
            return False
        with self._count:
            self.server_errors += 1
        return True

    def _call(self, path: str, idempotent: bool) -> _Call:
        return _Call(self, self._url(path), idempotent, time.monotonic() + self.retry_budget_s)

    def request(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        *,
        idempotent: bool = False,
    ) -> Any:
        """One call with the retry policy; the decoded JSON answer (None for an empty body),
        awaited on :class:`AsyncAcareClient`. ``idempotent``: the call is safe to repeat, so a
        500/502 answer is retried too."""
        return self._send(method, body, self._call(path, idempotent))

    def _send(self, method: str, body: dict[str, Any] | None, call: _Call) -> Any:
        """Attempts of ``call`` over this client's transport, waiting as ``call`` says."""
        raise NotImplementedError


class _Call:
    """The retry policy of one call (see the module docstring), apart from its transport: after
    each attempt it says how long to wait before the next one (None: the answer is final)."""

    def __init__(self, client: _Base, url: str, idempotent: bool, deadline: float) -> None:
        self.client = client
        self.url = url
        self.idempotent = idempotent
        self.deadline = deadline
        self.failures = 0

    def after_error(self, err: httpx.TransportError) -> float:
        """The wait after a connection error; AcareError once ``retries`` are spent."""
        self.failures += 1
        if self.failures > self.client.retries:
            raise AcareError(0, f"{self.url}: {err}") from err
        return self.client.connect_retry_wait_s

    def after(self, response: httpx.Response) -> float | None:
        """The wait before sending again after ``response``, or None when it is the answer
        (AcareError when it is a final error)."""
        client = self.client
        if self.failures < client.retries and client._server_failed(response, self.idempotent):
            self.failures += 1
            return client.connect_retry_wait_s
        return client._after(response, self.deadline, self.url)


def _decoded(response: httpx.Response) -> Any:
    return response.json() if response.content else None


class AcareClient(_Base):
    """Blocking client; one instance may be shared by threads. See the module docstring."""

    http: httpx.Client

    def _open(self, transport: httpx.BaseTransport | None) -> httpx.Client:
        return httpx.Client(timeout=self._timeout, headers=self._headers, transport=transport)

    def _send(self, method: str, body: dict[str, Any] | None, call: _Call) -> Any:
        while True:
            try:
                response = self.http.request(method, call.url, json=body)
            except httpx.TransportError as err:
                time.sleep(call.after_error(err))
                continue
            if (wait := call.after(response)) is None:
                return _decoded(response)
            time.sleep(wait)

    def rerank(self, query: str, documents: Sequence[str | dict[str, Any]], **fields) -> Reranked:
        """``POST /v2/rerank``; ``fields`` are those of :func:`rerank_body`."""
        return parse_rerank(
            self.request(
                "POST", "/v2/rerank", rerank_body(query, documents, **fields), idempotent=True
            )
        )

    def search(self, query: str, **fields) -> Searched:
        """``POST /v1/search``; ``fields`` are those of :func:`search_body`."""
        return parse_searched(self.request("POST", "/v1/search", search_body(query, **fields)))

    def forget(self, session_id: str) -> bool:
        """``DELETE /v1/sessions/{session_id}``: whether the server had the session."""
        answer = self.request("DELETE", f"/v1/sessions/{quote(session_id, safe='')}")
        return bool(answer and answer.get("deleted"))

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> AcareClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncAcareClient(_Base):
    """The asyncio twin of :class:`AcareClient` (same methods, awaited)."""

    http: httpx.AsyncClient

    def _open(self, transport: httpx.AsyncBaseTransport | None) -> httpx.AsyncClient:
        return httpx.AsyncClient(timeout=self._timeout, headers=self._headers, transport=transport)

    async def _send(self, method: str, body: dict[str, Any] | None, call: _Call) -> Any:
        while True:
            try:
                response = await self.http.request(method, call.url, json=body)
            except httpx.TransportError as err:
                await asyncio.sleep(call.after_error(err))
                continue
            if (wait := call.after(response)) is None:
                return _decoded(response)
            await asyncio.sleep(wait)

    async def rerank(
        self, query: str, documents: Sequence[str | dict[str, Any]], **fields
    ) -> Reranked:
        body = rerank_body(query, documents, **fields)
        return parse_rerank(await self.request("POST", "/v2/rerank", body, idempotent=True))

    async def search(self, query: str, **fields) -> Searched:
        return parse_searched(
            await self.request("POST", "/v1/search", search_body(query, **fields))
        )

    async def forget(self, session_id: str) -> bool:
        answer = await self.request("DELETE", f"/v1/sessions/{quote(session_id, safe='')}")
        return bool(answer and answer.get("deleted"))

    async def aclose(self) -> None:
        await self.http.aclose()

    async def __aenter__(self) -> AsyncAcareClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
