"""The per-batch functions the actors run, without Ray."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from offline_support import with_bad_rows

from acare_ray.data.schema import parse_search
from acare_ray.data.synthetic import synthetic_searches
from acare_ray.offline.resume import digests, skip_written
from acare_ray.offline.score import (
    LABELER_INSTRUCTION,
    labeler_context,
    relabel_rows,
    rerank_rows,
)


@pytest.fixture(scope="module")
def scorer(tiny_qwen3_dir):
    """The tiny Qwen3 with a short max_length, so the 1 MB document is cut early."""
    from acare_ray.scoring import Scorer

    return Scorer.from_pretrained(str(tiny_qwen3_dir), device="cpu", max_length=1024)


@pytest.fixture(scope="module")
def rows():
    return synthetic_searches(2, seed=7).to_pylist()


def test_every_row_gets_one_output_per_mode_and_bad_rows_carry_their_error(scorer, rows):
    mixed, errors = with_bad_rows(rows)
    out = rerank_rows(scorer, mixed, ["M0", "M3"])
    assert len(out) == 2 * len(mixed)
    for mode, part in (("M0", out[: len(mixed)]), ("M3", out[len(mixed) :])):
        assert [r["search_id"] for r in part] == [r["search_id"] for r in mixed]
        for row, result in zip(mixed, part):
            assert result["mode"] == mode
            if row["search_id"] in errors:
                assert errors[row["search_id"]] in result["error"]
                assert result["error"].startswith(f"search_id={row['search_id']}")
                assert result["ranking"] == []
            else:
                assert result["error"] is None
                assert len(result["ranking"]) == len(row["candidates"])


def test_job_scores_equal_scorer_score(scorer, rows):
    out = rerank_rows(scorer, rows, ["M2"])
    for row, result in zip(rows, out):
        search = parse_search(row)
        direct = scorer.score(search.context, [c.text for c in search.candidates], "M2")
        by_doc = {r["doc_id"]: r["score"] for r in result["ranking"]}
        got = np.array([by_doc[c.doc_id] for c in search.candidates], dtype=np.float32)
        np.testing.assert_allclose(got, direct, atol=1e-5, rtol=0)
        assert [r["rank"] for r in result["ranking"]] == list(range(1, len(got) + 1))


def test_forced_mode_without_its_field_is_a_row_error_other_modes_still_score(scorer, rows):
    row = dict(rows[0], reasoning=None)
    m1, m2 = rerank_rows(scorer, [row], ["M1", "M2"])
    assert "needs the field 'reasoning'" in m1["error"] and m1["ranking"] == []
    assert m2["error"] is None and len(m2["ranking"]) == len(row["candidates"])


def test_auto_mode_records_the_mode_each_row_resolved_to(scorer, rows):
    bare = dict(rows[0], question=None, reasoning=None, search_id="bare")
    out = rerank_rows(scorer, [rows[0], bare], ["auto"])
    assert [r["mode"] for r in out] == ["M3", "M0"]


def test_a_search_that_fails_to_score_fails_alone(scorer, rows):
    class Flaky:
        """Raises whenever the poisoned document is in the call, like a CUDA error would."""

        def score_resolved(self, searches):
            if any("POISON" in doc for _, _, docs in searches for doc in docs):
                raise RuntimeError("device fault")
            return scorer.score_resolved(searches)

    poisoned = dict(rows[1], search_id="poisoned")
    poisoned["candidates"] = [dict(c) for c in rows[1]["candidates"]]
    poisoned["candidates"][0]["text"] = "POISON"
    out = rerank_rows(Flaky(), [rows[0], poisoned, rows[2]], ["M0"])
    assert out[1]["error"] == "search_id=poisoned: scoring failed: RuntimeError: device fault"
    assert out[0]["error"] is None and out[2]["error"] is None


def test_top_k_keeps_the_best_k(scorer, rows):
    full = rerank_rows(scorer, rows[:1], ["M3"])[0]["ranking"]
    top = rerank_rows(scorer, rows[:1], ["M3"], top_k=3)[0]["ranking"]
    assert top == full[:3]


def test_labeler_sees_answer_and_supporting_texts_not_other_candidates(rows):
    row = dict(rows[0], answer="Velmoria-42")
    gold = [c for c in row["candidates"] if c["relevance"] == 1][0]
    row["supporting_docs"] = [gold["doc_id"], "not-a-candidate"]
    context = labeler_context(parse_search(row))
    assert context.question.startswith(row["question"])
    assert "#Gold Answer: Velmoria-42" in context.question
    assert gold["text"] in context.question
    others = [c["text"] for c in row["candidates"] if c["doc_id"] != gold["doc_id"]]
    assert not any(text in context.question for text in others)
    assert context.sub_query == row["sub_query"] and context.reasoning == row["reasoning"]


def test_relabel_takes_labeler_top1_as_positive_and_bottom7_as_negatives(tiny_qwen3_dir, rows):
    from acare_ray.scoring import Scorer

    labeler = Scorer.from_pretrained(str(tiny_qwen3_dir), instruction=LABELER_INSTRUCTION)
    failed = dict(rows[1], judge_ok=False)
    short = dict(rows[2], candidates=rows[2]["candidates"][:7])
    out = relabel_rows(labeler, [rows[0], failed, short], negatives=7)
    assert [r["status"] for r in out] == ["ok", "failed_trajectory", "too_few_candidates"]
    assert "judge_ok is False" in out[1]["error"] and out[1]["positive"] is None
    assert "candidates has 7 entries, a group needs 8" in out[2]["error"]
    search = parse_search(rows[0])
    scores = labeler.score(labeler_context(search), [c.text for c in search.candidates])
    order = np.argsort(-scores, kind="stable")
    ids = [search.candidates[i].doc_id for i in order]
    group = out[0]
    assert group["positive"]["doc_id"] == ids[0]
    assert [d["doc_id"] for d in group["negatives"]] == ids[-7:]
    assert group["question"] == rows[0]["question"]  # the agent's context, not the labeler's
    assert group["session_id"] == rows[0]["session_id"] and group["error"] is None


def test_skip_written_drops_exactly_the_written_ids_and_keeps_null_ids():
    batch = pa.table({"search_id": ["a", None, "b", "c", "a"], "x": [1, 2, 3, 4, 5]})
    done = np.unique(digests(pa.array(["a", "c", "zzz"])))
    kept = skip_written(batch, [done])
    assert kept.column("search_id").to_pylist() == [None, "b"]
    assert kept.column("x").to_pylist() == [2, 3]
    assert skip_written(batch, [np.unique(digests(pa.array([], pa.string())))]).equals(batch)


def test_digests_are_distinct_for_distinct_ids():
    ids = pa.array([f"search-{i}" for i in range(20_000)])
    assert np.unique(digests(ids)).size == 20_000


def _gold_rows(rows):
    """Searches with two gold candidates, one unjudged candidate and supporting titles."""
    out = []
    for row in rows[:3]:
        candidates = [dict(c) for c in row["candidates"]]
        for k, c in enumerate(candidates):
            c["relevance"] = 1 if k in (2, 5) else 0
        candidates[7]["relevance"] = None
        out.append(dict(row, candidates=candidates, supporting_titles=["Page A", "Page B"]))
    return out


@pytest.mark.parametrize("negatives_from", ["bottom", "hard"])
def test_gold_aware_relabel_takes_a_gold_positive_and_no_gold_negative(
    tiny_qwen3_dir, rows, negatives_from
):
    from acare_ray.scoring import Scorer

    labeler = Scorer.from_pretrained(str(tiny_qwen3_dir), instruction=LABELER_INSTRUCTION)
    gold_rows = _gold_rows(rows)
    no_gold = dict(gold_rows[1], candidates=[dict(c, relevance=0) for c in rows[1]["candidates"]])
    failed = dict(gold_rows[2], judge_ok=False)
    batch = [gold_rows[0], no_gold, failed, {"search_id": "bad"}]
    out = relabel_rows(labeler, batch, 4, gold_aware=True, negatives_from=negatives_from)
    assert len(out) == len(batch)  # rows in == rows out
    assert [r["status"] for r in out] == ["ok", "no_gold_candidate", "failed_trajectory", "invalid"]
    search = parse_search(gold_rows[0])
    context = labeler_context(search, ["Page A", "Page B"])
    assert "#Supporting Titles: Page A; Page B" in context.question
    scores = labeler.score(context, [c.text for c in search.candidates])
    order = [int(i) for i in np.argsort(-scores, kind="stable")]
    gold = [i for i in order if i in (2, 5)]
    judged_negative = [i for i in order if i not in (2, 5, 7)]
    expected = judged_negative[:4] if negatives_from == "hard" else judged_negative[-4:]
    group = out[0]
    assert group["positive"]["doc_id"] == search.candidates[gold[0]].doc_id
    assert [d["doc_id"] for d in group["negatives"]] == [
        search.candidates[i].doc_id for i in expected
    ]
    kept = relabel_rows(labeler, [failed], 4, gold_aware=True, keep_failed=True)
    assert kept[0]["status"] == "ok"
    gold_ids = {search.candidates[i].doc_id for i in (2, 5)}
    assert not gold_ids & {d["doc_id"] for d in group["negatives"]}


def test_gold_aware_relabel_needs_enough_judged_non_gold_candidates(tiny_scorer, rows):
    row = _gold_rows(rows)[0]
    row["candidates"] = row["candidates"][:8]  # 2 gold, 1 unjudged, 5 judged non-gold
    out = relabel_rows(tiny_scorer, [row], 6, gold_aware=True)
    assert out[0]["status"] == "too_few_candidates"
    assert "5 judged non-gold candidates, a group needs 6" in out[0]["error"]
