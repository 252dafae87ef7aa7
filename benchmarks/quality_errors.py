"""Where a MuSiQue quality-run checkpoint goes wrong, by mode: what does it put first?

For each held-out search (the same question split as ``quality_musique.py``), the top-ranked
paragraph is classed as the step's gold paragraph, the gold paragraph of **another step of the
same question** (relevant to the question, not to this sub-query), or another distractor.
Reported per mode and per step position (first step vs later steps), with the gold paragraph's
mean rank, and nDCG@10 per mode (M1 too: reasoning without the question) with paired
randomization tests against M0.

    RAY_USAGE_STATS_ENABLED=0 .venv/bin/python -m benchmarks.quality_errors \\
        --checkpoint runs/quality_musique/runs/<run>/checkpoint_<step>

writes ``benchmarks/results/quality-musique-errors.{json,md}`` (~6 min on 2 CPU cores).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from acare_ray.data.musique import musique_searches
from acare_ray.data.schema import parse_search
from acare_ray.eval.ir_metrics import bootstrap_ci, evaluate, paired_randomization_test
from acare_ray.scoring import Mode
from benchmarks.quality_musique import rank_searches, split_questions
from benchmarks.report import write_report

ROOT = Path(__file__).resolve().parents[1]
CLASSES = ("gold", "other_step_gold", "distractor")


def classify(test_rows: list[dict], run: dict) -> list[dict]:
    """One record per search with its gold among the candidates: step position, class of the
    top-1 paragraph, rank of the gold. "Another step's gold" is a supporting paragraph of the
    same question that is not this step's (``supporting_docs``)."""
    out = []
    for row in test_rows:
        own = {c["doc_id"] for c in row["candidates"] if c["relevance"] > 0}
        if not own:  # open setting: BM25 missed the gold paragraph
            continue
        scores = run[row["search_id"]]
        ranked = sorted(scores, key=lambda d: -scores[d])
        top = ranked[0]
        if top in own:
            kind = "gold"
        elif top in set(row["supporting_docs"] or ()):
            kind = "other_step_gold"
        else:
            kind = "distractor"
        gold_rank = min(ranked.index(d) for d in own) + 1
        out.append({"step": row["step"], "top1": kind, "gold_rank": gold_rank})
    return out


def summarise(records: list[dict]) -> dict:
    groups = {
        "all": records,
        "first step": [r for r in records if r["step"] == 1],
        "later steps": [r for r in records if r["step"] > 1],
    }
    return {
        name: {
            "searches": len(rs),
            **{k: float(np.mean([r["top1"] == k for r in rs])) for k in CLASSES},
            "mean_gold_rank": float(np.mean([r["gold_rank"] for r in rs])),
        }
        for name, rs in groups.items()
        if rs
    }


def markdown(report: dict) -> str:
    lines = [
        "| mode | nDCG@10 [95% CI] | vs M0 (p, randomization) |",
        "|---|---|---|",
    ]
    for mode, m in report["ndcg@10"].items():
        versus = f"{m['diff_vs_M0']:+.4f} (p {m['p_vs_M0']:.4f})" if "p_vs_M0" in m else "-"
        lines.append(
            f"| {mode} | {m['mean']:.4f} [{m['ci95'][0]:.4f}, {m['ci95'][1]:.4f}] | {versus} |"
        )
    lines += [
        "",
        "| mode | steps | searches | top-1 gold | top-1 another step's gold | top-1 distractor "
        "| mean gold rank |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for mode, by_group in report["modes"].items():
        for name, s in by_group.items():
            lines.append(
                f"| {mode} | {name} | {s['searches']} | {s['gold']:.3f} | "
                f"{s['other_step_gold']:.3f} | {s['distractor']:.3f} | {s['mean_gold_rank']:.2f} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--test-questions", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--modes", nargs="+", default=["M0", "M1", "M2", "M3"])
    parser.add_argument(
        "--setting",
        default="distractor",
        choices=["distractor", "open"],
        help="open: BM25 top-100 over all questions' paragraphs instead of the question's 20",
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    parser.add_argument("--name", default="quality-musique-errors")
    args = parser.parse_args(argv)

    import torch

    from acare_ray.scoring import Scorer

    torch.set_num_threads(args.threads)
    # The split is by question, so the distractor and open tables give the same test questions.
    _, test_table = split_questions(musique_searches(args.setting), args.test_questions, args.seed)
    rows = test_table.to_pylist()
    searches = [parse_search(row, i) for i, row in enumerate(rows)]
    scorer = Scorer.from_pretrained(args.checkpoint, device="cpu")
    qrels = {s.search_id: {c.doc_id: c.relevance for c in s.candidates} for s in searches}
    report = {"checkpoint": args.checkpoint, "setting": args.setting, "modes": {}, "ndcg@10": {}}
    per_query = {}
    for mode in (Mode(m) for m in args.modes):
        run = rank_searches(scorer, searches, mode)
        report["modes"][mode.value] = summarise(classify(rows, run))
        per_query[mode.value] = evaluate(qrels, run, ("nDCG@10",)).per_query["nDCG@10"]
        mean, low, high = bootstrap_ci(list(per_query[mode.value].values()), seed=0)
        report["ndcg@10"][mode.value] = {"mean": mean, "ci95": [low, high]}
        if mode is not Mode.M0 and "M0" in per_query:
            test = paired_randomization_test(per_query["M0"], per_query[mode.value], seed=0)
            report["ndcg@10"][mode.value] |= {"diff_vs_M0": test.mean_diff, "p_vs_M0": test.p_value}
        print(mode.value, json.dumps(report["modes"][mode.value]["all"]), flush=True)
    write_report(report, Path(args.out), args.name, markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
