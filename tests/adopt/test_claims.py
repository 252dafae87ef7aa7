"""The focused claims of adopt's test stage: session-paired and Holm-corrected (checked against a
hand computation on a small report)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from acare_ray.adopt.claims import claim_tests
from acare_ray.eval.ir_metrics import holm_bonferroni, paired_randomization_test


def _write_trec(path: Path, run: dict[str, list[str]]) -> str:
    lines = [
        f"{qid} Q0 {doc} {rank} {-rank} t" for qid, docs in run.items() for rank, doc in
        enumerate(docs, start=1)
    ]  # fmt: skip
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_claims_are_session_paired_and_holm_corrected(tmp_path):
    rng = np.random.default_rng(0)
    searches = [(f"s{i}", f"sess{i // 2}") for i in range(24)]
    qrels = {sid: {"gold": 1, "a": 0, "b": 0} for sid, _ in searches}
    (tmp_path / "qrels.trec").write_text(
        "".join(f"{q} 0 {d} {r}\n" for q, docs in qrels.items() for d, r in docs.items())
    )
    runs = {}
    for system in ("first_stage", "X", "Y"):
        order = {}
        for sid, _ in searches:
            good = rng.random() < {"first_stage": 0.4, "X": 0.8, "Y": 0.6}[system]
            order[sid] = ["gold", "a", "b"] if good else ["a", "b", "gold"]
        runs[system] = _write_trec(tmp_path / f"{system}.trec", order)
    report = {"files": {"qrels": str(tmp_path / "qrels.trec"), "runs": runs}}
    session_of = dict(searches)
    pairs = [("first_stage", "X"), ("first_stage", "Y"), ("Y", "X")]
    rows = claim_tests(report, pairs, session_of, 2000)
    ndcg_last = 1 / np.log2(4)  # the gold document third: nDCG@10 = (1/log2(4)) / 1
    per_session = {}
    for system, path in runs.items():
        values: dict[str, list[float]] = {}
        for line in Path(path).read_text().splitlines():
            qid, _, doc, rank, _, _ = line.split()
            if doc == "gold":
                value = 1.0 if rank == "1" else ndcg_last
                values.setdefault(session_of[qid], []).append(value)
        per_session[system] = {s: float(np.mean(v)) for s, v in values.items()}
    expected_p = []
    for row, (a, b) in zip(rows, pairs, strict=True):
        test = paired_randomization_test(per_session[a], per_session[b], 2000, 0)
        assert row["sessions"] == 12
        assert row["diff"] == pytest.approx(test.mean_b - test.mean_a)
        assert row["p"] == pytest.approx(test.p_value)
        expected_p.append(test.p_value)
    assert [r["p_holm"] for r in rows] == pytest.approx(holm_bonferroni(expected_p))
    # restricted to some sessions (one agent's), the family is tested on those alone
    some = {f"sess{i}" for i in range(6)}
    restricted = claim_tests(report, pairs[:1], session_of, 2000, sessions=some)
    assert restricted[0]["sessions"] == 6
    with pytest.raises(ValueError, match="1 session"):
        claim_tests(report, pairs[:1], session_of, 2000, sessions={"sess0"})
