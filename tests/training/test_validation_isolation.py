"""Training validation scores through the serving error policy: a group that fails to score
is counted and left out, and the other groups' figures are as if it had not been there."""

from __future__ import annotations

import pytest

from acare_ray.data.schema import Candidate, Group
from acare_ray.scoring import AgentContext
from acare_ray.training.validation import validate


def group(gid: str, instruction: str | None = None) -> Group:
    texts = [f"{gid} relevant page about rivers", "cooking pasta", "football scores", "tax law"]
    docs = [Candidate(doc_id=f"{gid}-d{i}", text=t) for i, t in enumerate(texts)]
    context = AgentContext(sub_query=f"{gid} rivers", instruction=instruction)
    return Group(gid, gid, context, docs[0], tuple(docs[1:]))


def test_a_group_that_fails_to_score_is_counted_and_the_others_are_unchanged(minilm_scorer):
    good = [group(f"g{i}") for i in range(4)]
    # The cross-encoder cannot take an instruction: that group's scoring raises.
    bad = group("bad", instruction="Judge by vibes")
    alone = validate(minilm_scorer, good, ["M0"])
    mixed = validate(minilm_scorer, [good[0], bad, *good[1:]], ["M0"])
    assert mixed["val/errors/M0"] == 1.0
    assert "val/errors/M0" not in alone
    assert mixed["val/nDCG@10/M0"] == pytest.approx(alone["val/nDCG@10/M0"], abs=1e-6)
    assert mixed["val/loss/M0"] == pytest.approx(alone["val/loss/M0"], abs=1e-6)


def test_a_mode_whose_every_group_fails_reports_only_its_error_count(minilm_scorer):
    metrics = validate(minilm_scorer, [group("bad", instruction="x")], ["M0"])
    assert metrics == {"val/errors/M0": 1.0}
