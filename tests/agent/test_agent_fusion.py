"""``acare agent-bench`` fused systems (issue 20 part 2f): the BM25 scores reach the reranker,
fused systems in process equal fuse() by hand, and the endpoint path sends the first stage."""

from __future__ import annotations

import json

import pytest

from acare_ray.agent.bench import AgentBenchConfig, make_rerankers, model_fusions
from acare_ray.agent.rerankers import (
    EndpointReranker,
    FirstStageOrder,
    RerankRequest,
    ScorerReranker,
)
from acare_ray.agent.simulate import run_task
from acare_ray.agent.tasks import build_tasks, select_records
from acare_ray.data.io import data_dir
from acare_ray.ranking.checkpoint_settings import write_fusion
from acare_ray.ranking.fusion import FusionConfig, fuse
from acare_ray.scoring import AgentContext
from acare_ray.testing import json_stub_server

REQUEST = RerankRequest(
    query="capital population",
    question="What is the population of the capital of Velmoria?",
    reasoning="Anna Berg was born in Velmoria, so I need its capital.",
    documents=(
        "Ostrava is the capital of Velmoria and has a population of 1.2 million.",
        "Paris is the capital of France.",
        "Anna Berg is a singer from Velmoria.",
        "The capital of Zandor, Quell, counts 300,000 inhabitants.",
        "Velmoria is a small country.",
    ),
    doc_ids=("a", "b", "c", "d", "e"),
    first_stage_scores=(11.0, 9.5, 9.5, 4.0, 1.25),
)


@pytest.fixture(scope="module")
def bench(require_data):
    from acare_ray.data.musique import load_musique

    require_data(data_dir() / "musique")
    return build_tasks(select_records(load_musique(), 3, seed=0))


def test_corpus_search_keeps_the_bm25_scores(bench):
    """Pins issue 20 part 2f: Corpus.search threw the BM25 scores away; now it returns them
    with the positions, best first, as the index scored them."""
    tasks, corpus = bench
    for task in tasks:
        positions, scores = corpus.search(task.question, 20)
        want_positions, want_scores = corpus.index.search([task.question], 20)
        assert list(positions) == [int(p) for p in want_positions[0]]
        assert list(scores) == [float(s) for s in want_scores[0]]
        assert all(a >= b for a, b in zip(scores, scores[1:]))
        assert corpus.search(task.question, 20) == (positions, scores)  # cached, same answer


class Recording(FirstStageOrder):
    def __init__(self) -> None:
        self.requests: list[RerankRequest] = []

    def rerank(self, request: RerankRequest, top_n: int) -> list[int]:
        self.requests.append(request)
        return super().rerank(request, top_n)


def test_every_search_hands_the_reranker_its_candidates_bm25_scores(bench):
    """Pins issue 20 part 2f: a session's requests carry each unseen candidate's BM25 score."""
    tasks, corpus = bench
    recording = Recording()
    for task in tasks:
        run_task(task, corpus, recording, budget=3, depth=5, first_stage_k=30)
    assert recording.requests
    for request in recording.requests:
        positions, scores = corpus.search(request.query, 30)
        by_id = {corpus.ids[p]: s for p, s in zip(positions, scores)}
        assert len(request.first_stage_scores) == len(request.documents) > 0
        assert list(request.first_stage_scores) == [by_id[d] for d in request.doc_ids]


@pytest.mark.parametrize(
    "fusion", [FusionConfig("rrf", k=2, weight=0.5), FusionConfig("linear", alpha=0.4)]
)
def test_a_fused_in_process_system_equals_fuse_by_hand(tiny_scorer, fusion):
    """Issue 20 part 2f: the in-process fused system ranks by fuse() of the scorer's log-odds
    with the request's BM25 scores, and is named ``<mode>+<setting>``."""
    reranker = ScorerReranker(tiny_scorer, "M3", fusion=fusion)
    assert reranker.name == f"M3+{fusion.label}"
    context = AgentContext(REQUEST.query, question=REQUEST.question, reasoning=REQUEST.reasoning)
    scores = tiny_scorer.score(context, list(REQUEST.documents), "M3")
    want = fuse(scores, fusion, list(REQUEST.first_stage_scores)).order[:3]
    order, tokens = reranker.rerank_counted(REQUEST, 3)
    assert order == [int(i) for i in want] and tokens > 0
    plain = ScorerReranker(tiny_scorer, "M3", fusion=FusionConfig())
    assert plain.name == "M3" and plain.fusion is None


def test_the_endpoint_fused_system_sends_the_first_stage():
    """Issue 20 part 2f: ``--endpoint`` fused systems post first_stage_scores (or
    first_stage_order when a request has none) and the fusion setting; unfused ones do not."""
    bodies = []

    def answer(path: str, body: dict):
        bodies.append(body)
        return 200, {"results": [{"index": 1, "relevance_score": 0.5}]}, {}

    with json_stub_server(answer) as url:
        for fusion in ("rrf", "auto", None):
            reranker = EndpointReranker(url, mode="M2", fusion=fusion)
            assert reranker.rerank(REQUEST, 2) == [1]
            unscored = RerankRequest(**{**REQUEST.__dict__, "first_stage_scores": ()})
            reranker.rerank(unscored, 2)
            reranker.close()
    rrf, rrf_unscored, auto, _, plain, plain_unscored = bodies
    assert rrf["first_stage_scores"] == list(REQUEST.first_stage_scores)
    assert rrf["fusion"] == "rrf:k=60,weight=0.5" and "first_stage_order" not in rrf
    assert rrf_unscored["first_stage_order"] is True and "first_stage_scores" not in rrf_unscored
    assert auto["fusion"] == "auto"
    for body in (plain, plain_unscored):
        assert not {"first_stage_scores", "first_stage_order", "fusion"} & set(body)


def system_names(config: AgentBenchConfig) -> list[str]:
    """The names of the systems ``config`` makes (each closed again)."""
    systems = make_rerankers(config, [])
    try:
        return [s.name for s in systems]
    finally:
        for system in systems:
            getattr(system, "close", lambda: None)()


def test_fused_systems_are_named_and_configured(tmp_path, tiny_qwen3_copy):
    """Issue 20 part 2f: each --fusion adds ``<mode>+<setting>`` beside every mode; ``none``
    adds nothing; ``auto`` is the checkpoint's fitted setting in process (an error when it has
    none) and the server's at an endpoint; bad settings are refused up front."""
    config = AgentBenchConfig(
        out=str(tmp_path),
        reranker="endpoint",
        endpoint="http://127.0.0.1:9",
        modes=("M0", "M3"),
        fusion=("rrf", "none", "auto", "rrf:k=60,weight=0.5"),
    )
    assert system_names(config) == [
        "bm25",
        "M0",
        "M0+rrf:k=60,weight=0.5",
        "M0+auto",
        "M3",
        "M3+rrf:k=60,weight=0.5",
        "M3+auto",
    ]
    fused_only = AgentBenchConfig(
        out=str(tmp_path),
        reranker="endpoint",
        endpoint="http://127.0.0.1:9",
        modes=("M0", "M3"),
        fusion=("rrf",),
        fused_only=True,
    )
    # --fused-only: the baseline and the fused systems, not each mode alone
    assert system_names(fused_only) == [
        "bm25",
        "M0+rrf:k=60,weight=0.5",
        "M3+rrf:k=60,weight=0.5",
    ]
    model = dict(out=str(tmp_path), reranker="model", model=str(tiny_qwen3_copy))
    with pytest.raises(ValueError, match="has no fitted fusion"):
        model_fusions(AgentBenchConfig(**model, fusion=("auto",)))
    write_fusion(tiny_qwen3_copy, FusionConfig("linear", alpha=0.7))
    assert model_fusions(AgentBenchConfig(**model, fusion=("auto", "linear:alpha=0.7", "rrf"))) == [
        FusionConfig("linear", alpha=0.7),
        FusionConfig("rrf"),
    ]
    with pytest.raises(ValueError, match="--fusion 'borda'"):
        AgentBenchConfig(**model, fusion=("borda",))
    with pytest.raises(ValueError, match="--fusion goes with"):
        AgentBenchConfig(out=str(tmp_path), fusion=("rrf",))


def test_the_cli_runs_a_fitted_fused_system(require_data, tiny_qwen3_copy, tmp_path):
    """``acare agent-bench --model CKPT --modes M3 --fusion auto --fusion rrf`` reports the
    fused systems beside the mode and BM25 (docs/agent_bench.md's command, on two tasks)."""
    from acare_ray.cli import main

    require_data(data_dir() / "musique")
    write_fusion(tiny_qwen3_copy, FusionConfig("rrf", k=60, weight=0.3))
    out = tmp_path / "out"
    argv = ["agent-bench", "--tasks", "2", "--model", str(tiny_qwen3_copy), "--modes", "M3"]
    argv += ["--fusion", "auto", "--fusion", "rrf", "--device", "cpu", "--resamples", "50"]
    assert main([*argv, "--out", str(out)]) == 0
    report = json.loads((out / "agent_bench.json").read_text())
    assert list(report["systems"]) == [
        "bm25",
        "M3",
        "M3+rrf:k=60,weight=0.3",
        "M3+rrf:k=60,weight=0.5",
    ]
    assert report["config"]["fusion"] == ["auto", "rrf"]
    assert "| M3+rrf:k=60,weight=0.3 |" in (out / "agent_bench.md").read_text()
