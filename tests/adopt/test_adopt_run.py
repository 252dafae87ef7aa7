"""``acare adopt`` end to end on a real local Ray cluster: a tiny searches file with two agents,
the tiny Qwen3, every stage, the report, and a rerun that resumes without redoing anything."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from acare_ray.cli import main
from acare_ray.data.io import write_parquet
from acare_ray.data.synthetic import synthetic_searches
from acare_ray.ranking.checkpoint_settings import read_fusion
from acare_ray.ranking.fusion import FusionConfig
from acare_ray.training import trainer

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def adopted(ray_local, tiny_qwen3_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("adopt")
    table = synthetic_searches(40, seed=3)
    sessions = table.column("session_id").to_pylist()
    agents = pa.array(["alpha" if int(s[-1]) % 2 else "beta" for s in sessions])
    write_parquet(table.append_column("agent", agents), root / "searches.parquet")
    config = {
        "work_dir": str(root / "work"),
        "model": str(tiny_qwen3_dir),
        "sources": [
            {
                "name": "mine",
                "searches": str(root / "searches.parquet"),
                "test": 10,
                "validation": 0.3,
                "weight": 1.0,
            },
        ],  # fmt: skip
        "train": {
            "workers": 1,
            "batch_groups": 2,
            "grad_accum": 1,
            "max_steps": 6,
            "checkpoint_every": 3,
            "patience": 2,
            "lr": 1e-3,
            "cpu_bf16": False,
            "scorer": {"max_length": 256},
            "time_budget_s": 600,
        },  # fmt: skip
        "fusion": {"folds": 2, "resamples": 200},
        "cost": {"candidates": [5, 10], "searches": 3},
        "resamples": 200,
        "actors": 1,
    }
    path = root / "adopt.yaml"
    path.write_text(yaml.safe_dump(config))
    argv = ["adopt", "--config", str(path)]
    code = main(argv)
    return root, argv, code


def test_every_stage_runs_and_the_report_decides(adopted, capsys):
    root, _, code = adopted
    assert code == 0
    work = root / "work"
    report = json.loads((work / "seed0" / "report.json").read_text())
    decisions = ("switch", "no clear gain", "do not switch")
    assert report["overall"]["decision"] in decisions
    assert set(report["per_agent"]) == {"alpha", "beta"}
    assert all(d["decision"] in decisions for d in report["per_agent"].values())
    markdown = (work / "seed0" / "report.md").read_text()
    assert markdown.startswith(f"# acare adopt: {report['overall']['decision']}")
    for heading in ("## Zero-training control", "## Training", "## Fusion fit", "## Test",
                    "## Cost per search"):  # fmt: skip
        assert heading in markdown
    assert (work / "seed0" / "report.png").stat().st_size > 0


def test_questions_never_straddle_the_split(adopted):
    root, _, _ = adopted
    seen = {}
    for part in ("train", "validation", "test"):
        table = pq.read_table(root / "work" / "data" / f"mine_{part}.parquet")
        seen[part] = set(table.column("question").to_pylist())
    assert len(seen["test"]) == 10
    assert not (seen["train"] & seen["test"] or seen["train"] & seen["validation"])
    assert not seen["validation"] & seen["test"]


def test_the_best_checkpoint_carries_the_stored_fusion_that_the_test_used(adopted):
    root, _, _ = adopted
    work = root / "work" / "seed0"
    train = json.loads((work / "train.json").read_text())
    fit = json.loads((work / "fit.json").read_text())
    test = json.loads((work / "test.json").read_text())
    assert train["selection"]["metric"] == "val/nDCG@10/M3"
    assert train["checkpoint"].endswith(f"checkpoint_{train['selection']['best_step']:07d}")
    stored = read_fusion(train["checkpoint"])
    assert stored == FusionConfig.from_dict(fit["M3"]["fusion"])
    assert test["stored"] == f"M3+{stored.label}" and test["stored"] in test["metrics"]
    first = next(t for t in test["tests"] if t["a"] == "first_stage" and t["b"] == test["stored"])
    assert first["sessions"] == 10 and 0 <= first["p_holm"] <= 1
    if fit["M3"]["fitted"]["decision"] == "pass-through":  # the first-stage order, exactly
        assert first["diff"] == pytest.approx(0.0)


def test_cost_grows_with_the_candidates(adopted):
    root, _, _ = adopted
    cost = json.loads((root / "work" / "seed0" / "cost.json").read_text())
    by = {(c["mode"], c["candidates"]): c for c in cost["by"]}
    assert set(by) == {("M0", 5), ("M0", 10), ("M3", 5), ("M3", 10)}
    for mode in ("M0", "M3"):
        assert by[(mode, 10)]["tokens_per_search"] > by[(mode, 5)]["tokens_per_search"] > 0
    assert by[("M3", 5)]["tokens_per_search"] > by[("M0", 5)]["tokens_per_search"]


def test_a_rerun_resumes_without_redoing_a_stage(adopted, monkeypatch, capsys):
    root, argv, _ = adopted
    stamps = {p: p.stat().st_mtime_ns for p in (root / "work").rglob("*.json")}

    def no_training(*args, **kwargs):
        raise AssertionError("a finished adopt run trained again")

    monkeypatch.setattr(trainer, "build_trainer", no_training)
    assert main(argv) == 0
    assert "decision:" in capsys.readouterr().out
    changed = [p for p, t in stamps.items() if p.stat().st_mtime_ns != t]
    assert all(p.name == "report.json" for p in changed), changed
