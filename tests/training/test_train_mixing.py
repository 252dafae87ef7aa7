"""Data mixing: several group tables with weights, and the validation loss."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
import torch

from acare_ray.data.schema import TRAINING_GROUPS, Candidate, Group
from acare_ray.scoring import AgentContext
from acare_ray.training.cli import config_from_args
from acare_ray.training.config import TrainConfig
from acare_ray.training.loss import lce_loss
from acare_ray.training.plan import load_splits, step_groups, total_steps
from acare_ray.training.validation import group_loss


def test_weighted_sources_are_drawn_in_proportion_and_each_read_in_permutations():
    sizes = (10, 200, 40)
    config = TrainConfig(
        data=("a", "b", "c"), data_weights=(2.0, 1.0, 1.0), batch_groups=8, max_steps=500, seed=3
    )
    drawn = np.concatenate(
        [
            np.concatenate(step_groups(sizes, config, s, 0))
            for s in range(total_steps(sizes, config))
        ]
    )
    assert drawn.size == 4000
    source = np.searchsorted(np.cumsum(sizes), drawn, side="right")
    share = np.bincount(source, minlength=3) / drawn.size
    assert share == pytest.approx([0.5, 0.25, 0.25], abs=0.03)
    small = drawn[source == 0]  # 10 groups drawn ~2,000 times: every pass is a permutation
    for start in range(0, small.size - 10, 10):
        assert sorted(small[start : start + 10]) == list(range(10))
    assert not (small[:10] == small[10:20]).all()  # reshuffled between passes
    again = step_groups(sizes, config, 123, 0)
    assert all((a == b).all() for a, b in zip(again, step_groups(sizes, config, 123, 0)))


def test_without_weights_several_sources_are_one_concatenated_set():
    config = TrainConfig(data=("a", "b"), batch_groups=5, epochs=1)
    seen = [int(i) for s in range(6) for m in step_groups((10, 20), config, s, 0) for i in m]
    assert sorted(seen) == list(range(30))


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"data": ("a", "b"), "data_weights": (1.0,)}, "one per source"),
        ({"data": ("a", "b"), "data_weights": (1.0, 0.0)}, "finite and > 0"),
        ({"data": ("a", "b"), "data_weights": (1.0, float("nan"))}, "finite and > 0"),
        ({"data": ()}, "one or more non-empty paths"),
    ],
)
def test_bad_mixing_settings_are_named(values, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig(**values)


def test_a_mixed_config_round_trips_through_json_and_resumes():
    config = TrainConfig(data=("a", "b"), data_weights=(0.7, 0.3))
    saved = config.to_dict()
    assert saved["data"] == ["a", "b"] and saved["data_weights"] == [0.7, 0.3]
    assert TrainConfig.from_dict(saved) == config
    assert config.resume_mismatches(saved) == []
    other = TrainConfig(data=("a", "b"), data_weights=(0.5, 0.5))
    assert other.resume_mismatches(saved) == ["data_weights: saved [0.7, 0.3], now [0.5, 0.5]"]


def test_cli_takes_several_sources_and_their_weights():
    import argparse

    from acare_ray.training.cli import register

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args(
        ["train", "--data", "x.parquet", "y.parquet", "--data-weights", "3", "1", "--cpu-bf16"]
    )
    config = config_from_args(args)
    assert config.sources == ("x.parquet", "y.parquet")
    assert config.data_weights == (3.0, 1.0) and config.cpu_bf16
    single = config_from_args(parser.parse_args(["train", "--data", "x.parquet"]))
    assert single.data == "x.parquet" and single.data_weights is None and not single.cpu_bf16


def _groups_table(prefix, sessions, per_session=2):
    rows = []
    for s in range(sessions):
        for g in range(per_session):
            rows.append(
                {
                    "group_id": f"{prefix}{s}-{g}",
                    "session_id": f"{prefix}{s}",
                    "sub_query": "q",
                    "positive": {"doc_id": "p", "text": "pos"},
                    "negatives": [{"doc_id": f"n{i}", "text": "neg"} for i in range(3)],
                }
            )
    return pa.Table.from_pylist(rows, schema=TRAINING_GROUPS)


def test_each_source_gives_its_own_validation_share_by_session(tmp_path):
    import pyarrow.parquet as pq

    pq.write_table(_groups_table("a", 10), tmp_path / "a.parquet")
    pq.write_table(_groups_table("b", 20), tmp_path / "b.parquet")
    config = TrainConfig(
        data=(str(tmp_path / "a.parquet"), str(tmp_path / "b.parquet")),
        data_weights=(1.0, 1.0),
        group_size=4,
        val_fraction=0.2,
    )
    train, val, sizes = load_splits(config)
    assert sizes == (16, 32) and len(train) == 48 and len(val) == 12
    assert {g.session_id[0] for g in val} == {"a", "b"}
    assert not {g.session_id for g in train} & {g.session_id for g in val}
    assert [g.session_id[0] for g in train] == ["a"] * 16 + ["b"] * 32
    pq.write_table(_groups_table("a", 3), tmp_path / "dup.parquet")
    clash = TrainConfig(
        data=(str(tmp_path / "a.parquet"), str(tmp_path / "dup.parquet")),
        group_size=4,
        val_fraction=0.0,
    )
    with pytest.raises(ValueError, match="appears in more than one source"):
        load_splits(clash)


def test_validation_loss_is_the_lce_of_the_scored_groups():
    def group(gid):
        docs = [Candidate(doc_id=f"d{i}", text="t") for i in range(4)]
        return Group(gid, gid, AgentContext(sub_query="q"), docs[0], tuple(docs[1:]))

    groups = [group("g1"), group("g2")]
    run = {
        "g1": {"d0": 2.0, "d1": 0.5, "d2": -1.0, "d3": 0.0},
        "g2": {"d0": -0.5, "d1": 1.5, "d2": 0.2, "d3": 0.1},
    }
    expected = lce_loss(torch.tensor([[2.0, 0.5, -1.0, 0.0], [-0.5, 1.5, 0.2, 0.1]]), 4, 0.5).item()
    by_hand = np.mean(
        [
            -np.log(np.exp(row[0] / 0.5) / np.exp(np.array(row) / 0.5).sum())
            for row in ([2.0, 0.5, -1.0, 0.0], [-0.5, 1.5, 0.2, 0.1])
        ]
    )
    assert group_loss(groups, run, 0.5) == pytest.approx(expected) == pytest.approx(by_hand)
