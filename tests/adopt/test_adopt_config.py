"""``acare adopt``'s config file and its decision rule (no Ray, no model)."""

from __future__ import annotations

import pytest

from acare_ray.adopt.config import AdoptConfig
from acare_ray.adopt.report import decide

COMMITTED = "adopt_configs/r1-searcher-hotpotqa.yaml"


def _base(**extra):
    return {
        "work_dir": "w",
        "sources": [{"name": "mine", "searches": "s.parquet", "test": 5}],
        **extra,
    }


def test_the_committed_config_reads_and_names_its_sources():
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    config = AdoptConfig.read(root / COMMITTED)
    assert [s.name for s in config.sources] == ["traces", "musique", "hotpotqa"]
    assert config.primary.test == 50 and config.loop_tasks == "musique"
    assert config.primary.trace_files()  # the data folder's trace files match the glob


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (_base(epochs=3), r"adopt config: unknown setting\(s\) \['epochs'\]"),
        (_base(train={"seed": 3}), r"train: \['seed'\] are set by adopt itself"),
        (_base(train={"lr_max": 1}), r"train: unknown setting\(s\) \['lr_max'\]"),
        (_base(fusion={"fold": 3}), r"fusion: unknown setting\(s\) \['fold'\]"),
        (
            {"work_dir": "w", "sources": [{"name": "a", "searches": "s", "builtin": "musique"}]},
            "give exactly one of traces, searches, builtin",
        ),
        ({"work_dir": "w", "sources": [{"name": "a", "searches": "s"}]}, "needs test questions"),
        (_base(modes=["M0"]), "modes must include M3"),
        (_base(loop_tasks="other"), "loop_tasks: 'other' is not a source name"),
        (_base(mine={"miner": "w0", "rounds": 2}), r"mine: unknown setting\(s\) \['rounds'\]"),
        (_base(mine={"miner": "w0", "init": "scratch"}), "mine: init must be one of"),
        (_base(mine={"miner": "w0", "mode": "M9"}), "mine: mode 'M9' is not one of"),
        (_base(mine={"miner": "w0", "hard": 8}), r"mine: hard \(8\) exceeds negatives \(7\)"),
        (_base(mine={"miner": ""}), "mine: miner .* is required"),
        (_base(mine={"miner": "w0", "skip": -1}), "mine: skip must be a number of negatives >= 0"),
        (_base(mine={"miner": "dense:"}), "mine: miner dense: names no model"),
        (_base(mine={"miner": "dense:minilm"}), "a dense miner .* has no checkpoint .* init: base"),
    ],
)
def test_a_bad_config_is_refused_naming_the_setting(values, message):
    with pytest.raises(ValueError, match=message):
        AdoptConfig.from_dict(values)


def test_a_trace_glob_matching_nothing_is_an_error(tmp_path):
    config = AdoptConfig.from_dict(
        {
            "work_dir": "w",
            "sources": [{"name": "a", "traces": str(tmp_path / "*.jsonl"), "test": 1}],
        }
    )
    with pytest.raises(ValueError, match="no trace file matches"):
        config.primary.trace_files()


def _row(diff, low, high):
    return {"mean_a": 0.5, "mean_b": 0.5 + diff, "diff": diff, "ci95": [low, high],
            "sessions": 40, "p_holm": 0.01}  # fmt: skip


def test_the_decision_follows_the_safety_rule_then_the_test_interval():
    fused = {"decision": "fused", "reason": "r"}
    assert decide(fused, _row(0.04, 0.01, 0.07))[0] == "switch"
    assert decide(fused, _row(0.01, -0.02, 0.04))[0] == "no clear gain"
    assert decide(fused, _row(-0.03, -0.06, -0.01))[0] == "do not switch"
    passed = {"decision": "pass-through", "reason": "lower bound -0.01 < 0"}
    decision, reason = decide(passed, _row(0.04, 0.01, 0.07))
    assert decision == "do not switch" and "first-stage order" in reason


def _claim(b, diff, low, p):
    return {"a": "first_stage", "b": b, "diff": diff, "ci95": [low, low + 0.1], "mean_a": 0.8,
            "mean_b": 0.8 + diff, "p_holm": p}  # fmt: skip


def test_the_zero_training_control_says_which_it_is():
    from acare_ray.adopt.report import zero_training

    win = zero_training({"tests": [_claim("M0", 0.01, -0.02, 0.4), _claim("M3", 0.05, 0.01, 0.01)]})
    assert "the cheap win" in win and "best mode M3" in win
    worse = zero_training(
        {"tests": [_claim("M0", -0.2, -0.3, 0.001), _claim("M3", -0.1, -0.2, 0.01)]}
    )
    assert "needs training" in worse
    noise = zero_training(
        {"tests": [_claim("M0", 0.01, -0.02, 0.6), _claim("M3", -0.1, -0.2, 0.01)]}
    )
    assert "not distinguishable" in noise


def test_a_mining_round_needs_the_miner_to_have_trained_that_seed(tmp_path):
    config = AdoptConfig.from_dict(_base(mine={"miner": str(tmp_path / "first")}))
    with pytest.raises(ValueError, match=r"the miner has no trained seed 0 \(.*train.json"):
        config.mine.checkpoint(0)
    trained = tmp_path / "first" / "seed0"
    trained.mkdir(parents=True)
    (trained / "train.json").write_text('{"checkpoint": "runs/first/checkpoint_0000051"}')
    assert config.mine.checkpoint(0) == "runs/first/checkpoint_0000051"
