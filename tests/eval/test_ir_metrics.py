import math
import random

import numpy as np
import pytest

ir_measures = pytest.importorskip("ir_measures")
pytrec_eval = pytest.importorskip("pytrec_eval")
from ir_measures import RR, R, nDCG  # noqa: E402

from acare_ray.eval.ir_metrics import (  # noqa: E402
    bootstrap_ci,
    evaluate,
    holm_bonferroni,
    paired_bootstrap_test,
    paired_randomization_test,
    parse_measure,
    rank_docs,
    write_trec_qrels,
    write_trec_run,
)


def _random_collection(seed: int, ties: bool = True) -> tuple[dict, dict]:
    """50 judged queries with graded labels 0-2, plus the awkward cases trec_eval must handle."""
    rng = random.Random(seed)
    qrels, run = {}, {}
    for q in range(50):
        qid = f"q{q}"
        docs = [f"d{q}_{i}" for i in range(rng.randint(5, 40))]
        judged = rng.sample(docs, rng.randint(1, len(docs)))
        qrels[qid] = {d: rng.choice([0, 0, 0, 1, 2]) for d in judged}
        if ties:
            scores = {d: round(rng.uniform(-3, 3), 1) for d in docs}  # many exact ties
            a, b = rng.sample(docs, 2)
            scores[b] = float(np.nextafter(scores[a], np.inf))  # differ in float64 only
        else:
            scores = {d: rng.uniform(-3, 3) for d in docs}
        run[qid] = scores
    qrels["q0"] = {d: 0 for d in qrels["q0"]}  # judged, nothing relevant
    for qid in ("q1", "q2", "q3"):  # judged, never retrieved
        del run[qid]
    run["q4"] = {}  # retrieved nothing
    run["extra"] = {"x1": 1.0, "x2": 0.5}  # retrieved, never judged
    return qrels, run


def _rr_at(values: dict[str, float], k: int) -> dict[str, float]:
    # trec_eval has no RR cutoff: RR@k is recip_rank when the first hit is within k, else 0.
    return {q: v if v >= 1 / k else 0.0 for q, v in values.items()}


def _assert_same(ours: dict[str, dict[str, float]], reference: dict[str, dict[str, float]]):
    for name, values in reference.items():
        assert ours[name].keys() == values.keys(), name
        for qid, value in values.items():
            assert ours[name][qid] == pytest.approx(value, abs=1e-12), (name, qid)


def _ours_vs_pytrec_eval(qrels: dict, run: dict) -> None:
    names = {"ndcg_cut_10": "nDCG@10", "recall_10": "Recall@10", "recall_20": "Recall@20"}
    names["recip_rank"] = "RR@1000"
    ours = evaluate(qrels, run, [*names.values(), "RR@10"])
    per_query = pytrec_eval.RelevanceEvaluator(qrels, set(names)).evaluate(run)
    reference = {name: {q: v[key] for q, v in per_query.items()} for key, name in names.items()}
    reference["RR@10"] = _rr_at(reference["RR@1000"], 10)
    _assert_same(ours.per_query, reference)
    for name, values in reference.items():
        assert ours.mean[name] == pytest.approx(np.mean(list(values.values())), abs=1e-12)


def _ours_vs_ir_measures(qrels: dict, run: dict) -> None:
    """ir_measures scores judged queries missing from the run as 0 (trec_eval -c)."""
    pairs = {nDCG @ 10: "nDCG@10", R @ 10: "Recall@10", R @ 20: "Recall@20", RR: "RR@1000"}
    ours = evaluate(qrels, run, [*pairs.values(), "RR@10"], missing_as_zero=True)
    reference: dict[str, dict[str, float]] = {name: {} for name in pairs.values()}
    for metric in ir_measures.iter_calc(list(pairs), qrels, run):
        reference[pairs[metric.measure]][metric.query_id] = metric.value
    reference["RR@10"] = _rr_at(reference["RR@1000"], 10)
    _assert_same(ours.per_query, reference)
    aggregate = ir_measures.calc_aggregate(list(pairs), qrels, run)
    for measure, name in pairs.items():
        assert ours.mean[name] == pytest.approx(aggregate[measure], abs=1e-12), name


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_matches_pytrec_eval_on_random_runs_with_ties_and_missing_queries(seed):
    _ours_vs_pytrec_eval(*_random_collection(seed))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_matches_ir_measures_when_missing_queries_count_as_zero(seed):
    _ours_vs_ir_measures(*_random_collection(seed))


def test_evaluated_queries_are_those_judged_and_in_the_run():
    qrels, run = _random_collection(0)
    ours = evaluate(qrels, run)
    assert "q0" in ours.query_ids and "q4" in ours.query_ids
    assert not {"q1", "q2", "q3", "extra"} & set(ours.query_ids)
    assert len(ours.query_ids) == 47
    assert ours.per_query["nDCG@10"]["q0"] == 0.0 and ours.per_query["Recall@10"]["q4"] == 0.0
    complete = evaluate(qrels, run, missing_as_zero=True)
    assert set(complete.query_ids) == set(ours.query_ids) | {"q1", "q2", "q3"}
    assert all(complete.per_query["RR@10"][q] == 0.0 for q in ("q1", "q2", "q3"))
    assert complete.mean["nDCG@10"] == pytest.approx(ours.mean["nDCG@10"] * 47 / 50)


def test_rr_cutoff_matches_ir_measures_msmarco_provider_when_there_are_no_ties():
    qrels, run = _random_collection(5, ties=False)
    ours = evaluate(qrels, run, ["RR@10"], missing_as_zero=True).per_query["RR@10"]
    reference = {m.query_id: m.value for m in ir_measures.iter_calc([RR @ 10], qrels, run)}
    assert ours == pytest.approx(reference)


def test_ties_break_by_docno_descending_like_trec_eval():
    # ir_measures' RR@k (MS MARCO code) would put "a" first; trec_eval puts "b" first.
    assert rank_docs({"a": 1.0, "b": 1.0, "c": 2.0}) == ["c", "b", "a"]
    assert rank_docs({"d10": 0.0, "d9": 0.0, "d1": 0.0}) == ["d9", "d10", "d1"]
    qrels, run = {"q": {"a": 1}}, {"q": {"a": 1.0, "b": 1.0}}
    assert evaluate(qrels, run, ["RR@10"]).mean["RR@10"] == 0.5
    trec = pytrec_eval.RelevanceEvaluator(qrels, {"recip_rank"}).evaluate(run)
    assert trec["q"]["recip_rank"] == 0.5
    assert ir_measures.calc_aggregate([RR @ 10], qrels, run)[RR @ 10] == 1.0


def test_scores_equal_in_float32_are_ties():
    above = float(np.nextafter(1.0, 2.0))
    assert np.float32(above) == np.float32(1.0)
    assert rank_docs({"a": above, "b": 1.0}) == ["b", "a"]
    one_ulp32 = float(np.nextafter(np.float32(1.0), np.float32(2.0)))
    assert rank_docs({"a": one_ulp32, "b": 1.0}) == ["a", "b"]


def test_ndcg_recall_rr_on_a_hand_computed_query():
    qrels = {"q": {"a": 2, "b": 0, "c": 1, "d": 1, "e": -1}}
    run = {"q": {"x": 0.9, "a": 0.8, "e": 0.7, "c": 0.6, "b": 0.5}}
    result = evaluate(qrels, run, ["ndcg@3", "recall@4", "mrr@10", "ndcg@10"]).per_query
    dcg3 = 2 / math.log2(3)
    ideal3 = 2 + 1 / math.log2(3) + 1 / math.log2(4)
    assert result["nDCG@3"]["q"] == pytest.approx(dcg3 / ideal3)
    dcg10 = dcg3 + 1 / math.log2(5)
    assert result["nDCG@10"]["q"] == pytest.approx(dcg10 / ideal3)
    assert result["Recall@4"]["q"] == pytest.approx(2 / 3)
    assert result["RR@10"]["q"] == 0.5


def test_bad_inputs_name_the_problem():
    with pytest.raises(ValueError, match="unknown measure 'P@10'"):
        parse_measure("P@10")
    with pytest.raises(ValueError, match="no query is in both"):
        evaluate({"q1": {"a": 1}}, {"q2": {"a": 1.0}})
    with pytest.raises(ValueError, match=r"run\['q'\]\['a'\]: score is NaN"):
        evaluate({"q": {"a": 1}}, {"q": {"a": float("nan")}})
    with pytest.raises(ValueError, match=r"qrels\['q'\]\['a'\]: relevance '1' is not an int"):
        evaluate({"q": {"a": "1"}}, {"q": {"a": 1.0}})


def test_trec_files_written_here_evaluate_the_same_in_ir_measures(tmp_path):
    qrels, run = _random_collection(3)
    assert write_trec_run(run, tmp_path / "run.txt", tag="acare-M3") == sum(map(len, run.values()))
    assert write_trec_qrels(qrels, tmp_path / "qrels.txt") == sum(map(len, qrels.values()))
    lines = (tmp_path / "run.txt").read_text().splitlines()
    qid, q0, _, rank, _, tag = lines[0].split()
    assert (q0, rank, tag) == ("Q0", "1", "acare-M3")
    reread_run = {}
    for doc in ir_measures.read_trec_run(str(tmp_path / "run.txt")):
        reread_run.setdefault(doc.query_id, {})[doc.doc_id] = doc.score
    reread_qrels = {}
    for qrel in ir_measures.read_trec_qrels(str(tmp_path / "qrels.txt")):
        reread_qrels.setdefault(qrel.query_id, {})[qrel.doc_id] = qrel.relevance
    assert reread_qrels == qrels
    assert reread_run == {q: docs for q, docs in run.items() if docs}
    _ours_vs_pytrec_eval(reread_qrels, reread_run)


def test_writers_reject_ids_with_whitespace(tmp_path):
    with pytest.raises(ValueError, match="run\\['q'\\] doc id 'a b'"):
        write_trec_run({"q": {"a b": 1.0}}, tmp_path / "run.txt")
    with pytest.raises(ValueError, match="relevance 1.5 is not an int"):
        write_trec_qrels({"q": {"a": 1.5}}, tmp_path / "qrels.txt")


def _systems(seed: int, gap: float, n: int = 50) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    a = rng.uniform(0, 1, n)
    return a, np.clip(a + gap + rng.normal(0, 0.1, n), 0, 1)


def test_randomization_test_gives_p_one_for_identical_systems():
    a, _ = _systems(0, 0.0)
    result = paired_randomization_test(a, a.copy(), n_resamples=2000, seed=1)
    assert result.p_value == 1.0 and result.mean_diff == 0.0


def test_randomization_and_bootstrap_detect_a_clearly_better_system():
    a, b = _systems(0, 0.15)
    rand = paired_randomization_test(a, b, n_resamples=5000, seed=1)
    boot = paired_bootstrap_test(a, b, n_resamples=5000, seed=1)
    assert rand.p_value < 0.001 and boot.p_value < 0.001
    assert rand.mean_diff == pytest.approx(b.mean() - a.mean())
    low, high = boot.ci
    assert 0 < low < rand.mean_diff < high


def test_no_real_difference_is_not_significant():
    rng = np.random.default_rng(7)
    a = rng.uniform(0, 1, 60)
    b = a + rng.normal(0, 0.1, 60)
    b += a.mean() - b.mean()  # same mean, different per-query values
    assert paired_randomization_test(a, b, seed=3).p_value > 0.5
    boot = paired_bootstrap_test(a, b, seed=3)
    assert boot.p_value > 0.5 and boot.ci[0] < 0 < boot.ci[1]


def test_tests_are_deterministic_given_a_seed_and_accept_mappings():
    a, b = _systems(2, 0.02)
    qa = {f"q{i}": v for i, v in enumerate(a)}
    qb = {f"q{i}": v for i, v in enumerate(b)}
    assert paired_randomization_test(qa, qb, seed=5) == paired_randomization_test(qa, qb, seed=5)
    assert paired_bootstrap_test(qa, qb, seed=5) == paired_bootstrap_test(qa, qb, seed=5)
    assert paired_bootstrap_test(qa, qb, seed=5) != paired_bootstrap_test(qa, qb, seed=6)
    with pytest.raises(ValueError, match="query sets differ"):
        paired_randomization_test(qa, {**qb, "extra": 0.0})


def test_bootstrap_ci_brackets_the_mean_and_narrows_with_more_queries():
    rng = np.random.default_rng(0)
    small, large = rng.uniform(0, 1, 20), rng.uniform(0, 1, 2000)
    mean, low, high = bootstrap_ci(small, seed=0)
    assert low < mean < high and mean == pytest.approx(small.mean())
    _, low_l, high_l = bootstrap_ci(large, seed=0)
    assert high_l - low_l < high - low
    assert low_l < 0.5 < high_l


def test_holm_matches_hand_computation():
    p = [0.01, 0.04, 0.03, 0.005]
    # sorted: 0.005*4=0.02, 0.01*3=0.03, 0.03*2=0.06, 0.04*1=0.04 -> running max 0.06
    assert holm_bonferroni(p) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm_bonferroni([0.5, 0.9]) == pytest.approx([1.0, 1.0])
    with pytest.raises(ValueError, match="in \\[0, 1\\]"):
        holm_bonferroni([0.1, 1.2])
