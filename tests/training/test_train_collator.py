"""Collator: context dropout per group, tokens identical to inference, data reading and split."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pyarrow as pa
import pytest
import torch

from acare_ray.data.io import write_parquet
from acare_ray.data.nemo import write_nemo_jsonl
from acare_ray.data.schema import TRAINING_GROUPS, Candidate, Group, RowError
from acare_ray.data.synthetic import synthetic_groups
from acare_ray.scoring import AgentContext, FieldDropout, Mode
from acare_ray.scoring.cross_encoder import PairScorer
from acare_ray.training.collator import GroupCollator
from acare_ray.training.groups import (
    epoch_order,
    parse_groups,
    question_key,
    read_groups,
    split_by_question,
)


def _groups(n: int) -> list[Group]:
    docs = tuple(Candidate(f"d{k}", f"document number {k}") for k in range(1, 8))
    return [
        Group(
            f"g{i}",
            f"s{i // 3}",
            AgentContext(f"query {i}", question=f"question {i}?", reasoning=f"thinking {i}."),
            Candidate("d0", "the positive document"),
            docs,
        )
        for i in range(n)
    ]


def test_dropout_gives_each_mode_a_quarter_and_repeats_on_rerun(tiny_scorer):
    groups = _groups(2000)
    dropout = FieldDropout(0.5, 0.5, seed=13)
    collator = GroupCollator(tiny_scorer.backend, 8, dropout)
    modes = [collator.prompt(g, epoch=0)[1] for g in groups]
    counts = Counter(modes)
    for mode in Mode:
        assert 0.22 <= counts[mode] / len(groups) <= 0.28, counts
    rerun = GroupCollator(tiny_scorer.backend, 8, FieldDropout(0.5, 0.5, seed=13))
    assert [rerun.prompt(g, epoch=0)[1] for g in groups] == modes
    # __call__ draws the same modes as prompt() for the groups it collates.
    assert collator(groups[:16], epoch=0).modes == modes[:16]
    next_epoch = [collator.prompt(g, epoch=1)[1] for g in groups]
    assert sum(a != b for a, b in zip(modes, next_epoch)) > 1000


def test_dropped_field_is_absent_and_instruction_follows_mode(tiny_scorer):
    encoder = tiny_scorer.backend.encoder
    collator = GroupCollator(tiny_scorer.backend, 8, FieldDropout(0.5, 0.5, seed=1))
    groups = _groups(40)
    batch = collator(groups, epoch=0)
    assert set(batch.modes) == set(Mode)
    for row, (group, mode) in enumerate(zip(groups, batch.modes)):
        text = encoder.tokenizer.decode(batch.prefix_ids[row][batch.prefix_mask[row]])
        context, _ = collator.prompt(group, 0)
        assert text == encoder.prefix_text(context, mode)
        assert (group.context.question in text) == mode.uses_question
        assert (group.context.reasoning in text) == mode.uses_reasoning
    # Every document of a group continues that group's one prompt.
    assert batch.doc_group.tolist() == [g for g in range(40) for _ in range(8)]


def test_causal_batch_scores_equal_inference_scores(tiny_scorer):
    groups = parse_groups(synthetic_groups(3, seed=4), 8)
    collator = GroupCollator(tiny_scorer.backend, 8, FieldDropout(0.5, 0.5, seed=2))
    batch = collator(groups, epoch=0)
    with torch.no_grad():
        trained = tiny_scorer.backend.module(*batch.inputs()).view(len(groups), 8)
    for row, group in enumerate(groups):
        context, mode = collator.prompt(group, 0)
        docs = [d.text for d in (group.positive, *group.negatives)]
        expected = tiny_scorer.score(context, docs, mode)
        np.testing.assert_allclose(trained[row].numpy(), expected, atol=1e-4, rtol=1e-4)


def test_pair_batch_scores_equal_inference_scores(minilm_scorer):
    groups = parse_groups(synthetic_groups(2, seed=5), 8)
    collator = GroupCollator(minilm_scorer.backend, 8, FieldDropout(0.5, 0.5, seed=3))
    batch = collator(groups, epoch=0)
    with torch.no_grad():
        trained = PairScorer(minilm_scorer.backend)(*batch.inputs()).view(len(groups), 8)
    for row, group in enumerate(groups):
        context, mode = collator.prompt(group, 0)
        docs = [d.text for d in (group.positive, *group.negatives)]
        expected = minilm_scorer.score(context, docs, mode)
        np.testing.assert_allclose(trained[row].numpy(), expected, atol=1e-4, rtol=1e-4)


def test_group_with_too_few_negatives_is_named():
    table = synthetic_groups(2, seed=0, negatives=3)
    first = table.column("group_id")[0].as_py()
    with pytest.raises(
        RowError, match=f"group_id={first}: negatives has 3 documents, group_size=8"
    ):
        parse_groups(table, group_size=8)
    assert all(len(g.negatives) == 2 for g in parse_groups(table, group_size=3))


def test_repeated_group_id_is_an_error():
    table = synthetic_groups(1, seed=0)
    import pyarrow as pa

    doubled = pa.concat_tables([table, table.slice(0, 1)])
    with pytest.raises(RowError, match="appears more than once"):
        parse_groups(doubled, group_size=8)


def test_split_by_question_keeps_questions_whole_and_repeats():
    groups = parse_groups(synthetic_groups(30, seed=0), 8)
    train, val = split_by_question(groups, 0.2, seed=7)
    assert len(train) + len(val) == len(groups)
    assert not {question_key(g) for g in train} & {question_key(g) for g in val}
    assert len({question_key(g) for g in val}) == round(
        0.2 * len({question_key(g) for g in groups})
    )
    again = split_by_question(groups, 0.2, seed=7)
    assert [g.group_id for g in again[1]] == [g.group_id for g in val]


def test_two_sessions_of_one_question_sit_on_one_side():
    from dataclasses import replace

    groups = parse_groups(synthetic_groups(30, seed=0), 8)
    # a second agent's session on each question: new session ids, same question texts
    twins = [replace(g, group_id=g.group_id + "-b", session_id=g.session_id + "-b") for g in groups]
    train, val = split_by_question(groups + twins, 0.2, seed=7)
    assert not {g.context.question for g in train} & {g.context.question for g in val}


def test_epoch_order_is_a_permutation_fixed_by_seed_and_epoch():
    order = epoch_order(100, seed=3, epoch=0)
    assert sorted(order.tolist()) == list(range(100))
    assert (epoch_order(100, seed=3, epoch=0) == order).all()
    assert (epoch_order(100, seed=3, epoch=1) != order).any()


def test_parquet_and_nemo_jsonl_read_as_the_same_groups(tmp_path):
    table = synthetic_groups(3, seed=2)
    write_parquet(table, tmp_path / "groups.parquet")
    write_nemo_jsonl(table, tmp_path / "groups.jsonl")
    a = parse_groups(read_groups(tmp_path / "groups.parquet"), 8)
    b = parse_groups(read_groups(tmp_path / "groups.jsonl"), 8)
    assert a == b


def test_missing_data_file_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere.parquet"):
        read_groups(tmp_path / "nowhere.parquet")


def test_relabel_output_trains_on_its_ok_rows(tmp_path, caplog):
    from acare_ray.offline.score import RELABEL_OUTPUT

    groups = synthetic_groups(4, seed=5).to_pylist()
    rows = [dict(g, status="ok", error=None) for g in groups]
    rows[1] = dict(rows[1], positive=None, negatives=None, status="failed_trajectory")
    rows[3] = dict(rows[3], positive=None, negatives=None, status="invalid", error="bad row")
    rows = [{name: row.get(name) for name in RELABEL_OUTPUT.names} for row in rows]
    folder = tmp_path / "relabeled"
    write_parquet(pa.Table.from_pylist(rows, schema=RELABEL_OUTPUT), folder / "part-0.parquet")
    with caplog.at_level("INFO", logger="acare_ray.training.groups"):
        table = read_groups(folder)
    assert table.column_names == TRAINING_GROUPS.names
    parsed = parse_groups(table, 8)
    ok = [r["group_id"] for r in rows if r["status"] == "ok"]
    assert len(ok) == len(rows) - 2
    assert [g.group_id for g in parsed] == ok
    assert "1 failed_trajectory, 1 invalid" in caplog.text
