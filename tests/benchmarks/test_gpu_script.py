"""benchmarks/gpu.sh --reduced: the GPU benchmark's steps on CPU, so the script cannot rot."""

import json
import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CONFIGS = ("Qwen3-Reranker-0.6B", "Qwen3-Embedding-4B")
PREFIX, DOC, CANDIDATES, ROUNDS, STRIDE, OFFICIAL = 160, 32, 8, 2, 2, 2


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu-reduced")
    env = os.environ | {"OUT_DIR": str(out), "RAY_USAGE_STATS_ENABLED": "0"}
    done = subprocess.run(
        ["bash", str(REPO / "benchmarks" / "gpu.sh"), "--reduced"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=1000,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    found = {}
    for path in out.glob("*.json"):
        report = json.loads(path.read_text())
        if path.name.startswith("packing-"):
            found["packing"] = (report, path.with_suffix(".md").read_text())
            continue
        if path.name.endswith("-paths.json"):
            found[f"paths {report['config']['config']}"] = (
                report,
                path.with_suffix(".md").read_text(),
            )
            continue
        found[report["config"]["config"]] = (report, path.with_suffix(".md").read_text())
    return found


@pytest.mark.slow
def test_reduced_run_covers_both_gpu_model_shapes(reports):
    assert set(reports) == {*CONFIGS, *(f"paths {c}" for c in CONFIGS), "packing"}


@pytest.mark.slow
@pytest.mark.parametrize("config", CONFIGS)
def test_reduced_run_compares_attention_paths_and_the_float32_reference(reports, config):
    report, markdown = reports[f"paths {config}"]
    assert not [k for k, v in report.items() if isinstance(v, dict) and "error" in v]
    for name in ("concat, eager", "split, eager"):
        for mode in ("M0", "M3"):
            row = report["paths"][name][mode]
            assert row["pairs_per_s"] > 0 and row["max_abs_diff_vs_concat_eager"] < 1e-4
    for mode in ("M0", "M3"):  # float32 on CPU: the default is the reference's precision
        assert report["top10_vs_float32"][mode]["top10_overlap_mean"] == 1.0
    assert set(report["profile_m3"]) == {"concat, eager", "default"}
    assert "| split, eager | M3 |" in markdown


@pytest.mark.slow
def test_reduced_run_measures_small_search_latency_and_a_serving_rate(reports):
    report, markdown = reports[f"paths {CONFIGS[0]}"]
    assert [(r["candidates"], r["mode"]) for r in report["latency"]] == [
        (4, "M0"),
        (4, "M3"),
        (8, "M0"),
        (8, "M3"),
    ]
    assert all(0 < r["p50_ms"] <= r["p99_ms"] for r in report["latency"])
    rows = report["serving"]["rows"]
    assert rows and all(r["requests"] == 6 and r["score_many_calls"] >= 1 for r in rows)
    assert [r["searches_per_s"] for r in rows] == sorted(r["searches_per_s"] for r in rows)
    assert "Highest rate with P99 <= 500 ms" in markdown


@pytest.mark.slow
@pytest.mark.parametrize("config", CONFIGS)
def test_reduced_run_counts_exact_pairs_and_tokens(reports, config):
    report, _ = reports[config]
    work = report["workload"]
    assert work["prefix_tokens"]["M3"] == PREFIX
    assert work["doc_tokens"] == {"mean": DOC, "min": DOC, "max": DOC}
    segment = DOC + work["suffix_tokens"]
    for mode, results in report["modes"].items():
        prefix = work["prefix_tokens"][mode]
        ours, strong = results["ours"], results["strong"]
        assert ours["pairs"] == ROUNDS * CANDIDATES
        assert strong["pairs"] == ROUNDS * CANDIDATES // STRIDE
        assert results["official"]["pairs"] == OFFICIAL
        # ours reads the prefix once per search; the recipe reads it once per pair
        assert ours["real_tokens"] == ROUNDS * (prefix + CANDIDATES * segment)
        assert strong["real_tokens"] == strong["pairs"] * (prefix + segment)
        assert ours["padding_efficiency"] == strong["padding_efficiency"] == 1.0


@pytest.mark.slow
@pytest.mark.parametrize("config", CONFIGS)
def test_reduced_run_scores_agree_and_reports_mfu(reports, config):
    report, markdown = reports[config]
    assert report["targets"]["scores_match"]["met"]
    for results in report["modes"].values():
        for method in ("official", "strong", "ours"):
            assert results[method]["pairs_per_s"] > 0
            assert 0 < results[method]["mfu"] < 1
    assert "| MFU |" in markdown and "| M3 | ours |" in markdown


@pytest.mark.slow
def test_reduced_run_packs_small_searches_with_equal_scores(reports):
    report, markdown = reports["packing"]
    assert [(r["candidates"], r["mode"]) for r in report["rows"]] == [(4, "M0"), (4, "M3")]
    for row in report["rows"]:
        assert row["pairs"] == 4 * 4
        assert row["max_abs_diff"] < 1e-4
        assert row["packed"]["pairs_per_s"] > 0 and row["per_search"]["pairs_per_s"] > 0
    assert "| 4 | M3 |" in markdown
