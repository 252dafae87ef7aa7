"""The agent plug-ins end to end, through the commands docs/agents.md gives: ``acare index``,
``acare serve --index ... --replicas 2`` (a real Serve app), session memory shared by the two
replicas, the Python client, ``acare mcp`` over streamable HTTP with the SDK's own client, and
the LangChain and LlamaIndex adapters (the scores the server returned are those of the full
context, so it received the question and the reasoning)."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest
from agents_support import CORPUS
from scipy.special import expit

from acare_ray.scoring import AgentContext
from acare_ray.testing import free_port, running, wait_for_health, wait_until

# docs/agents.md section 7, run by tests/agent/test_agent_bench_endpoint.py.
AGENT_BENCH_COMMANDS = [
    "acare agent-bench --tasks 100 --seed 0 --export-corpus agent-corpus.jsonl",
    "acare index --input agent-corpus.jsonl --out agent-index",
    "acare serve --model ./model --index agent-index --port 8000",
    "acare agent-bench --tasks 100 --seed 0 --model ./model --modes M3 --search-endpoint "
    'http://127.0.0.1:8000 --mcp "acare mcp --endpoint http://127.0.0.1:8000" --out agent-search',
]

pytestmark = pytest.mark.slow

DOC = Path(__file__).resolve().parents[2] / "docs" / "agents.md"
QUERY = "capital of Velmoria population"
QUESTION = "What is the population of the capital of the country where Anna Berg was born?"
REASONING = "Anna Berg was born in Velmoria; I need its capital's population."


def doc_blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", DOC.read_text(), flags=re.S)


def doc_commands() -> list[str]:
    """Every ``acare ...`` line of the doc's bash blocks."""
    return [
        line.strip()
        for block in doc_blocks("bash")
        for line in block.splitlines()
        if line.strip().startswith("acare ")
    ]


def argv(command: str, **swap: str) -> list[str]:
    """A doc command as argv for this interpreter, with literal values swapped for test ones."""
    for old, new in swap.items():
        command = command.replace(old, new)
    parts = command.split()
    assert parts[0] == "acare"
    return [sys.executable, "-m", "acare_ray.cli", *parts[1:]]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("agents")
    (folder / "corpus.jsonl").write_text("".join(json.dumps(r) + "\n" for r in CORPUS))
    return folder


@pytest.fixture(scope="module")
def served(ray_local, workdir, tiny_qwen3_dir):
    """docs/agents.md sections 1 and 2, run as written (model and port swapped)."""
    commands = doc_commands()
    index = next(c for c in commands if c.startswith("acare index"))
    done = subprocess.run(argv(index), cwd=workdir, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert f"indexed {len(CORPUS)} documents" in done.stdout
    port = free_port()
    serve = next(c for c in commands if c.startswith("acare serve"))
    swap = {"./model": str(tiny_qwen3_dir), "my-index": str(workdir / "my-index")}
    command = argv(serve, **swap, **{"8000": str(port)})
    # on the suite's shared cluster (started once), not a new one of its own
    command += ["--address", ray_local.get_runtime_context().gcs_address]
    base = f"http://127.0.0.1:{port}"
    log = workdir / "serve.log"
    env = {"RAY_USAGE_STATS_ENABLED": "0", "ACARE_API_KEY": ""}
    with running(command, log, env) as process:
        wait_for_health(base, process, log, timeout_s=300)
        replicas: set[str] = set()

        def both_replicas_up() -> bool:
            replicas.add(httpx.get(f"{base}/v1/status", timeout=10).json()["replica"])
            return len(replicas) == 2

        wait_until(both_replicas_up, process, log, "the second replica")
        yield {"base": base, "port": port, "workdir": workdir}


@pytest.fixture(scope="module")
def scorer(tiny_scorer):
    return tiny_scorer


def search(base: str, **body) -> httpx.Response:
    return httpx.post(f"{base}/v1/search", json={"query": QUERY, **body}, timeout=120)


def test_two_replicas_share_one_session_memory(served):
    """Consecutive searches of one session land on both replicas, and none returns a page an
    earlier one (on either replica) returned: the sequence is the reranker's full order."""
    base = served["base"]
    full = search(base, original_question=QUESTION, reasoning=REASONING, top_k=len(CORPUS))
    assert full.status_code == 200, full.text
    order = [h["doc_id"] for h in full.json()["results"]]
    assert sorted(order) == sorted(r["doc_id"] for r in CORPUS)
    replicas, returned = [], []
    for _ in range(len(CORPUS)):
        answer = search(
            base, original_question=QUESTION, reasoning=REASONING, top_k=1, session_id="two"
        )
        assert answer.status_code == 200, answer.text
        (hit,) = answer.json()["results"]
        assert hit["seen"] is False
        returned.append(hit["doc_id"])
        replicas.append(answer.headers["x-acare-replica"])
    assert returned == order
    assert len(set(replicas)) == 2, replicas
    seen = httpx.get(f"{base}/v1/sessions/two", timeout=30).json()["seen_ids"]
    assert seen == order
    # every page seen: the next search returns the best ones again, marked seen
    again = search(base, original_question=QUESTION, reasoning=REASONING, top_k=2, session_id="two")
    assert [(h["doc_id"], h["seen"]) for h in again.json()["results"]] == [
        (order[0], True),
        (order[1], True),
    ]
    assert httpx.delete(f"{base}/v1/sessions/two", timeout=30).json()["deleted"] is True


def test_doc_python_client_snippet_runs(served, capsys):
    (snippet,) = [b for b in doc_blocks("python") if "AcareClient" in b]
    exec(compile(snippet.replace("http://127.0.0.1:8000", served["base"]), "agents.md", "exec"), {})
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3
    full = search(served["base"], original_question=QUESTION, reasoning=REASONING, top_k=3)
    assert [line.split()[0] for line in lines] == [h["doc_id"] for h in full.json()["results"]]
    seen = httpx.get(f"{served['base']}/v1/sessions/task-17", timeout=30).json()["seen_ids"]
    assert seen == []  # the snippet forgot its session


def test_mcp_over_streamable_http_against_the_service(served, scorer):
    pytest.importorskip("mcp")
    from mcp import Client

    base, workdir = served["base"], served["workdir"]
    (command,) = [c for c in doc_commands() if "--transport http" in c]
    port = free_port()
    log = workdir / "mcp.log"
    swap = {"http://127.0.0.1:8000": base, "8765": str(port)}
    with running(argv(command, **swap), log) as process:
        url = f"http://127.0.0.1:{port}/mcp"
        wait_until(lambda: httpx.get(url, timeout=2).status_code < 500, process, log, "acare mcp")

        async def calls():
            async with Client(url) as client:
                tools = {t.name: t for t in (await client.list_tools()).tools}
                found = await client.call_tool(
                    "search",
                    {"query": QUERY, "question": QUESTION, "reasoning": REASONING, "top_k": 3},
                )
                docs = [r["text"] for r in CORPUS[:4]]
                ranked = await client.call_tool(
                    "rerank",
                    {
                        "query": QUERY,
                        "documents": docs,
                        "question": QUESTION,
                        "reasoning": REASONING,
                    },
                )
                return tools, found, ranked, docs

        tools, found, ranked, docs = asyncio.run(calls())
    assert set(tools) == {"search", "rerank"}
    for tool in tools.values():
        assert {"question", "reasoning"} <= set(tool.input_schema["required"])
        assert tool.output_schema is not None
    assert not found.is_error and not ranked.is_error
    expected = search(base, original_question=QUESTION, reasoning=REASONING, top_k=3).json()
    assert [r["doc_id"] for r in found.structured_content["results"]] == [
        h["doc_id"] for h in expected["results"]
    ]
    assert found.structured_content["mode"] == "M3" == ranked.structured_content["mode"]
    want = scorer.score(AgentContext(QUERY, question=QUESTION, reasoning=REASONING), docs)
    got = {r["index"]: r["relevance_score"] for r in ranked.structured_content["results"]}
    np.testing.assert_allclose([got[i] for i in range(4)], expit(want), atol=1e-5)


def full_context_relevance(scorer, texts: list[str]) -> np.ndarray:
    return expit(scorer.score(AgentContext(QUERY, question=QUESTION, reasoning=REASONING), texts))


def test_langchain_doc_snippet_forwards_question_and_reasoning(served, scorer, capsys):
    pytest.importorskip("langchain_core")
    (snippet,) = [b for b in doc_blocks("python") if "langchain" in b]
    scope: dict = {}
    exec(
        compile(snippet.replace("http://127.0.0.1:8000", served["base"]), "agents.md", "exec"),
        scope,
    )
    texts = [d.page_content for d in scope["docs"]]
    want = full_context_relevance(scorer, texts)
    without = expit(scorer.score(AgentContext(QUERY), texts))
    assert not np.allclose(want, without, atol=1e-4)  # the context changes the scores
    printed = [line.split(" ", 1) for line in capsys.readouterr().out.splitlines()]
    best = np.argsort(-want, kind="stable")[:2]
    assert [text for _, text in printed] == [texts[i] for i in best]
    np.testing.assert_allclose([float(s) for s, _ in printed], want[best], atol=1e-3)
    # per call, async
    kept = asyncio.run(
        scope["reranker"].acompress_documents(
            scope["docs"], QUERY, question=QUESTION, reasoning=REASONING
        )
    )
    np.testing.assert_allclose([d.metadata["relevance_score"] for d in kept], want[best], atol=1e-5)


def test_llamaindex_postprocessor_forwards_question_and_reasoning(served, scorer):
    pytest.importorskip("llama_index.core")
    from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode

    from acare_ray.clients.llamaindex import AcareNodePostprocessor

    texts = [r["text"] for r in CORPUS[:5]]
    nodes = [NodeWithScore(node=TextNode(text=t), score=0.0) for t in texts]
    post = AcareNodePostprocessor(endpoint=served["base"], top_n=3).with_context(
        QUESTION, REASONING
    )
    kept = post.postprocess_nodes(nodes, QueryBundle(QUERY))
    want = full_context_relevance(scorer, texts)
    best = np.argsort(-want, kind="stable")[:3]
    assert [n.node.get_content() for n in kept] == [texts[i] for i in best]
    np.testing.assert_allclose([n.score for n in kept], want[best], atol=1e-5)


def test_mcp_over_stdio_against_the_service(served):
    pytest.importorskip("mcp")
    from mcp import Client, StdioServerParameters

    base = served["base"]
    (command,) = [c for c in doc_commands() if c.startswith("acare mcp") and "--transport" not in c]
    full = argv(command, **{"http://127.0.0.1:8000": base})
    params = StdioServerParameters(command=full[0], args=full[1:], env={"ACARE_API_KEY": ""})
    args = {"query": QUERY, "question": QUESTION, "reasoning": REASONING, "top_k": 2}

    async def calls():
        async with Client(params, read_timeout_seconds=120) as client:
            return await client.call_tool("search", args | {"session_id": "stdio"})

    found = asyncio.run(calls())
    assert not found.is_error, found.content
    expected = search(base, original_question=QUESTION, reasoning=REASONING, top_k=2).json()
    assert [r["doc_id"] for r in found.structured_content["results"]] == [
        h["doc_id"] for h in expected["results"]
    ]
    seen = httpx.get(f"{base}/v1/sessions/stdio", timeout=30).json()["seen_ids"]
    assert seen == [h["doc_id"] for h in expected["results"]]


def test_every_command_of_the_doc_is_run_by_a_test():
    """Sections 1 to 5 by this module; section 7 (agent-bench through /v1/search and MCP) by
    tests/agent/test_agent_bench_endpoint.py, which reads the same lines."""
    assert doc_commands() == [
        "acare index --input corpus.jsonl --out my-index",
        "acare serve --model ./model --index my-index --replicas 2 --port 8000",
        "acare mcp --endpoint http://127.0.0.1:8000",
        "acare mcp --endpoint http://127.0.0.1:8000 --transport http --port 8765",
        *AGENT_BENCH_COMMANDS,
    ]
