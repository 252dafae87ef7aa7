"""benchmarks/recipe_all.py: the question-level splits and the focused, Holm-corrected tests
it publishes (checked against a hand computation on a small report)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from benchmarks_import import BENCHMARKS, benchmark_modules

from acare_ray.data.io import write_parquet
from acare_ray.metrics import holm_bonferroni, paired_randomization_test


@pytest.fixture(scope="module")
def recipe():
    with benchmark_modules("recipe_all") as (recipe_all,):
        yield recipe_all


def test_by_questions_holds_whole_questions_out_and_repeats(recipe):
    table = pa.table({"question_id": [f"q{i // 3}" for i in range(60)], "x": list(range(60))})
    rest, held = recipe._by_questions(table, "question_id", 0.1, 0)
    assert rest.num_rows + held.num_rows == 60 and held.num_rows == 6  # 2 of 20 questions
    assert not set(rest.column("question_id").to_pylist()) & set(
        held.column("question_id").to_pylist()
    )
    again = recipe._by_questions(table, "question_id", 0.1, 0)[1]
    assert again.column("x").to_pylist() == held.column("x").to_pylist()


def _write_trec(path: Path, run: dict[str, list[str]]) -> str:
    lines = [
        f"{qid} Q0 {doc} {rank} {-rank} t" for qid, docs in run.items() for rank, doc in
        enumerate(docs, start=1)
    ]  # fmt: skip
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_focused_tests_are_session_paired_and_holm_corrected(recipe, tmp_path):
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
    table = pa.table(
        {"search_id": [s for s, _ in searches], "session_id": [x for _, x in searches]}
    )
    report = {
        "input": str(write_parquet(table, tmp_path / "test.parquet")),
        "files": {"qrels": str(tmp_path / "qrels.trec"), "runs": runs},
    }

    class Args:
        resamples = 2000

    pairs = [("first_stage", "X"), ("first_stage", "Y"), ("Y", "X")]
    rows = recipe.focused_tests(report, pairs, Args)
    ndcg_last = 1 / np.log2(4)  # the gold document third: nDCG@10 = (1/log2(4)) / 1
    per_session = {}
    for system, path in runs.items():
        values: dict[str, list[float]] = {}
        for line in Path(path).read_text().splitlines():
            qid, _, doc, rank, _, _ = line.split()
            if doc == "gold":
                value = 1.0 if rank == "1" else ndcg_last
                values.setdefault(dict(searches)[qid], []).append(value)
        per_session[system] = {s: float(np.mean(v)) for s, v in values.items()}
    expected_p = []
    for row, (a, b) in zip(rows, pairs, strict=True):
        test = paired_randomization_test(per_session[a], per_session[b], 2000, 0)
        assert row["sessions"] == 12
        assert row["diff"] == pytest.approx(test.mean_b - test.mean_a)
        assert row["p"] == pytest.approx(test.p_value)
        expected_p.append(test.p_value)
    assert [r["p_holm"] for r in rows] == pytest.approx(holm_bonferroni(expected_p))


def test_make_recipe_runs_stages_the_script_knows(recipe):
    """`make recipe` (README, docs/RESULTS.md) is a ~50-minute run; this checks the command it
    runs parses as written and names only known stages."""
    import shlex

    makefile = (BENCHMARKS.parent / "Makefile").read_text()
    block = makefile.split("\nrecipe:", 1)[1].split("\n\n", 1)[0]
    line = next(x for x in block.splitlines() if "recipe_all.py" in x)
    argv = shlex.split(line.replace("$(SEED)", "0").replace("$(BIN)/", ""))
    args = recipe.build_parser().parse_args(argv[argv.index("benchmarks/recipe_all.py") + 1 :])
    assert set(args.stages.split(",")) == {"data", "train", "fit"} <= set(recipe.STAGES)
    assert args.seed == 0
