"""The first-stage and fused systems of ``acare eval``, without Ray (evaluate.py's pure parts)."""

from __future__ import annotations

import pyarrow as pa

from acare_ray.data.io import write_parquet
from acare_ray.data.traces import TRACE_SEARCHES
from acare_ray.eval.ir_metrics import rank_docs
from acare_ray.offline.evaluate import first_stage_runs, load_first_stage, ordered_runs
from acare_ray.ranking.fusion import FusionConfig


def _candidate(doc_id, score=None, agent_rank=None):
    return {
        "doc_id": doc_id,
        "text": doc_id,
        "first_stage_score": score,
        "relevance": 0,
        "page": doc_id,
        "origin": "bm25",
        "agent_rank": agent_rank,
    }


def _write(tmp_path, rows):
    base = {"session_id": "s", "sub_query": "q", "question": None, "reasoning": None}
    table = pa.Table.from_pylist([base | r for r in rows], schema=TRACE_SEARCHES)
    return str(write_parquet(table, tmp_path / "in.parquet"))


def test_first_stage_is_the_input_order_without_scores(tmp_path):
    """Issue 20: eval's first-stage system equals the input order."""
    path = _write(tmp_path, [{"search_id": "a", "candidates": [_candidate(d) for d in "zyxw"]}])
    runs = first_stage_runs(load_first_stage(path))
    assert list(runs) == ["first_stage"]  # no agent ranks: no agent_order system
    assert rank_docs(runs["first_stage"]["a"]) == ["z", "y", "x", "w"]


def test_bm25_order_and_agent_order_of_imported_traces(tmp_path):
    # the trace layout: agent passages first (one outside the BM25 top k), then BM25 ones
    candidates = [
        _candidate("a1", 1.0, agent_rank=1),
        _candidate("a2", None, agent_rank=2),
        _candidate("b1", 3.0),
        _candidate("b2", 1.0),
    ]
    path = _write(tmp_path, [{"search_id": "s1", "candidates": candidates}])
    runs = first_stage_runs(load_first_stage(path))
    # BM25: score descending, the tie (a1, b2) in list order, the unscored agent passage last
    assert rank_docs(runs["first_stage"]["s1"]) == ["b1", "a1", "b2", "a2"]
    assert rank_docs(runs["agent_order"]["s1"]) == ["a1", "a2", "b1", "b2"]


def test_mode_and_fused_runs_follow_the_tie_rule_from_one_set_of_scores(tmp_path):
    candidates = [_candidate("p", 1.0), _candidate("q", 3.0), _candidate("r", 2.0)]
    path = _write(tmp_path, [{"search_id": "s1", "candidates": candidates}])
    first = load_first_stage(path)
    scores = {"M3": {"s1": {"p": 0.5, "q": 0.5, "r": 2.0}}}
    runs = ordered_runs(scores, first, (FusionConfig("rrf", weight=0.0),))
    assert set(runs) == {"M3", "M3+rrf:k=60,weight=0"}
    # the tie between p and q goes to q, the better first-stage rank
    assert rank_docs(runs["M3"]["s1"]) == ["r", "q", "p"]
    assert rank_docs(runs["M3+rrf:k=60,weight=0"]["s1"]) == ["q", "r", "p"]
