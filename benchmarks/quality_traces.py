"""Real-agent quality run: does the agent's context make a reranker's top 10 more useful?

The searches are real R1-Searcher trajectories on HotpotQA (``$ACARE_DATA_DIR/agent_traces``, two agents,
the same 302 questions), imported with :func:`acare_ray.data.traces.import_traces`: the agent's
own query and the reasoning it wrote before it, candidates = the agent's 5 returned passages
plus BM25 top-``k`` over the pooled passages, labels = the question's gold supporting pages.
Questions are split (seeded) into a test part and a training part; every recipe is evaluated on
the same test searches with ``acare_ray.offline.evaluate.run`` (a Ray Data job; all four modes,
session replay, tests paired by session, per agent):

- ``untrained``: the MiniLM backbone with a fresh seeded head;
- ``transfer``: a MuSiQue-trained checkpoint (``quality_musique.py``), applied unchanged;
- ``bottom7`` / ``hard7``: MiniLM fine-tuned with the LCE trainer (a Ray Train job, context
  dropout on) on gold-aware groups relabelled (``acare relabel --gold-aware``, the Ray Data
  job) from the training questions' real searches, negatives the labeler's bottom 7 (the
  paper's choice) or its top-ranked 7 non-gold candidates (hard negatives).

Each stage writes its output under ``--work-dir`` and is skipped when that output exists, so an
interrupted run resumes. The cost of the context (tokens scored and seconds per search, by mode)
is measured at the end with the last fine-tuned checkpoint, in-process, alone.

    RAY_USAGE_STATS_ENABLED=0 .venv/bin/python -m benchmarks.quality_traces \\
        --transfer-checkpoint runs/transfer_musique/runs/<run>/checkpoint_000149

writes ``benchmarks/results/quality-traces-cpu-minilm.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from acare_ray.data.io import data_dir, read_parquet, write_parquet
from acare_ray.data.traces import import_traces
from acare_ray.eval.splits import hold_out
from acare_ray.scoring import DEFAULT_MODEL  # noqa: E402
from benchmarks.report import git_commit, write_report

ROOT = Path(__file__).resolve().parents[1]
BACKBONE = DEFAULT_MODEL
MODES = ("M0", "M1", "M2", "M3")
MEASURES = ("nDCG@10", "Recall@10", "RR@10")
SHOWN = ("nDCG@10", "Recall@10", "session_recall", "session_recall_mean", "useful@10")


def split_questions(table: pa.Table, n_test: int, seed: int) -> tuple[pa.Table, pa.Table]:
    """(train, test): ``n_test`` seeded questions held out with every agent's trajectory."""
    return hold_out(table, "question_id", n_test, seed)


def take_questions(table: pa.Table, n: int | None, seed: int) -> pa.Table:
    if n is None:
        return table
    questions = sorted(set(table.column("question_id").to_pylist()))
    chosen = set(np.random.default_rng(seed + 1).permutation(questions)[:n].tolist())
    return table.filter(pa.array([q in chosen for q in table.column("question_id").to_pylist()]))


def evaluate_model(name: str, model: str, test_path: Path, work: Path, args) -> dict:
    from acare_ray.offline.evaluate import EvalConfig, format_table, run
    from acare_ray.offline.job import ActorPool
    from acare_ray.scoring import ScorerSettings

    report_file = work / "eval" / name / "report.json"
    if report_file.exists():
        print(f"[{name}] evaluation found: {report_file}", flush=True)
        return json.loads(report_file.read_text())
    print(f"[{name}] evaluating {model}", flush=True)
    config = EvalConfig(
        input=str(test_path),
        model=model,
        report_dir=str(report_file.parent),
        modes=MODES,
        measures=MEASURES,
        n_resamples=args.resamples,
        pool=ActorPool(min_size=args.workers, max_size=args.workers, batch_size=8),
        scorer=ScorerSettings(max_length=args.max_length if model == BACKBONE else None),
        sessions=True,
        group_by="agent",
    )
    report = run(config)
    print(format_table(report), flush=True)
    return report


def relabel(name: str, train_path: Path, labeler: str, negatives_from: str, work: Path, args):
    from acare_ray.offline.job import ActorPool
    from acare_ray.offline.relabel import RelabelConfig, run

    output = work / "groups" / name
    done = output / "_counts.json"
    if done.exists():
        print(f"[{name}] relabel output found: {output}", flush=True)
        return output, json.loads(done.read_text())
    print(f"[{name}] relabelling with {labeler} ({negatives_from} negatives)", flush=True)
    counts = run(
        RelabelConfig(
            input=str(train_path),
            output=str(output),
            model=labeler,
            negatives=7,
            gold_aware=True,
            negatives_from=negatives_from,
            keep_failed=True,
            pool=ActorPool(min_size=args.workers, max_size=args.workers, batch_size=8),
        )
    )
    summary = {"per_status": {k: v["rows"] for k, v in counts.per_key.items()}, **counts.as_dict()}
    done.write_text(json.dumps(summary, indent=2))
    print(f"[{name}] {counts.describe()}", flush=True)
    return output, summary


def train(name: str, groups: Path, work: Path, args) -> tuple[Path, dict]:
    from acare_ray.scoring import ScorerSettings
    from acare_ray.training import TrainConfig, run

    marker = work / "train" / f"{name}.json"
    if marker.exists():
        info = json.loads(marker.read_text())
        print(f"[{name}] checkpoint found: {info['checkpoint']}", flush=True)
        return Path(info["checkpoint"]), info
    config = TrainConfig(
        data=str(groups),
        model=BACKBONE,
        output=str(work / "train" / "runs"),
        name=f"{name}-seed{args.seed}",
        val_fraction=0.0,
        eval_at_start=False,
        workers=args.workers,
        cpus_per_worker=1,
        batch_groups=2,
        grad_accum=2,
        epochs=args.epochs,
        max_steps=args.max_steps,
        lr=args.lr,
        temperature=0.5,
        seed=args.seed,
        checkpoint_every=25,
        keep_checkpoints=1,
        max_failures=3,
        log_every=10,
        scorer=ScorerSettings(max_length=args.max_length),
    )
    print(f"[{name}] training on {groups}", flush=True)
    started = time.perf_counter()
    checkpoint = run(config)
    info = {
        "checkpoint": str(checkpoint),
        "seconds": time.perf_counter() - started,
        "config": config.to_dict(),
    }
    marker.write_text(json.dumps(info, indent=2))
    print(f"[{name}] trained in {info['seconds']:.0f} s: {checkpoint}", flush=True)
    return checkpoint, info


def context_cost(model: str, test_path: Path, n: int, threads: int) -> dict:
    """Tokens per search and scoring seconds per search, by mode, on ``n`` test searches."""
    import torch

    from acare_ray.data.schema import parse_search
    from acare_ray.scoring import Scorer

    torch.set_num_threads(threads)
    scorer = Scorer.from_pretrained(model, device="cpu")
    rows = read_parquet(test_path).slice(0, n).to_pylist()
    searches = [parse_search(r, i) for i, r in enumerate(rows)]
    out = {}
    for mode in MODES:
        items = [(s.context, [c.text for c in s.candidates]) for s in searches]
        scorer.score_many(items[:2], mode)
        tokens_before = scorer.stats.real_tokens
        started = time.perf_counter()
        for start in range(0, len(items), 8):
            scorer.score_many(items[start : start + 8], mode)
        seconds = time.perf_counter() - started
        tokens = scorer.stats.real_tokens - tokens_before
        out[mode] = {"tokens_per_search": tokens / len(items), "seconds_per_search": seconds / n}
    base = out["M0"]
    for mode in MODES:
        out[mode]["tokens_vs_M0"] = out[mode]["tokens_per_search"] / base["tokens_per_search"]
        out[mode]["seconds_vs_M0"] = out[mode]["seconds_per_search"] / base["seconds_per_search"]
    return {"searches": n, "threads": threads, "model": model, "by_mode": out}


def first_stage_baselines(test_path: Path, resamples: int) -> dict:
    """No reranker: the BM25 order, and the agent's own retriever order (its 5 passages first,
    then BM25), as ``acare eval`` builds them, through the same per-search measures and session
    replay."""
    from acare_ray.eval.ir_metrics import bootstrap_ci, evaluate
    from acare_ray.offline.evaluate import first_stage_runs, load_first_stage
    from acare_ray.offline.session_eval import Significance, load_sessions, session_section

    rows = read_parquet(test_path).to_pylist()
    qrels = {r["search_id"]: {c["doc_id"]: c["relevance"] for c in r["candidates"]} for r in rows}
    product = first_stage_runs(load_first_stage(str(test_path)))  # the eval job's tie rule
    runs = {"bm25": product["first_stage"], "agent": product["agent_order"]}
    qids = sorted(q for q, judged in qrels.items() if any(judged.values()))
    chosen = {q: qrels[q] for q in qids}
    per_query = {name: evaluate(chosen, run, MEASURES).per_query for name, run in runs.items()}
    metrics = {
        name: {
            m: dict(
                zip(("mean", "ci_low", "ci_high"), bootstrap_ci(list(v[m].values()), resamples))
            )
            for m in MEASURES
        }
        for name, v in per_query.items()
    }
    data = load_sessions(str(test_path), "agent")
    significance = Significance(n_resamples=resamples)
    sessions = session_section(data, runs, per_query, list(runs), significance=significance)
    shallow = session_section(data, runs, {}, list(runs), depth=5, significance=significance)
    return {
        "metrics": metrics,
        "sessions": sessions["metrics"],
        "sessions_depth5": shallow["metrics"],
        "counts": sessions["counts"],
    }


def sessions_at_depth(report: dict, test_path: Path, depth: int, resamples: int) -> dict:
    """The session replay of an evaluation's written rankings with another depth (no
    rescoring): all sessions and per agent. R1-Searcher shows its agent 5 passages a search."""
    from acare_ray.offline.evaluate import load_runs
    from acare_ray.offline.session_eval import Significance, load_sessions, session_section

    runs, _ = load_runs(report["files"]["rerank_output"], tuple(MODES))
    data = load_sessions(str(test_path), "agent")
    options = {"depth": depth, "significance": Significance(n_resamples=resamples)}
    out = {"all": session_section(data, runs, {}, MODES, **options)}
    for agent in sorted(set(data.group_of.values())):
        keep = lambda sid, a=agent: data.group_of.get(sid) == a  # noqa: E731
        out[agent] = session_section(data, runs, {}, MODES, keep=keep, **options)
    for section in out.values():
        section.pop("per_session", None)
    return out


def _summary(report: dict) -> dict:
    """The figures shown in the tables: per-search and session measures, all and per agent."""

    def section(metrics: dict, sessions: dict) -> dict:
        out = {}
        for mode in MODES:
            out[mode] = {m: metrics[mode][m] for m in MEASURES if m in metrics.get(mode, {})}
            out[mode] |= {m: v for m, v in sessions.get("metrics", {}).get(mode, {}).items()}
        tests = [
            r
            for r in sessions.get("comparisons", [])
            if r["a"] == "M0" and (r["measure"] in SHOWN or r["measure"].endswith("(session mean)"))
        ]
        return {"by_mode": out, "tests_vs_M0": tests, "counts": sessions.get("counts")}

    out = {"all": section(report["metrics"], report.get("sessions", {}))}
    for agent, group in report.get("groups", {}).items():
        out[agent] = section(group.get("metrics", {}), group.get("sessions", {}))
    out["first_found"] = report.get("sessions", {}).get("first_found")
    out["queries"] = report["queries"]
    return out


def markdown(result: dict) -> str:
    lines = []
    for part in ("all", "qwen", "llama"):
        lines += [
            "",
            f"### {part}" if part != "all" else "### both agents",
            "",
            "| recipe | mode | nDCG@10 | Recall@10 | session recall | session recall (mean) | "
            "useful@10 |",
            "|---|---|---|---|---|---|---|",
        ]
        for recipe, summary in result["recipes"].items():
            if part not in summary:
                continue
            tests = {
                (t["b"], t["measure"]): t for t in summary[part]["tests_vs_M0"] if t["significant"]
            }
            for mode in MODES:
                values = summary[part]["by_mode"][mode]
                cells = []
                for measure in SHOWN:
                    entry = values.get(measure)
                    if entry is None:
                        cells.append("-")
                        continue
                    key = "nDCG@10 (session mean)" if measure == "nDCG@10" else measure
                    key = "Recall@10 (session mean)" if measure == "Recall@10" else key
                    mark = "*" if (mode, key) in tests else ""
                    cells.append(
                        f"{entry['mean']:.3f} [{entry['ci_low']:.3f}, {entry['ci_high']:.3f}]{mark}"
                    )
                lines.append(f"| {recipe} | {mode} | " + " | ".join(cells) + " |")
        lines += ["", "| recipe | measure | b vs M0 | diff [95% CI] | p | p (Holm) | sessions |"]
        lines.append("|---|---|---|---|---|---|---|")
        for recipe, summary in result["recipes"].items():
            if part not in summary:
                continue
            for t in summary[part]["tests_vs_M0"]:
                lines.append(
                    f"| {recipe} | {t['measure']} | {t['b']} | {t['diff']:+.3f} "
                    f"[{t['ci_low']:+.3f}, {t['ci_high']:+.3f}] | {t['p_value']:.4f} | "
                    f"{t['p_holm']:.4f} | {t['n_sessions']} |"
                )
    shallow = result.get("sessions_depth5")
    if shallow:
        lines += [
            "",
            "Session replay with 5 documents a search (what R1-Searcher shows its agent):",
        ]
        lines += [
            "",
            "| recipe | part | mode | session recall | session recall (mean) | useful@5 |",
        ]
        lines.append("|---|---|---|---|---|---|")
        for recipe, parts in shallow.items():
            for part, section in parts.items():
                marks = {
                    (t["b"], t["measure"])
                    for t in section.get("comparisons", [])
                    if t["a"] == "M0" and t["significant"]
                }
                for mode in MODES:
                    values = section.get("metrics", {}).get(mode, {})
                    cells = []
                    for m in ("session_recall", "session_recall_mean", "useful@5"):
                        e = values.get(m)
                        mark = "*" if (mode, m) in marks else ""
                        cells.append(
                            f"{e['mean']:.3f} [{e['ci_low']:.3f}, {e['ci_high']:.3f}]{mark}"
                            if e
                            else "-"
                        )
                    lines.append(f"| {recipe} | {part} | {mode} | " + " | ".join(cells) + " |")
    baselines = result.get("baselines")
    if baselines:
        lines += ["", "First-stage orders, no reranker (both agents):", ""]
        lines.append(
            "| order | nDCG@10 | Recall@10 | session recall | session recall (mean) | useful@10 |"
        )
        lines.append("|---|---|---|---|---|---|")
        for name in baselines["metrics"]:
            values = {**baselines["metrics"][name], **baselines["sessions"][name]}
            cells = [
                f"{values[m]['mean']:.3f} [{values[m]['ci_low']:.3f}, {values[m]['ci_high']:.3f}]"
                for m in SHOWN
            ]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
        lines += ["", "| order (5 a search) | session recall | session recall (mean) | useful@5 |"]
        lines.append("|---|---|---|---|")
        for name, values in baselines["sessions_depth5"].items():
            cells = [
                f"{values[m]['mean']:.3f} [{values[m]['ci_low']:.3f}, {values[m]['ci_high']:.3f}]"
                for m in ("session_recall", "session_recall_mean", "useful@5")
            ]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    cost = result.get("cost")
    if cost:
        lines += [
            "",
            f"Context cost ({cost['searches']} test searches, {cost['threads']} threads):",
        ]
        lines += [
            "",
            "| mode | tokens / search | x M0 | s / search | x M0 |",
            "|---|---|---|---|---|",
        ]
        for mode, c in cost["by_mode"].items():
            lines.append(
                f"| {mode} | {c['tokens_per_search']:.0f} | {c['tokens_vs_M0']:.2f} | "
                f"{c['seconds_per_search']:.3f} | {c['seconds_vs_M0']:.2f} |"
            )
    return "\n".join(lines).lstrip() + "\n"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--traces", default=str(data_dir() / "agent_traces"))
    parser.add_argument("--k", type=int, default=20, help="BM25 candidates per search")
    parser.add_argument("--test-questions", type=int, default=60)
    parser.add_argument("--label-questions", type=int, default=140, help="training questions")
    parser.add_argument("--transfer-checkpoint", default=None)
    parser.add_argument("--labeler", default=None, help="default: the transfer checkpoint")
    parser.add_argument("--recipes", default="untrained,transfer,bottom7,hard7")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--max-steps", type=int, default=None)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--max-length", type=int, default=320)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--resamples", type=int, default=10_000)
    parser.add_argument("--cost-searches", type=int, default=40)
    parser.add_argument("--work-dir", default=str(ROOT / "runs" / "quality_traces"))
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    parser.add_argument("--name", default="quality-traces-cpu-minilm")
    args = parser.parse_args(argv)
    recipes = [r for r in args.recipes.split(",") if r]
    labeler = args.labeler or args.transfer_checkpoint
    if ("transfer" in recipes and not args.transfer_checkpoint) or (
        any(r in recipes for r in ("bottom7", "hard7")) and not labeler
    ):
        parser.error("transfer and the relabelled recipes need --transfer-checkpoint or --labeler")
    return args


def prepare_data(args: argparse.Namespace, work: Path) -> tuple[Path, Path, dict]:
    """The imported traces split into held-out test and labelled training questions: the test
    and training Parquet files and what they hold."""
    searches_path = work / "searches.parquet"
    traces = Path(args.traces)
    if not searches_path.exists():
        result = import_traces(
            sorted((traces / "r1-searcher").glob("*.jsonl")),
            "r1-searcher",
            traces / "hotpotqa_gold.jsonl",
            k=args.k,
        )
        print(result.describe(), flush=True)
        write_parquet(result.table, searches_path)
    table = read_parquet(searches_path)
    train_table, test_table = split_questions(table, args.test_questions, args.seed)
    label_table = take_questions(train_table, args.label_questions, args.seed)
    test_path = write_parquet(test_table, work / "test.parquet")
    train_path = write_parquet(label_table, work / "train.parquet")
    data = {
        "k": args.k,
        "test_questions": args.test_questions,
        "test_searches": test_table.num_rows,
        "test_sessions": len(set(test_table.column("session_id").to_pylist())),
        "training_questions": len(set(label_table.column("question_id").to_pylist())),
        "training_searches": label_table.num_rows,
        "candidates_per_search": float(
            np.mean([len(c) for c in test_table.column("candidates").to_pylist()])
        ),
    }
    print(f"data: {data}", flush=True)
    return test_path, train_path, data


def main(argv: list[str] | None = None) -> int:
    import ray

    from acare_ray.training.trainer import start_local_ray

    args = parse_args(argv)
    recipes = [r for r in args.recipes.split(",") if r]
    labeler = args.labeler or args.transfer_checkpoint
    started = time.perf_counter()
    commit = git_commit()
    work = Path(args.work_dir)
    test_path, train_path, data = prepare_data(args, work)

    # One logical CPU more than the actors use, for the read and write tasks beside them.
    start_local_ray(num_cpus=args.workers + 1, log_to_driver=True)
    reports, relabels, trainings = {}, {}, {}
    try:
        for recipe in recipes:
            if recipe == "untrained":
                reports[recipe] = evaluate_model(recipe, BACKBONE, test_path, work, args)
            elif recipe == "transfer":
                model = args.transfer_checkpoint
                reports[recipe] = evaluate_model(recipe, model, test_path, work, args)
            elif recipe in ("bottom7", "hard7"):
                negatives_from = "bottom" if recipe == "bottom7" else "hard"
                groups, relabels[recipe] = relabel(
                    recipe, train_path, labeler, negatives_from, work, args
                )
                checkpoint, trainings[recipe] = train(recipe, groups, work, args)
                reports[recipe] = evaluate_model(recipe, str(checkpoint), test_path, work, args)
            else:
                raise ValueError(f"unknown recipe {recipe!r}")
    finally:
        ray.shutdown()

    cost = None
    trained = [r for r in ("hard7", "bottom7") if r in trainings]
    if trained and args.cost_searches:
        cost = context_cost(trainings[trained[0]]["checkpoint"], test_path, args.cost_searches, 2)
    result = {
        "command": "RAY_USAGE_STATS_ENABLED=0 .venv/bin/python -m benchmarks.quality_traces "
        + " ".join(argv if argv is not None else sys.argv[1:]),
        "git_commit": commit,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "data": data,
        "labeler": labeler,
        "relabel": relabels,
        "training": trainings,
        "recipes": {name: _summary(report) for name, report in reports.items()},
        "sessions_depth5": {
            name: sessions_at_depth(report, test_path, 5, args.resamples)
            for name, report in reports.items()
        },
        "baselines": first_stage_baselines(test_path, args.resamples),
        "cost": cost,
        "seconds": time.perf_counter() - started,
    }
    out = Path(args.out)
    write_report(result, out, args.name, markdown(result))
    print(f"total {result['seconds']:.0f} s; wrote {out / args.name}.{{json,md}}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
