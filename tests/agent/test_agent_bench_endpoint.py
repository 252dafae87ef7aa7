"""``agent-bench --endpoint`` and ``--search-endpoint`` / ``--mcp`` against one real ``acare
serve --index`` app (Ray Serve, started once for the module): the same per-task results as the
same model in-process, with the unseen filter in the bench or in the server's session memory."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from acare_ray.agent.rerankers import EndpointReranker, ScorerReranker
from acare_ray.agent.simulate import run_sessions
from acare_ray.agent.tasks import build_tasks, select_records
from acare_ray.data.io import data_dir
from acare_ray.ranking.fusion import FusionConfig
from acare_ray.testing import free_port, running, wait_for_health

pytestmark = pytest.mark.slow


DOC = Path(__file__).resolve().parents[2] / "docs" / "agents.md"
N_TASKS = 4
# The doc's 100 tasks over every MuSiQue paragraph, cut to 4 tasks over their own paragraphs.
SMALL = {"--tasks 100": f"--tasks {N_TASKS} --corpus tasks"}


def section_7_commands() -> list[str]:
    """The ``acare`` lines of docs/agents.md section 7 (agent-bench through /v1/search)."""
    text = DOC.read_text().split("## 7.", 1)[1]
    blocks = re.findall(r"```bash\n(.*?)```", text, flags=re.S)
    return [ln.strip() for b in blocks for ln in b.splitlines() if ln.strip().startswith("acare ")]


def as_argv(command: str, **swap: str) -> list[str]:
    """A doc command as argv for this interpreter, with literal values swapped for test ones
    (an ``acare`` inside a quoted argument too)."""
    for old, new in swap.items():
        command = command.replace(old, new)
    parts = shlex.split(command)
    assert parts[0] == "acare"
    cli = f"{shlex.quote(sys.executable)} -m acare_ray.cli"
    return [sys.executable, "-m", "acare_ray.cli"] + [
        cli + p[len("acare") :] if p.startswith("acare ") else p for p in parts[1:]
    ]


@pytest.fixture(scope="module")
def served(ray_local, tiny_qwen3_dir, tmp_path_factory, require_data):
    """docs/agents.md section 7's first three commands (4 tasks, the tiny Qwen3, a free port):
    the bench's corpus exported, indexed and served with ``/v1/search``; yields the base URL
    and the folder. One app for the whole module."""
    require_data(data_dir() / "musique")
    workdir = tmp_path_factory.mktemp("agent-search")
    export, index, serve, _ = section_7_commands()
    for command in (export, index):
        done = subprocess.run(
            as_argv(command, **SMALL), cwd=workdir, capture_output=True, text=True, timeout=600
        )
        assert done.returncode == 0, done.stderr[-3000:]
    port = free_port()
    swap = {"./model": str(tiny_qwen3_dir), "8000": str(port)}
    # run from the repository (serve's default --config is relative to it)
    command = as_argv(serve, **swap, **{"agent-index": str(workdir / "agent-index")})
    # on the suite's shared cluster (started once), not a new one of its own
    command += ["--address", ray_local.get_runtime_context().gcs_address]
    env = {"RAY_USAGE_STATS_ENABLED": "0", "ACARE_API_KEY": ""}
    log = workdir / "serve.log"
    base = f"http://127.0.0.1:{port}"
    with running(command, log, env) as process:
        wait_for_health(base, process, log)
        yield {"base": base, "port": port, "workdir": workdir}


def test_endpoint_gives_the_same_per_task_results_as_in_process(served, tiny_scorer):
    from acare_ray.data.musique import load_musique

    served = served["base"]
    tasks, corpus = build_tasks(select_records(load_musique(), N_TASKS, seed=0))
    # The fused system (issue 20 part 2f): the endpoint gets the BM25 scores and fuses them.
    for mode, fusion in (("M0", None), ("M3", None), ("M3", "rrf:k=5,weight=0.5")):
        config = FusionConfig.parse(fusion) if fusion else None
        local, _ = run_sessions(tasks, corpus, ScorerReranker(tiny_scorer, mode, fusion=config))
        remote = EndpointReranker(served, mode=mode, fusion=fusion)
        try:
            one, _ = run_sessions(tasks, corpus, remote, agents=1)
            four, _ = run_sessions(tasks, corpus, remote, agents=4)
        finally:
            remote.close()
        expected = [r.outcome() for r in local]
        assert [r.outcome() for r in one] == expected, mode
        assert [r.outcome() for r in four] == expected, mode


def without_timings(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in row.items() if k not in ("rerank_s", "tokens")} for row in rows]


def test_search_endpoint_and_mcp_give_the_in_process_task_results(served, tiny_qwen3_dir):
    """docs/agents.md section 7's agent-bench command (issue 24 item 5): through /v1/search
    (server-side first stage, rerank and session memory) and through the MCP search tool over
    stdio, every task's result (success, searches, documents shown per search) equals the
    in-process M3 with the bench's own unseen filter; the per-phase times are reported."""
    from acare_ray.cli import main

    base, workdir = served["base"], served["workdir"]
    command = section_7_commands()[-1]
    swap = SMALL | {
        "./model": str(tiny_qwen3_dir),
        "http://127.0.0.1:8000": base,
        "agent-search": str(workdir / "agent-search"),
    }
    argv = as_argv(command, **swap)[3:]  # main() takes the arguments after the program
    assert "--search-endpoint" in argv and "--mcp" in argv
    code = main([*argv, "--device", "cpu", "--resamples", "50", "--progress-every", "0"])
    assert code == 0
    report = json.loads((workdir / "agent-search" / "agent_bench.json").read_text())
    assert list(report["systems"]) == ["bm25", "M3", "M3 (search)", "auto (mcp)"]
    local = report["tasks"]["M3"]
    assert len(local) == N_TASKS
    assert any(len(r["searches"]) > len(r["searches_per_step"]) for r in local)  # rephrased
    for name in ("M3 (search)", "auto (mcp)"):
        assert without_timings(report["tasks"][name]) == without_timings(local), name
    for name, summary in report["systems"].items():
        phases = summary["phases_ms"]
        assert set(phases) == {"search", "first_stage", "session", "rerank"}
        for phase, stats in phases.items():
            if name in ("M3 (search)", "auto (mcp)") or (phase != "session"):
                assert set(stats) == {"mean", "p50", "p95"}, (name, phase)
                assert all(v >= 0 for v in stats.values()), (name, phase)
        if name in ("bm25", "M3"):
            assert phases["session"] is None  # no session store on the client side
    markdown = (workdir / "agent-search" / "agent_bench.md").read_text()
    assert "| M3 (search) |" in markdown and "session store" in markdown


def test_search_endpoint_keeps_task_results_with_four_agents_in_flight(served, tiny_scorer):
    """Four sessions at once share the one SessionStore: each task's results stay those of the
    in-process M0 (no session sees another's documents)."""
    from acare_ray.agent.searchers import SearchEndpoint
    from acare_ray.data.musique import load_musique

    tasks, corpus = build_tasks(select_records(load_musique(), N_TASKS, seed=0))
    local, _ = run_sessions(tasks, corpus, ScorerReranker(tiny_scorer, "M0"))
    remote = SearchEndpoint(served["base"], mode="M0")
    try:
        four, _ = run_sessions(tasks, corpus, remote, agents=4)
        # each task's session was forgotten when the task ended
        for task in tasks:
            path = f"/v1/sessions/{remote.session_id(task.task_id)}"
            assert remote.client.request("GET", path)["seen_ids"] == []
    finally:
        remote.close()
    assert [r.outcome() for r in four] == [r.outcome() for r in local]
    searches = [s for r in four for s in r.searches]
    assert all(s.session_s is not None and s.session_s >= 0 for s in searches)
    assert all(s.first_stage_s is not None and s.first_stage_s >= 0 for s in searches)
