"""``acare agent-bench`` on a handful of MuSiQue tasks: the oracle, BM25 and the tiny Qwen3."""

from __future__ import annotations

import json

import pytest

from acare_ray.agent.bench import AgentBenchConfig
from acare_ray.agent.rerankers import (
    EndpointReranker,
    FirstStageOrder,
    OracleReranker,
    RerankRequest,
    ScorerReranker,
)
from acare_ray.agent.simulate import agent_reasoning, reformulate, run_sessions, run_task
from acare_ray.agent.tasks import build_tasks, select_records
from acare_ray.data.io import data_dir
from acare_ray.testing import json_stub_server

N_TASKS = 6


@pytest.fixture(scope="module")
def records(require_data):
    from acare_ray.data.musique import load_musique

    require_data(data_dir() / "musique")
    return select_records(load_musique(), N_TASKS, seed=0)


@pytest.fixture(scope="module")
def bench(records):
    return build_tasks(records)


def oracle_for(tasks):
    return OracleReranker({(t.task_id, k): g for t in tasks for k, g in enumerate(t.gold_steps)})


def outcomes(results):
    return [r.outcome() for r in results]


def test_tasks_and_corpus(bench):
    tasks, corpus = bench
    assert len(tasks) == N_TASKS
    assert len(set(corpus.texts)) == len(corpus) == len(set(corpus.ids))
    for task in tasks:
        assert len(task.gold_steps) == len(task.steps)
        assert set(task.gold_steps) <= task.gold <= set(corpus.ids)


def test_oracle_solves_every_task_in_one_search_per_step(bench):
    tasks, corpus = bench
    results, _ = run_sessions(tasks, corpus, oracle_for(tasks))
    for task, result in zip(tasks, results):
        assert result.solved
        assert result.n_searches == len(task.steps)
        assert result.searches_per_step == (1,) * len(task.steps)
        assert result.session_recall == 1.0


def test_bm25_needs_at_least_as_many_searches_as_the_oracle(bench):
    tasks, corpus = bench
    oracle, _ = run_sessions(tasks, corpus, oracle_for(tasks))
    bm25, _ = run_sessions(tasks, corpus, FirstStageOrder())
    for a, b in zip(oracle, bm25):
        assert b.n_searches >= a.n_searches
        assert b.steps_solved <= a.steps_solved


@pytest.fixture(scope="module")
def tiny_m3(bench, tiny_scorer):
    """The tiny random Qwen3 in M3 on every task, one session at a time."""
    tasks, corpus = bench
    return run_sessions(tasks, corpus, ScorerReranker(tiny_scorer, "M3"), agents=1)[0]


def test_no_document_is_returned_twice_in_a_session(bench, tiny_m3):
    tasks, corpus = bench
    sessions = list(tiny_m3)
    for reranker in (FirstStageOrder(), oracle_for(tasks)):
        # budget 5 and depth 30: failing steps keep searching, so repeats would show
        sessions += [run_task(task, corpus, reranker, budget=5, depth=30) for task in tasks]
    for result in sessions:
        returned = [d for s in result.searches for d in s.returned]
        assert len(returned) == len(set(returned)), result.task_id
        assert all(len(s.returned) <= 30 for s in result.searches)


def test_results_are_deterministic_across_runs_and_agents(bench, tiny_scorer, tiny_m3):
    tasks, corpus = bench
    reranker = ScorerReranker(tiny_scorer, "M3")
    again, _ = run_sessions(tasks, corpus, reranker, agents=1)
    four, _ = run_sessions(tasks, corpus, reranker, agents=4)
    assert outcomes(tiny_m3) == outcomes(again) == outcomes(four)
    assert [r.task_id for r in four] == [t.task_id for t in tasks]
    oracle = oracle_for(tasks)
    assert outcomes(run_sessions(tasks, corpus, oracle, agents=1)[0]) == outcomes(
        run_sessions(tasks, corpus, oracle, agents=4)[0]
    )


def test_a_ramp_starts_the_first_agents_apart_and_changes_no_outcome(bench):
    """``--ramp-s``: the i-th of the first ``agents`` sessions sends its first search no sooner
    than i * ramp_s / agents after the run began; what each session finds is unchanged."""
    import threading
    import time

    tasks, corpus = bench
    oracle = oracle_for(tasks)
    first: dict[str, float] = {}
    lock = threading.Lock()

    class Timed:
        name = "timed oracle"

        def rerank(self, request: RerankRequest, top_n: int) -> list[int]:
            with lock:
                first.setdefault(request.task_id, time.perf_counter())
            return oracle.rerank(request, top_n)

    agents, ramp_s = 4, 0.8
    began = time.perf_counter()
    ramped, wall = run_sessions(tasks, corpus, Timed(), agents=agents, ramp_s=ramp_s)
    assert outcomes(ramped) == outcomes(run_sessions(tasks, corpus, oracle, agents=agents)[0])
    for i, task in enumerate(tasks[:agents]):
        assert first[task.task_id] - began >= i * ramp_s / agents, (i, task.task_id)
    assert wall >= (agents - 1) * ramp_s / agents
    with pytest.raises(ValueError, match="ramp_s"):
        run_sessions(tasks, corpus, oracle, ramp_s=-1)
    with pytest.raises(ValueError, match="ramp_s"):
        AgentBenchConfig(out="x", ramp_s=float("nan"))


def test_reformulations_and_reasoning(bench):
    tasks, corpus = bench
    for task in tasks:
        answers = []
        for k, step in enumerate(task.steps):
            queries = [reformulate(task, k, answers, a, corpus) for a in (1, 2, 3, 4)]
            assert queries[3] == queries[0]  # attempts past 3 cycle
            assert queries[2].startswith(queries[0])
            assert "#" not in " ".join(queries) and ">>" not in " ".join(queries)
            reasoning = agent_reasoning(task, k, answers, queries[:2])
            assert step["answer"].lower() not in reasoning.lower()
            answers.append(step["answer"])


def test_cli_writes_json_markdown_and_png(records, tiny_qwen3_dir, tmp_path, capsys):
    from acare_ray.cli import main

    code = main(
        [
            "agent-bench",
            "--tasks",
            str(N_TASKS),
            "--seed",
            "0",
            "--model",
            str(tiny_qwen3_dir),
            "--modes",
            "M0,M3",
            "--device",
            "cpu",
            "--agents",
            "2",
            "--resamples",
            "200",
            "--progress-every",
            "3",
            "--out",
            str(tmp_path),
        ]
    )
    assert code == 0
    captured = capsys.readouterr()
    assert "agent-bench M3: 6/6 tasks" in captured.err
    report = json.loads((tmp_path / "agent_bench.json").read_text())
    assert list(report["systems"]) == ["bm25", "M0", "M3"]
    for summary in report["systems"].values():
        assert summary["tasks"] == N_TASKS
        assert 0 <= summary["success_rate"] <= 1
        assert set(summary["latency_ms"]) == {"p50", "p95", "p99"}
    assert (
        report["systems"]["bm25"]["rerank_s_per_task"]
        < report["systems"]["M3"]["rerank_s_per_task"]
    )
    assert report["systems"]["bm25"]["rerank_tokens_per_task"] == 0
    # M3 adds the question and the reasoning to every prompt: more tokens than M0.
    assert (
        0
        < report["systems"]["M0"]["rerank_tokens_per_task"]
        < report["systems"]["M3"]["rerank_tokens_per_task"]
    )
    assert len(report["tests"]) == 3 * 3  # 3 measures x 3 pairs
    assert all(t["p_holm"] >= t["p_value"] for t in report["tests"])
    assert "| M3 |" in (tmp_path / "agent_bench.md").read_text()
    assert (tmp_path / "agent_bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_config_rejects_bad_settings(tmp_path):
    with pytest.raises(ValueError, match="--model"):
        AgentBenchConfig(out=str(tmp_path), reranker="model")
    with pytest.raises(ValueError, match="--modes"):
        AgentBenchConfig(out=str(tmp_path), reranker="model", model="x", modes=("M9",))
    with pytest.raises(ValueError, match="agents"):
        AgentBenchConfig(out=str(tmp_path), agents=0)
    with pytest.raises(ValueError, match="reranker"):
        AgentBenchConfig(out=str(tmp_path), reranker="bm42")


def test_endpoint_reranker_sends_the_context_and_retries_503():
    """Against a stand-in Cohere server (stdlib): the body, the order read back, a 503 retry."""
    bodies, answers = [], [503, 200]

    def answer(path: str, body: dict):
        bodies.append((path, body))
        if answers.pop(0) == 503:
            return 503, {"detail": "busy"}, {"Retry-After": "0"}
        payload = {
            "results": [
                {"index": 2, "relevance_score": 0.9},
                {"index": 0, "relevance_score": 0.1},
            ],
            "meta": {"tokens": {"input_tokens": 42, "output_tokens": 0}},
        }
        return 200, payload, {}

    with json_stub_server(answer) as url:
        reranker = EndpointReranker(f"{url}/", mode="M2")
        request = RerankRequest(
            query="q",
            question="Q?",
            reasoning="r.",
            documents=("a", "b", "c"),
            doc_ids=("1", "2", "3"),
        )
        assert reranker.rerank_counted(request, top_n=2) == ([2, 0], 42)
        assert reranker.refused == 1
        reranker.close()
    assert len(bodies) == 2 and bodies[0] == bodies[1]
    path, body = bodies[1]
    assert path == "/v2/rerank"
    assert body == {
        "model": "acare",
        "query": "q",
        "documents": ["a", "b", "c"],
        "top_n": 2,
        "original_question": "Q?",
        "reasoning": "r.",
        "mode": "M2",
    }


def test_task_ids_file_runs_exactly_those_tasks(records, tmp_path, capsys):
    from acare_ray.cli import main

    chosen = [r["id"] for r in records[:3]][::-1]
    ids = tmp_path / "ids.txt"
    ids.write_text("# held-out questions\n" + "\n".join(chosen) + "\n\n")
    out = tmp_path / "out"
    code = main(
        ["agent-bench", "--task-ids", str(ids), "--reranker", "oracle", "--resamples", "50"]
        + ["--out", str(out)]
    )
    assert code == 0
    report = json.loads((out / "agent_bench.json").read_text())
    assert report["config"]["task_ids"] == chosen
    assert [t["task_id"] for t in report["tasks"]["oracle"]] == chosen

    ids.write_text(chosen[0] + "\nno-such-question\n")
    assert main(["agent-bench", "--task-ids", str(ids), "--out", str(out)]) == 2
    assert "'no-such-question' (entry 2) is not a MuSiQue record id" in capsys.readouterr().err
