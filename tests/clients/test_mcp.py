"""``acare mcp`` over stdio with the SDK's own client, in-process mode (``--model --index``: the
service app built in the MCP process, no Ray): the tool schemas ask for question and reasoning,
results are structured and equal those of ``/v1/search``, a session skips what it has seen."""

from __future__ import annotations

import asyncio
import sys

import numpy as np
import pytest

pytest.importorskip("mcp")

from mcp import Client, StdioServerParameters  # noqa: E402

from acare_ray.scoring import AgentContext  # noqa: E402

QUERY = "capital population"
QUESTION = "What is the population of the capital of the country where Anna Berg was born?"
REASONING = "Anna Berg was born in Velmoria, so I need the capital of Velmoria."


def test_stdio_tools_search_and_rerank_in_process(tiny_qwen3_dir, index_dir, tiny_scorer):
    from acare_ray.clients.mcp_server import in_process_client

    params = StdioServerParameters(
        command=sys.executable,
        args=[
            "-m",
            "acare_ray.cli",
            "mcp",
            "--model",
            str(tiny_qwen3_dir),
            "--index",
            str(index_dir),
            "--device",
            "cpu",
        ],
        env={"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"},
    )
    args = {"query": QUERY, "question": QUESTION, "reasoning": REASONING, "top_k": 3}
    docs = ["Ostrava is the capital of Velmoria.", "Paris is the capital of France."]

    async def calls():
        async with Client(params, read_timeout_seconds=120) as client:
            tools = {t.name: t for t in (await client.list_tools()).tools}
            first = await client.call_tool("search", args | {"session_id": "t"})
            second = await client.call_tool("search", args | {"session_id": "t"})
            ranked = await client.call_tool(
                "rerank", {"query": QUERY, "documents": docs, "question": QUESTION, "reasoning": ""}
            )
            missing = await client.call_tool("search", {"query": QUERY})
            return tools, first, second, ranked, missing

    tools, first, second, ranked, missing = asyncio.run(calls())
    for tool in tools.values():
        assert {"question", "reasoning"} <= set(tool.input_schema["required"])
        props = tool.input_schema["properties"]
        assert "original question" in props["question"]["description"]
        assert "reasoning" in props["reasoning"]["description"]
        assert tool.output_schema is not None
    assert missing.is_error  # the schema's required context fields are enforced

    async def direct():
        client = in_process_client(str(tiny_qwen3_dir), str(index_dir), "cpu")
        async with client:
            return await client.search(
                QUERY, original_question=QUESTION, reasoning=REASONING, top_k=6
            )

    expected = [h.doc_id for h in asyncio.run(direct()).hits]
    got1 = [r["doc_id"] for r in first.structured_content["results"]]
    got2 = [r["doc_id"] for r in second.structured_content["results"]]
    assert got1 == expected[:3] and got2 == expected[3:6]
    assert first.structured_content["mode"] == "M3"
    # an empty reasoning is left out: mode M2, scores of that context
    assert ranked.structured_content["mode"] == "M2"
    want = tiny_scorer.score(AgentContext(QUERY, question=QUESTION), docs)
    got = {r["index"]: r["relevance_score"] for r in ranked.structured_content["results"]}
    np.testing.assert_allclose([got[0], got[1]], 1 / (1 + np.exp(-want)), atol=1e-5)
