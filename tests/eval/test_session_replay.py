"""Session replay: unseen-only top-k per search, session recall, session-paired tests."""

from __future__ import annotations

import numpy as np
import pytest

from acare_ray.eval.ir_metrics import paired_randomization_test
from acare_ray.eval.session_replay import SessionSearch, replay_session, session_means
from acare_ray.offline.session_eval import SessionData, Significance, session_section


def test_replay_returns_only_unseen_documents_and_counts_recall_by_page():
    pages = {"a1": "A", "a2": "A", "b1": "B", "x": "X", "y": "Y", "z": "Z"}
    searches = [SessionSearch("s1", pages), SessionSearch("s2", pages), SessionSearch("s3", pages)]
    run = {
        "s1": {"x": 3.0, "a1": 2.0, "y": 1.0, "b1": 0.0},
        "s2": {"x": 3.0, "a1": 2.5, "a2": 2.0, "z": 1.0, "b1": 0.5},
        "s3": {"b1": 9.0, "y": 1.0},
    }
    replay = replay_session("sess", searches, run, {"A", "B"}, depth=2)
    # by hand: s1 -> x, a1 (A found); s2 -> a2, z (x and a1 already shown); s3 -> b1 (B), y
    assert replay.returned == (("x", "a1"), ("a2", "z"), ("b1", "y"))
    assert replay.first_found == {"A": 1, "B": 3}
    assert replay.recall_after == (0.5, 0.5, 1.0)
    assert replay.useful == (0.5, 0.5, 0.5)
    assert replay.measures(2) == {
        "session_recall": 1.0,
        "session_recall_mean": pytest.approx(2 / 3),
        "useful@2": pytest.approx(0.5),
    }


def test_no_document_is_returned_twice_in_a_session():
    rng = np.random.default_rng(0)
    docs = [f"d{i}" for i in range(40)]
    pages = {d: f"p{int(d[1:]) // 3}" for d in docs}
    searches = [SessionSearch(f"s{k}", pages) for k in range(6)]
    run = {s.search_id: {d: float(v) for d, v in zip(docs, rng.normal(size=40))} for s in searches}
    replay = replay_session("sess", searches, run, {"p0", "p5"}, depth=10)
    shown = [d for part in replay.returned for d in part]
    assert len(shown) == len(set(shown)) == 40
    assert [len(part) for part in replay.returned] == [10, 10, 10, 10, 0, 0]


def test_a_search_missing_from_the_run_returns_nothing_and_empty_gold_is_an_error():
    searches = [SessionSearch("s1", {}), SessionSearch("s2", {})]
    replay = replay_session("sess", searches, {"s2": {"g": 1.0}}, {"g"})
    assert replay.returned == ((), ("g",)) and replay.first_found == {"g": 2}
    with pytest.raises(ValueError, match="session_id=sess: the gold set is empty"):
        replay_session("sess", searches, {}, set())


def _data(n_sessions: int) -> tuple[SessionData, dict, dict]:
    rng = np.random.default_rng(1)
    data, runs, per_query = SessionData(), {"M0": {}, "M2": {}}, {"M0": {}, "M2": {}}
    for mode in per_query:
        per_query[mode]["nDCG@10"] = {}
    for s in range(n_sessions):
        sid = f"sess{s}"
        pages = {f"{sid}-d{i}": f"{sid}-p{i % 4}" for i in range(12)}
        data.gold[sid] = {f"{sid}-p0"}
        data.searches[sid] = []
        for k in range(1 + s % 3):
            qid = f"{sid}:s{k}"
            data.searches[sid].append(SessionSearch(qid, pages))
            data.session_of[qid] = sid
            for mode in runs:
                runs[mode][qid] = {d: float(v) for d, v in zip(pages, rng.normal(size=12))}
                per_query[mode]["nDCG@10"][qid] = float(rng.uniform())
    return data, runs, per_query


def test_session_paired_test_equals_metrics_on_the_session_means():
    data, runs, per_query = _data(12)
    section = session_section(
        data, runs, per_query, ["M0", "M2"], significance=Significance(n_resamples=2000)
    )
    row = next(r for r in section["comparisons"] if r["measure"] == "nDCG@10 (session mean)")
    a = session_means(per_query["M0"]["nDCG@10"], data.session_of)
    b = session_means(per_query["M2"]["nDCG@10"], data.session_of)
    expected = paired_randomization_test(a, b, n_resamples=2000, seed=0)
    assert row["p_value"] == expected.p_value and row["n_sessions"] == 12
    assert row["diff"] == pytest.approx(expected.mean_diff)
    recall = next(r for r in section["comparisons"] if r["measure"] == "session_recall")
    replayed = {
        mode: {
            sid: replay_session(sid, data.searches[sid], runs[mode], data.gold[sid]).recall_after[
                -1
            ]
            for sid in data.searches
        }
        for mode in runs
    }
    expected = paired_randomization_test(replayed["M0"], replayed["M2"], n_resamples=2000)
    assert recall["p_value"] == expected.p_value
    assert section["counts"] == {
        "sessions": 12,
        "evaluated": 12,
        "no_gold_page": 0,
        "not_scored_in_every_mode": 0,
        "searches": sum(len(v) for v in data.searches.values()),
    }


def test_sessions_without_gold_or_with_an_unscored_search_are_counted_not_replayed():
    data, runs, per_query = _data(6)
    data.gold["sess0"] = set()
    del runs["M2"]["sess1:s0"]
    section = session_section(
        data, runs, per_query, ["M0", "M2"], significance=Significance(n_resamples=200)
    )
    assert section["counts"]["no_gold_page"] == 1
    assert section["counts"]["not_scored_in_every_mode"] == 1
    assert section["counts"]["evaluated"] == 4
    assert set(section["per_session"]["M0"]["session_recall"]) == {f"sess{i}" for i in range(2, 6)}
