"""Server-side systems: each agent search is one ``POST /v1/search`` (or one call of the MCP
``search`` tool), and the server's session memory, not the bench, keeps the agent from being
shown a document twice.

A :class:`SessionSearcher` gets the search as the agent would send it (:class:`ServerSearch`:
session id, sub-query, original question, reasoning) and returns the server's answer
(:class:`SessionHits`): every hit in the served order with the server's ``seen`` flag, the
tokens the reranker scored and the server's time per phase (first stage, rerank, session store;
``/v1/search``'s ``usage``). :func:`acare_ray.agent.simulate.run_task` keeps the unseen hits,
which is what the client-side filter returns for a pointwise reranker without fusion: the same
candidates (the first stage's top ``first_stage_k``), the same order among the unseen ones (ties
by first-stage rank on both sides). A fused system can differ: the server fuses over every
candidate, seen ones included, the client over the unseen ones only.

- :class:`SearchEndpoint`: ``POST {url}/v1/search`` through :class:`acare_ray.clients.http_client.AcareClient`
  with ``mode``, ``fusion`` (``none`` for an unfused system, so a checkpoint's fitted setting
  does not apply), ``first_stage_k`` and ``top_k``; the session is forgotten
  (``DELETE /v1/sessions/{id}``) when its task ends.
- :class:`McpSearch`: the ``search`` tool of ``acare mcp`` (streamable HTTP URL, or a command
  started over stdio) through the official MCP SDK client; the tool takes no mode, fusion or
  first-stage depth, so the server's defaults apply, and sessions expire with the server's TTL.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import shlex
import threading
import uuid
from dataclasses import asdict, dataclass
from typing import Any, Protocol

from acare_ray.agent.rerankers import EndpointError, fusion_setting


@dataclass(frozen=True)
class ServerSearch:
    """One agent search as it goes to the server (the fields of a ``/v1/search`` body that the
    agent sets; not :class:`acare_ray.eval.session_replay.SessionSearch`, a replayed search's labels)."""

    session_id: str
    query: str
    original_question: str
    reasoning: str
    top_k: int
    first_stage_k: int


@dataclass(frozen=True)
class SessionHit:
    doc_id: str
    text: str  # what the reranker read: title and text on two lines, as the index serves it
    seen: bool


@dataclass(frozen=True)
class SessionHits:
    """The server's answer: ``hits`` in the served order (unseen first); the server's phase
    times in seconds (None when the server did not report one); ``candidates`` it reranked."""

    hits: tuple[SessionHit, ...]
    tokens: int
    first_stage_s: float | None
    rerank_s: float | None
    session_s: float | None
    candidates: int | None

    @classmethod
    def parse(
        cls, results: list[dict[str, Any]], tokens: int | None, timings: dict[str, Any]
    ) -> SessionHits:
        """From a server's ``results``, its ``tokens`` count and its ``timings`` (the phase
        times in milliseconds under ``*_ms`` keys, and ``candidates``), as both the HTTP
        usage block and the MCP tool's structured answer carry them."""
        return cls(
            hits=_hits(results),
            tokens=int(tokens or 0),
            first_stage_s=_seconds(timings, "first_stage_ms"),
            rerank_s=_seconds(timings, "rerank_ms"),
            session_s=_seconds(timings, "session_ms"),
            candidates=timings.get("candidates"),
        )


class SessionSearcher(Protocol):
    name: str
    server_sessions: bool  # True: run_task sends whole searches here (no client-side filter)

    def session_id(self, task_id: str) -> str:
        """A session id for ``task_id``, unique to this system's run."""
        ...

    def search(self, request: ServerSearch) -> SessionHits: ...

    def end_session(self, session_id: str) -> None:
        """The task is over (free the server's memory of it where the interface allows)."""
        ...


def _seconds(usage: dict[str, Any], key: str) -> float | None:
    value = usage.get(key)
    return None if value is None else float(value) / 1000


def _hits(results: list[dict[str, Any]]) -> tuple[SessionHit, ...]:
    return tuple(
        SessionHit(
            doc_id=str(r["doc_id"]),
            text=f"{r['title']}\n{r['text']}" if r.get("title") else r["text"],
            seen=bool(r["seen"]),
        )
        for r in results
    )


class SearchEndpoint:
    """``POST {url}/v1/search`` in ``mode`` (with ``fusion``: the fused system
    ``<mode>+<fusion>``); named ``<mode>[+<fusion>] (search)``. Retries as
    :class:`acare_ray.agent.rerankers.EndpointReranker`; ``refused`` counts 503/429 answers."""

    def __init__(
        self,
        url: str,
        mode: str = "auto",
        api_key: str | None = None,
        fusion: str | None = None,
        timeout_s: float = 120.0,
        retries: int = 5,
        retry_budget_s: float = 600.0,
    ) -> None:
        from acare_ray.clients.http_client import AcareClient

        self.client = AcareClient(
            url, api_key, timeout_s=timeout_s, retries=retries, retry_budget_s=retry_budget_s
        )
        self.mode = mode
        self.fusion = fusion_setting(fusion)
        self.name = (f"{mode}+{self.fusion}" if self.fusion else mode) + " (search)"
        self.server_sessions = True
        self.run_id = uuid.uuid4().hex[:12]

    @property
    def refused(self) -> int:
        return self.client.refused

    def session_id(self, task_id: str) -> str:
        return f"agent-bench-{self.run_id}-{task_id}"

    def body(self, request: ServerSearch) -> dict[str, Any]:
        from acare_ray.clients.http_client import search_body

        return search_body(**asdict(request), mode=self.mode, fusion=self.fusion or "none")

    def search(self, request: ServerSearch) -> SessionHits:
        from acare_ray.clients.http_client import AcareError

        try:
            answer = self.client.request("POST", "/v1/search", self.body(request))
        except AcareError as err:
            raise EndpointError(str(err)) from err
        usage = answer.get("usage") or {}
        return SessionHits.parse(answer["results"], usage.get("input_tokens"), usage)

    def end_session(self, session_id: str) -> None:
        from acare_ray.clients.http_client import AcareError

        try:
            self.client.forget(session_id)
        except AcareError as err:
            raise EndpointError(str(err)) from err

    def close(self) -> None:
        self.client.close()


class McpSearch:
    """The ``search`` tool of an MCP server: ``target`` is a streamable HTTP URL
    (``http://host:port/mcp``) or a command line that starts the server over stdio (``acare mcp
    --endpoint URL``). One client session on a private event loop thread, shared by the bench's
    threads. Named ``auto (mcp)``: the tool has no mode or fusion field."""

    name = "auto (mcp)"
    server_sessions = True

    def __init__(self, target: str, timeout_s: float = 600.0) -> None:
        self.target = target
        self.timeout_s = timeout_s
        self.run_id = uuid.uuid4().hex[:12]
        self.client: Any = None
        self._stop: asyncio.Event | None = None
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        ready: concurrent.futures.Future[None] = concurrent.futures.Future()
        # The client's context is entered and left in one task (anyio's cancel scopes ask it).
        self.main = asyncio.run_coroutine_threadsafe(self._hold(ready), self.loop)
        try:
            ready.result()
        except BaseException:
            self.close()
            raise

    async def _hold(self, ready: concurrent.futures.Future[None]) -> None:
        from mcp import Client, StdioServerParameters

        try:
            if self.target.startswith(("http://", "https://")):
                server: Any = self.target
            else:
                command = shlex.split(self.target)
                if not command:
                    raise ValueError("--mcp: empty command")
                # The bench's environment (ACARE_API_KEY, PATH, PYTHONPATH), not the SDK's subset.
                server = StdioServerParameters(
                    command=command[0], args=command[1:], env=dict(os.environ)
                )
            self._stop = asyncio.Event()
            async with Client(server, read_timeout_seconds=self.timeout_s) as client:
                self.client = client
                ready.set_result(None)
                await self._stop.wait()
        except BaseException as err:
            if ready.done():
                raise
            ready.set_exception(err)

    def _call(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result()

    def session_id(self, task_id: str) -> str:
        return f"agent-bench-{self.run_id}-{task_id}"

    def search(self, request: ServerSearch) -> SessionHits:
        arguments = {
            "query": request.query,
            "question": request.original_question,
            "reasoning": request.reasoning,
            "session_id": request.session_id,
            "top_k": request.top_k,
        }
        result = self._call(self.client.call_tool("search", arguments))
        if result.is_error or result.structured_content is None:
            raise EndpointError(f"MCP search tool failed: {result.content}")
        out = result.structured_content
        return SessionHits.parse(out["results"], out.get("tokens"), out.get("timings") or {})

    def end_session(self, session_id: str) -> None:
        """Nothing to do: the tool set has no forget; the server's TTL frees the session."""

    def close(self) -> None:
        if self._stop is not None:
            self.loop.call_soon_threadsafe(self._stop.set)
        try:
            self.main.result(timeout=60)
        except Exception:  # noqa: BLE001 - already reported by the call that failed
            pass
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=30)
            self.loop.close()
