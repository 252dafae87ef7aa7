"""Real agent traces end to end: ``acare import-traces`` -> ``acare eval --sessions`` and
``acare relabel --gold-aware``, on a real local Ray cluster."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from offline_support import read_rows

from acare_ray.cli import main
from acare_ray.data.io import data_dir, read_parquet
from acare_ray.eval.session_replay import SessionSearch, replay_session

pytestmark = pytest.mark.slow
TRACES = data_dir() / "agent_traces"


@pytest.fixture(scope="module")
def searches(tmp_path_factory, require_data) -> Path:
    """The first 8 trajectories of each agent, imported with BM25 top-10."""
    require_data(TRACES)
    folder = tmp_path_factory.mktemp("traces")
    inputs = []
    for agent in ("qwen", "llama"):
        source = TRACES / "r1-searcher" / f"hotpotqa_{agent}.jsonl"
        lines = source.read_text(encoding="utf-8").splitlines()[:8]
        inputs.append(folder / source.name)
        inputs[-1].write_text("\n".join(lines) + "\n", encoding="utf-8")
    shutil.copy(TRACES / "hotpotqa_gold.jsonl", folder / "gold.jsonl")
    output = folder / "searches.parquet"
    argv = ["import-traces", "--input", *map(str, inputs), "--gold", str(folder / "gold.jsonl")]
    assert main([*argv, "--k", "10", "--output", str(output)]) == 0
    return output


@pytest.fixture(scope="module")
def report(ray_local, searches, tiny_qwen3_dir, tmp_path_factory):
    report_dir = tmp_path_factory.mktemp("report")
    argv = ["eval", "--input", str(searches), "--model", str(tiny_qwen3_dir), "--modes", "M0,M3"]
    argv += ["--report-dir", str(report_dir), "--resamples", "300", "--actors", "1"]
    argv += ["--sessions", "--group-by", "agent"]
    assert main(argv) == 0
    return json.loads((report_dir / "report.json").read_text()), report_dir


def test_session_report_replays_the_written_rankings(report, searches):
    result, report_dir = report
    table = read_parquet(searches).to_pylist()
    runs = {}
    for row in read_rows(report_dir / "rerank"):
        runs.setdefault(row["mode"], {})[row["search_id"]] = {
            r["doc_id"]: r["score"] for r in row["ranking"]
        }
    sessions = {}
    for row in sorted(table, key=lambda r: (r["session_id"], r["step"])):
        pages = {c["doc_id"]: c["page"] for c in row["candidates"]}
        sessions.setdefault(row["session_id"], []).append(SessionSearch(row["search_id"], pages))
    gold = {row["session_id"]: set(row["supporting_pages"]) for row in table}
    section = result["sessions"]
    assert section["counts"]["evaluated"] == len(sessions)
    for mode in ("M0", "M3"):
        for sid, items in sessions.items():
            replay = replay_session(sid, items, runs[mode], gold[sid])
            shown = [d for part in replay.returned for d in part]
            assert len(shown) == len(set(shown))
            got = section["per_session"][mode]["session_recall"][sid]
            assert got == replay.measures()["session_recall"]
    assert set(result["groups"]) == {"llama", "qwen"}
    per_agent = sum(g["sessions"]["counts"]["evaluated"] for g in result["groups"].values())
    assert per_agent == len(sessions)
    markdown = (report_dir / "report.md").read_text()
    assert "## Sessions" in markdown and "## agent = qwen" in markdown


def test_gold_aware_relabel_job_groups_gold_positives_with_non_gold_negatives(
    ray_local, searches, tiny_qwen3_dir, tmp_path
):
    output = tmp_path / "groups"
    argv = ["relabel", "--input", str(searches), "--output", str(output)]
    argv += ["--model", str(tiny_qwen3_dir), "--gold-aware", "--negatives-from", "hard"]
    assert main([*argv, "--keep-failed", "--actors", "1", "--negatives", "5"]) == 0
    rows = {r["search_id"]: r for r in read_rows(output)}
    table = read_parquet(searches).to_pylist()
    assert sorted(rows) == sorted(r["search_id"] for r in table)  # rows in == rows out
    ok = 0
    for search in table:
        out = rows[search["search_id"]]
        labels = {c["doc_id"]: c["relevance"] for c in search["candidates"]}
        if not any(labels.values()):
            assert out["status"] == "no_gold_candidate"
            continue
        assert out["status"] == "ok"
        ok += 1
        assert labels[out["positive"]["doc_id"]] == 1
        assert len(out["negatives"]) == 5
        assert all(labels[d["doc_id"]] == 0 for d in out["negatives"])
    assert ok > 0
