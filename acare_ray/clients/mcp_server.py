"""``acare mcp``: the search and rerank tools for MCP clients (the official ``mcp`` SDK,
``MCPServer`` with structured output), over stdio or streamable HTTP.

Both tools ask the agent for its original question and its current reasoning, which is what
lets the reranker judge a page by what the agent still needs. They talk to the service through
:class:`acare_ray.clients.http_client.AsyncAcareClient`: to a running ``acare serve`` (``--endpoint``), or to
the same FastAPI app built in this process (``--model`` and ``--index``; no Ray, for a laptop).

- ``search``: ``POST /v1/search``: first stage, rerank with the context, unseen documents of the
  ``session_id`` first;
- ``rerank``: ``POST /v2/rerank`` over documents the agent already has.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Annotated, Any

from pydantic import BaseModel, Field

QUESTION_HELP = (
    "The user's original question for this whole task (the same on every call of the task)."
)
REASONING_HELP = (
    "Your current reasoning: what you have found so far, what is still missing, and why you "
    "are searching now (a few sentences; the end matters most)."
)
QUERY_HELP = "The search query for this step (a short sub-query)."
SESSION_HELP = (
    "An id for this task, the same on every search of it: pages already returned to it come "
    "after new ones."
)


class SearchHitOut(BaseModel):
    doc_id: str
    title: str | None = None
    text: str
    relevance_score: float = Field(description="0..1; higher is more useful for the question.")
    first_stage_rank: int = Field(description="Rank the keyword search gave it (1 = first).")
    seen: bool = Field(description="Already returned earlier in this session.")


class SearchTimings(BaseModel):
    """Where the search's time went on the server (its ``usage``), for harnesses that measure."""

    first_stage_ms: float | None = None
    rerank_ms: float | None = None
    session_ms: float | None = Field(None, description="Reading and writing session memory.")
    candidates: int | None = Field(None, description="Documents the first stage returned.")


class SearchOut(BaseModel):
    results: list[SearchHitOut] = Field(description="Best first, unseen pages first.")
    mode: str = Field(description="Which context fields the reranker read (M0..M3).")
    tokens: int = Field(description="Tokens the reranker scored.")
    timings: SearchTimings | None = None


class RerankHitOut(BaseModel):
    index: int = Field(description="Position of the document in the request.")
    relevance_score: float
    text: str


class RerankOut(BaseModel):
    results: list[RerankHitOut] = Field(description="Best first.")
    mode: str | None = None
    tokens: int


def _text(value: str | None) -> str | None:
    return value if value and value.strip() else None


def build_server(client: Any, name: str = "acare") -> Any:
    """An ``MCPServer`` whose tools call ``client`` (an :class:`AsyncAcareClient`)."""
    from mcp.server.mcpserver import MCPServer

    server = MCPServer(
        name,
        instructions=(
            "Search with `search` (give your original question and current reasoning every "
            "time, and one session_id per task); rerank pages you already have with `rerank`."
        ),
    )

    @server.tool(structured_output=True)
    async def search(
        query: Annotated[str, Field(description=QUERY_HELP)],
        question: Annotated[str, Field(description=QUESTION_HELP)],
        reasoning: Annotated[str, Field(description=REASONING_HELP)],
        session_id: Annotated[str | None, Field(description=SESSION_HELP)] = None,
        top_k: Annotated[int, Field(ge=1, le=100, description="Pages to return.")] = 5,
    ) -> SearchOut:
        """Search the corpus; results are reranked with your question and reasoning."""
        found = await client.search(
            query,
            original_question=_text(question),
            reasoning=_text(reasoning),
            session_id=session_id,
            top_k=top_k,
        )
        return SearchOut(
            results=[SearchHitOut.model_validate(h, from_attributes=True) for h in found.hits],
            mode=found.mode,
            tokens=int(found.usage.get("input_tokens", 0)),
            timings=SearchTimings(**{k: found.usage.get(k) for k in SearchTimings.model_fields}),
        )

    @server.tool(structured_output=True)
    async def rerank(
        query: Annotated[str, Field(description=QUERY_HELP)],
        documents: Annotated[list[str], Field(min_length=1, description="The pages to order.")],
        question: Annotated[str, Field(description=QUESTION_HELP)],
        reasoning: Annotated[str, Field(description=REASONING_HELP)],
        top_n: Annotated[int | None, Field(ge=1, description="Return only the best n.")] = None,
    ) -> RerankOut:
        """Order pages you already have by how useful they are for your question now."""
        answer = await client.rerank(
            query,
            documents,
            original_question=_text(question),
            reasoning=_text(reasoning),
            top_n=top_n,
        )
        return RerankOut(
            results=[
                RerankHitOut(
                    index=h.index, relevance_score=h.relevance_score, text=documents[h.index]
                )
                for h in answer.hits
            ],
            mode=answer.mode,
            tokens=answer.tokens,
        )

    return server


def in_process_client(model: str, index: str, device: str | None = None) -> Any:
    """An :class:`AsyncAcareClient` wired to the service app built here (no Ray, no network)."""
    import httpx

    from acare_ray.clients.http_client import AsyncAcareClient
    from acare_ray.online.http import single_model_api
    from acare_ray.online.models import short_model_name
    from acare_ray.online.search_routes import SearchSettings, search_routes
    from acare_ray.online.service import RerankService
    from acare_ray.online.serving import client_of, inline_score
    from acare_ray.ranking.checkpoint_settings import read_calibration, read_fusion
    from acare_ray.scoring import Scorer
    from acare_ray.scoring.golden import read_golden
    from acare_ray.search.sessions import LocalSessions

    fitted = read_fusion(model)
    scorer = Scorer.from_pretrained(model, device=device)
    # the checkpoint's golden cases and calibration, as a Serve replica loads them
    service = RerankService(
        scorer, short_model_name(model), None, read_golden(model), read_calibration(model)
    )
    settings = SearchSettings(index=str(index))

    routes = search_routes(
        settings.first_stage(),
        LocalSessions(),
        settings,
        max_documents=service.limits.max_documents,
        client_of=client_of,
    )
    app = single_model_api(
        service, inline_score(service), extra_routes=routes, fitted_fusion=fitted
    )
    return AsyncAcareClient("http://acare.local", transport=httpx.ASGITransport(app=app))


def run(args: argparse.Namespace) -> int:
    from acare_ray.clients.http_client import AsyncAcareClient

    if (args.endpoint is None) == (args.model is None):
        print("acare mcp: error: give --endpoint, or --model with --index", file=sys.stderr)
        return 2
    if args.endpoint is not None:
        key = os.environ.get(args.api_key_env) if args.api_key_env else None
        client = AsyncAcareClient(args.endpoint, key or None, timeout_s=args.timeout_s)
    else:
        if args.index is None:
            print("acare mcp: error: --model needs --index", file=sys.stderr)
            return 2
        client = in_process_client(args.model, args.index, args.device)
    server = build_server(client)
    if args.transport == "stdio":
        server.run("stdio")
    else:
        print(f"acare mcp: http://{args.host}:{args.port}{args.path}", file=sys.stderr)
        server.run(
            "streamable-http", host=args.host, port=args.port, streamable_http_path=args.path
        )
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "mcp", help="MCP server with the search and rerank tools (stdio or streamable HTTP)"
    )
    parser.add_argument("--endpoint", help="base URL of a running acare serve")
    parser.add_argument(
        "--api-key-env",
        default="ACARE_API_KEY",
        help="environment variable with the service's bearer key (default ACARE_API_KEY)",
    )
    parser.add_argument("--model", help="serve in this process: model id or checkpoint")
    parser.add_argument("--index", help="with --model: index folder from acare index")
    parser.add_argument("--device", help="with --model: cuda / cpu")
    parser.add_argument("--transport", choices=["stdio", "http"], default="stdio")
    parser.add_argument("--host", default="127.0.0.1", help="http transport: host")
    parser.add_argument("--port", type=int, default=8765, help="http transport: port")
    parser.add_argument("--path", default="/mcp", help="http transport: path")
    parser.add_argument("--timeout-s", type=float, default=120.0, help="per-call timeout")
    parser.set_defaults(func=run)
