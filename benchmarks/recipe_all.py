"""The recipe trained on everything we have, and what it gives beside the first stage.

Stages (each writes under ``--work-dir`` and is skipped when its output exists, so a stopped run
resumes; ``--stages`` picks them):

- ``data``: LCE groups from three sources, each split by question into train and validation
  (10%): the R1-Searcher traces' training questions (the 50 test questions of
  ``quality_traces.py``, split seed 0, are held out, so the test is the same as before), MuSiQue
  (the 100 questions ``agent_musique.py`` runs as tasks are held out; BM25 scores over the pooled
  paragraphs added so negatives can be first-stage-hard) and HotpotQA (synthetic searches,
  :mod:`acare_ray.data.hotpotqa`). Negatives: ``--hard`` BM25-hard + the rest random. How many
  (prompt, document) pairs ``--max-length`` cuts is counted per source, in M3 (the longest).
- ``train``: one Ray Train run over the three group tables mixed by ``--weights``, validation
  nDCG@10 and LCE loss on the held-out questions of all three sources at every checkpoint.
- ``fit``: ``acare fit-fusion`` on the traces' validation questions (training-side questions the
  model never trained on, so the reranker's weight is not inflated by training fit; never the
  test), M3 (stored with the checkpoint: what rerank, eval and serve then use) and M0 (not
  stored, for fused M0).
- ``eval``: ``acare eval`` on the 50 test questions: first stage (BM25 order), the agents' own
  order, M0, M3 and each fused with the fitted RRF and linear settings; plus one focused family
  of session-paired randomization tests with Holm (the claims of issue 20).
- ``loop``: ``acare agent-bench`` on the 100 held-out MuSiQue tasks: BM25 vs fused M0 vs fused
  M3 (both with the checkpoint's stored fusion).

    RAY_USAGE_STATS_ENABLED=0 .venv/bin/python benchmarks/recipe_all.py --seed 0

writes ``benchmarks/results/recipe-all-seed<seed>.{json,md}``; ``make recipe`` runs the
``data,train,fit`` stages (the checkpoint and its fitted fusion) from a clean clone.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from quality_musique import split_questions as musique_split  # noqa: E402
from quality_traces import split_questions  # noqa: E402
from report import dump_json, git_commit  # noqa: E402

from acare_ray.data.io import data_dir, read_parquet, write_parquet  # noqa: E402
from acare_ray.scoring import DEFAULT_MODEL  # noqa: E402

BACKBONE = DEFAULT_MODEL
SOURCES = ("traces", "musique", "hotpotqa")
MEASURES = ("nDCG@10", "Recall@10", "RR@10")


def _by_questions(table: pa.Table, column: str, fraction: float, seed: int):
    """(rest, held): a seeded ``fraction`` of the values of ``column`` held out (the project's
    one split, :func:`acare_ray.splits.split_values`)."""
    from acare_ray.splits import split_values

    values = table.column(column).to_pylist()
    parts = split_values(values, validation=fraction, seed=seed)
    mask = pa.array([parts[v] == "validation" for v in values])
    return table.filter(pa.compute.invert(mask)), table.filter(mask)


def trace_splits(work: Path, args) -> dict[str, Path]:
    """The traces' searches: test (50 questions, as in quality_traces.py) and the training
    questions split into train / validation (the validation part also fits the fusion)."""
    from acare_ray.data.traces import import_traces

    searches = work / "traces_searches.parquet"
    if not searches.exists():
        traces = data_dir() / "agent_traces"
        result = import_traces(
            sorted((traces / "r1-searcher").glob("*.jsonl")),
            "r1-searcher",
            traces / "hotpotqa_gold.jsonl",
            k=20,
        )
        write_parquet(result.table, searches)
    table = read_parquet(searches)
    train, test = split_questions(table, args.test_questions, 0)
    train, val = _by_questions(train, "question_id", args.val_fraction, 0)
    return {
        "test": write_parquet(test, work / "traces_test.parquet"),
        "train": write_parquet(train, work / "traces_train.parquet"),
        "val": write_parquet(val, work / "traces_val.parquet"),
    }


def count_cuts(groups: pa.Table, max_length: int) -> dict:
    """Pairs (M3 prompt, document) longer than ``max_length`` tokens, i.e. cut by the scorer."""
    from acare_ray.scoring import AgentContext, Mode, Scorer
    from acare_ray.scoring.untrusted import encode_capped

    backend = Scorer.from_pretrained(BACKBONE, max_length=max_length).backend
    pairs = cut = 0
    for row in groups.to_pylist():
        context = AgentContext(row["sub_query"], row["question"], row["reasoning"])
        mode = context.resolve_mode("auto")
        room = backend.document_room(backend.context_tokens(context.for_mode(mode), mode))
        docs = [row["positive"]["text"], *(d["text"] for d in row["negatives"])]
        lengths = [len(ids) for ids in encode_capped(backend.inert, docs, [room + 1] * len(docs))]
        pairs += len(docs)
        cut += sum(n > room for n in lengths)
    return {"pairs": pairs, "cut": cut, "share": cut / max(pairs, 1), "mode": str(Mode.M3.value)}


def _keep_failed(table: pa.Table) -> pa.Table:
    index = table.schema.get_field_index("judge_ok")
    return table.set_column(index, "judge_ok", pa.nulls(table.num_rows, pa.bool_()))


def build_data(work: Path, args) -> dict:
    from acare_ray.data.groups import group_stats, searches_to_groups, with_bm25_scores
    from acare_ray.data.hotpotqa import hotpotqa_searches
    from acare_ray.data.musique import musique_searches

    out = work / "groups"
    summary_file = out / "data.json"
    if summary_file.exists():
        return json.loads(summary_file.read_text())
    splits = trace_splits(work, args)
    musique_train, _ = musique_split(musique_searches("distractor"), 100, 0)
    musique_train, musique_val = _by_questions(
        with_bm25_scores(musique_train), "session_id", args.val_fraction, 0
    )
    hotpot_train, hotpot_val = _by_questions(
        hotpotqa_searches(), "session_id", args.val_fraction, 0
    )
    parts = {
        # Labels are the question's gold pages, not the agent's judgement: a failed
        # trajectory's searches are as well labelled as a successful one's (--keep-failed).
        "traces": tuple(_keep_failed(read_parquet(splits[k])) for k in ("train", "val")),
        "musique": (musique_train, musique_val),
        "hotpotqa": (hotpot_train, hotpot_val),
    }
    summary: dict = {"sources": {}, "max_length": args.max_length, "hard": args.hard}
    vals = []
    for name, (train, val) in parts.items():
        groups = searches_to_groups(train, 7, args.seed, hard=args.hard)
        val_groups = searches_to_groups(val, 7, args.seed, hard=args.hard)
        write_parquet(groups, out / f"{name}.parquet")
        vals.append(val_groups)
        summary["sources"][name] = {
            "searches": train.num_rows,
            "groups": groups.num_rows,
            "skipped": vars(group_stats(groups)),
            "val_searches": val.num_rows,
            "val_groups": val_groups.num_rows,
            "cuts": count_cuts(groups, args.max_length),
        }
        print(f"[data] {name}: {summary['sources'][name]}", flush=True)
    val_all = pa.concat_tables([v.replace_schema_metadata(None) for v in vals])
    write_parquet(val_all, out / "val.parquet")
    summary["val_groups"] = val_all.num_rows
    summary["traces_test_searches"] = read_parquet(splits["test"]).num_rows
    summary_file.write_text(json.dumps(summary, indent=2))
    return summary


def train(work: Path, args) -> dict:
    from acare_ray.training import TrainConfig, run

    marker = work / f"train-seed{args.seed}.json"
    if marker.exists():
        return json.loads(marker.read_text())
    groups = work / "groups"
    config = TrainConfig(
        data=tuple(str(groups / f"{name}.parquet") for name in SOURCES),
        data_weights=tuple(args.weights),
        val_data=str(groups / "val.parquet"),
        val_max_groups=args.val_groups,
        eval_modes=("M0", "M3"),
        model=BACKBONE,
        output=str(work / "runs"),
        name=f"recipe-all-seed{args.seed}",
        workers=2,
        cpus_per_worker=1,
        batch_groups=2,
        grad_accum=2,
        max_steps=args.steps,
        lr=args.lr,
        temperature=0.5,
        seed=args.seed,
        checkpoint_every=max(1, args.steps // 4),
        keep_checkpoints=1,
        max_failures=3,
        log_every=10,
        max_length=args.max_length,
        cpu_bf16=args.cpu_bf16,
    )
    started = time.perf_counter()
    checkpoint = run(config)
    info_file = checkpoint / "training.json"
    history = json.loads(info_file.read_text())["history"] if info_file.exists() else None
    info = {
        "checkpoint": str(checkpoint),
        "seconds": time.perf_counter() - started,
        "config": config.to_dict(),
        "history": history,
    }
    marker.write_text(json.dumps(info, indent=2))
    return info


def fit(work: Path, checkpoint: str, args) -> dict:
    from acare_ray.offline.fit_fusion import FitFusionConfig, run
    from acare_ray.offline.job import ActorPool

    out = {}
    for mode in ("M3", "M0"):
        folder = work / f"fit-seed{args.seed}-{mode}"
        if (folder / "fit.json").exists():
            out[mode] = json.loads((folder / "fit.json").read_text())
            continue
        started = time.perf_counter()
        out[mode] = run(
            FitFusionConfig(
                input=str(work / "traces_val.parquet"),
                model=checkpoint,
                work_dir=str(folder),
                mode=mode,
                write=mode == "M3",
                pool=ActorPool(min_size=2, max_size=2, batch_size=8),
            )
        )
        out[mode]["seconds"] = time.perf_counter() - started
        (folder / "fit.json").write_text(json.dumps(out[mode], indent=2))
    return out


def best_of(fit_result: dict, method: str) -> str:
    """The best grid point of one method (the stored setting is the best of all methods)."""
    rows = [r for r in fit_result["grid"] if r["fusion"].startswith(method)]
    objective = fit_result["fitted"]["objective"]
    return max(rows, key=lambda r: r[objective])["fusion"]


def evaluate(work: Path, checkpoint: str, fusions: list[str], args) -> dict:
    from acare_ray.offline.evaluate import EvalConfig, run
    from acare_ray.offline.job import ActorPool

    report_file = work / f"eval-seed{args.seed}" / "report.json"
    if report_file.exists():
        return json.loads(report_file.read_text())
    return run(
        EvalConfig(
            input=str(work / "traces_test.parquet"),
            model=checkpoint,
            report_dir=str(report_file.parent),
            modes=("M0", "M3"),
            measures=MEASURES,
            n_resamples=args.resamples,
            pool=ActorPool(min_size=2, max_size=2, batch_size=8),
            sessions=True,
            group_by="agent",
            fusion=tuple(fusions),
        )
    )


def read_trec(path: str) -> dict[str, dict[str, float]]:
    run: dict[str, dict[str, float]] = {}
    for line in Path(path).read_text().splitlines():
        qid, _, doc, _, score, _ = line.split()
        run.setdefault(qid, {})[doc] = float(score)
    return run


def focused_tests(report: dict, pairs: list[tuple[str, str]], args) -> list[dict]:
    """Session-paired randomization tests of nDCG@10 (each session's mean over its searches)
    for the claims in ``pairs`` (a, b): one family, Holm-corrected."""
    from acare_ray.metrics import evaluate as measure
    from acare_ray.metrics import holm_bonferroni, paired_bootstrap_test, paired_randomization_test

    qrels: dict[str, dict[str, int]] = {}
    for line in Path(report["files"]["qrels"]).read_text().splitlines():
        qid, _, doc, rel = line.split()
        qrels.setdefault(qid, {})[doc] = int(rel)
    session_of = dict(
        zip(
            read_parquet(report["input"]).column("search_id").to_pylist(),
            read_parquet(report["input"]).column("session_id").to_pylist(),
        )
    )
    per_session = {}
    for system in {s for pair in pairs for s in pair}:
        values = measure(qrels, read_trec(report["files"]["runs"][system]), ["nDCG@10"])
        by_session: dict[str, list[float]] = {}
        for qid, value in values.per_query["nDCG@10"].items():
            by_session.setdefault(session_of[qid], []).append(value)
        per_session[system] = {s: float(np.mean(v)) for s, v in by_session.items()}
    rows = []
    for a, b in pairs:
        sessions = sorted(set(per_session[a]) & set(per_session[b]))
        va = {s: per_session[a][s] for s in sessions}
        vb = {s: per_session[b][s] for s in sessions}
        test = paired_randomization_test(va, vb, args.resamples, 0)
        boot = paired_bootstrap_test(va, vb, args.resamples, 0, 0.95)
        rows.append(
            {
                "a": a,
                "b": b,
                "sessions": len(sessions),
                "mean_a": test.mean_a,
                "mean_b": test.mean_b,
                "diff": test.mean_b - test.mean_a,
                "ci95": list(boot.ci) if boot.ci else None,
                "p": test.p_value,
            }
        )
    for row, adjusted in zip(rows, holm_bonferroni([r["p"] for r in rows]), strict=True):
        row["p_holm"] = adjusted
    return rows


def _rel(path: str | Path) -> str:
    """``path`` relative to the repository when it is inside it (commands are recorded)."""
    resolved = Path(path).resolve()
    return str(resolved.relative_to(ROOT)) if resolved.is_relative_to(ROOT) else str(path)


def loop(work: Path, checkpoint: str, args) -> dict:
    """``acare agent-bench`` on the 100 held-out MuSiQue tasks (the command is recorded)."""
    from agent_musique import held_out_ids

    out = work / f"loop-seed{args.seed}"
    report = out / "agent_bench.json"
    ids = work / "heldout_ids.txt"
    ids.write_text("\n".join(held_out_ids(100, 0)) + "\n")
    command = [
        "agent-bench", "--task-ids", _rel(ids), "--model", _rel(checkpoint), "--modes", "M0,M3",
        "--fusion", "auto", "--fused-only", "--first-stage-k", str(args.loop_k),
        "--device", "cpu", "--out", _rel(out),
    ]  # fmt: skip
    if not report.exists():
        started = time.perf_counter()
        subprocess.run([sys.executable, "-m", "acare_ray.cli", *command], check=True, cwd=ROOT)
        (out / "seconds.txt").write_text(f"{time.perf_counter() - started:.0f}\n")
    return {"command": "acare " + " ".join(command), "report": json.loads(report.read_text())}


def _cell(metric: dict | None, ci: bool = False) -> str:
    if not metric:
        return "-"
    if ci:
        return f"{metric['mean']:.3f} [{metric['ci_low']:.3f}, {metric['ci_high']:.3f}]"
    return f"{metric['mean']:.3f}"


def _system_rows(evaluation: dict, metrics: dict, sessions: dict | None) -> list[str]:
    fitted = evaluation["fitted"]
    named = [("BM25 order (first stage)", "first_stage"), ("agents' own order", "agent_order"),
             ("M0", "M0"), ("M3", "M3")]  # fmt: skip
    for mode in ("M0", "M3"):
        for label, setting in zip(("RRF", "linear"), fitted[mode], strict=True):
            named.append(
                (f"{mode} fused, {label} fitted on {mode} ({setting})", f"{mode}+{setting}")
            )
    rows = []
    for label, system in named:
        if system not in metrics:
            continue
        m = metrics[system]
        session = (sessions or {}).get(system, {})
        rows.append(
            f"| {label} | {_cell(m.get('nDCG@10'), ci=True)} | {_cell(m.get('Recall@10'))} "
            f"| {_cell(session.get('session_recall'))} |"
        )
    return rows


def markdown(result: dict) -> str:
    """The tables docs/RESULTS.md quotes."""
    data, training = result["data"], result.get("training", {})
    lines = [
        f"# Recipe trained on all the data, seed {result['settings']['seed']}",
        "",
        f"Command: `{result['command']}` (commit {result['git_commit'][:10]}); "
        f"{result['machine']['cpus']} CPUs. Stage times: training "
        f"{training.get('seconds', 0) / 60:.0f} min, fusion fits "
        + ", ".join(
            f"{m} {f.get('seconds', 0) / 60:.1f} min" for m, f in result.get("fit", {}).items()
        )
        + (f", this invocation {result['seconds'] / 60:.0f} min" if result.get("seconds") else "")
        + ".",
        "",
        "## Data (LCE groups: 1 positive + 7 negatives, "
        f"{data['hard']} BM25-hard + {7 - data['hard']} random)",
        "",
        f"| source | searches | groups | validation groups | pairs cut at max_length "
        f"{data['max_length']} (M3) |",
        "|---|---|---|---|---|",
    ]
    for name, src in data["sources"].items():
        cuts = src["cuts"]
        lines.append(
            f"| {name} | {src['searches']} | {src['groups']} | {src['val_groups']} "
            f"| {cuts['cut']} of {cuts['pairs']} ({cuts['share']:.1%}) |"
        )
    if training:
        config = training["config"]
        lines += [
            "",
            f"## Training: {config['max_steps']} steps of {config['batch_groups'] * config['grad_accum'] * config['workers']} "
            f"groups, weights {config['data_weights']}, lr {config['lr']}, "
            f"bf16 autocast {config['cpu_bf16']}, {training['seconds'] / 60:.0f} min",
            "",
            "| step | train loss | val loss M0 | val loss M3 | val nDCG@10 M0 | val nDCG@10 M3 |",
            "|---|---|---|---|---|---|",
        ]
        for h in training.get("history") or []:
            lines.append(
                f"| {h['step']} | {h.get('loss', float('nan')):.4f} "
                f"| {h.get('val/loss/M0', float('nan')):.4f} | {h.get('val/loss/M3', float('nan')):.4f} "
                f"| {h.get('val/nDCG@10/M0', float('nan')):.3f} "
                f"| {h.get('val/nDCG@10/M3', float('nan')):.3f} |"
            )
    for mode, fit_result in result.get("fit", {}).items():
        lines += [
            "",
            f"Fusion fitted in {mode} on the {fit_result['fitted']['searches']} searches of the "
            "traces' validation questions: "
            f"best {fit_result['label']} (nDCG@10 {fit_result['fitted']['value']:.3f}; the "
            "reranker alone and the first stage alone are the grid's ends: "
            + ", ".join(
                f"{r['fusion']} {r[fit_result['fitted']['objective']]:.3f}"
                for r in fit_result["grid"]
                if r["fusion"] in ("linear:alpha=1", "linear:alpha=0")
            )
            + ")",
        ]
    evaluation = result.get("eval")
    if evaluation:
        head = [
            "| system | nDCG@10 [95% CI] | Recall@10 | session recall (10 a search) |",
            "|---|---|---|---|",
        ]
        lines += ["", "## Trace test split (50 questions, both agents)", "", *head]
        lines += _system_rows(evaluation, evaluation["metrics"], evaluation["sessions"])
        for agent, metrics in (evaluation.get("groups") or {}).items():
            lines += ["", f"Agent {agent}:", "", *head]
            lines += _system_rows(evaluation, metrics, None)
        lines += [
            "",
            "Session-paired randomization tests of nDCG@10 (session means), one family, Holm:",
            "",
            "| a | b | sessions | mean a | mean b | b - a [95% CI] | p | p (Holm) |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for t in evaluation["tests"]:
            ci = t["ci95"] or [float("nan")] * 2
            lines.append(
                f"| {t['a']} | {t['b']} | {t['sessions']} | {t['mean_a']:.3f} | {t['mean_b']:.3f} "
                f"| {t['diff']:+.3f} [{ci[0]:+.3f}, {ci[1]:+.3f}] | {t['p']:.4f} "
                f"| {t['p_holm']:.4f} |"
            )
    if "loop" in result:
        from acare_ray.agent.bench import format_table

        report = result["loop"]["report"]
        lines += ["", "## Agent loop: 100 held-out MuSiQue tasks", "",
                  f"`{result['loop']['command']}`", "", format_table(report)]  # fmt: skip
        if report.get("tests"):
            lines += ["", "| measure | a | b | b - a | p | p (Holm) |", "|---|---|---|---|---|---|"]
            lines += [
                f"| {t['measure']} | {t['a']} | {t['b']} | {t['mean_diff']:+.3f} "
                f"| {t['p_value']:.4f} | {t['p_holm']:.4f} |"
                for t in report["tests"]
            ]
    return "\n".join(lines) + "\n"


STAGES = ("data", "train", "fit", "eval", "loop")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stages", default="data,train,fit,eval,loop")
    parser.add_argument("--seed", type=int, default=0, help="training seed (splits are fixed)")
    parser.add_argument("--test-questions", type=int, default=50)
    parser.add_argument("--val-fraction", type=float, default=0.1)
    parser.add_argument("--hard", type=int, default=3, help="BM25-hard negatives of the 7")
    parser.add_argument("--weights", type=float, nargs=3, default=(0.5, 0.2, 0.3),
                        help="traces, musique, hotpotqa")  # fmt: skip
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--max-length", type=int, default=320)
    parser.add_argument("--val-groups", type=int, default=240)
    parser.add_argument("--cpu-bf16", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--loop-k", type=int, default=30, help="BM25 candidates in the loop")
    parser.add_argument("--resamples", type=int, default=10_000)
    parser.add_argument("--work-dir", default=str(ROOT / "runs" / "recipe_all"))
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    stages = set(args.stages.split(","))
    unknown = stages - set(STAGES)
    if unknown:
        raise SystemExit(f"--stages: unknown {sorted(unknown)}; known: {', '.join(STAGES)}")
    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    commit = git_commit()
    started = time.perf_counter()
    result: dict = {
        "command": "RAY_USAGE_STATS_ENABLED=0 .venv/bin/python benchmarks/recipe_all.py "
        + " ".join(argv if argv is not None else sys.argv[1:]),
        "git_commit": commit,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "settings": vars(args),
    }
    result["data"] = build_data(work, args)
    if stages & {"train", "fit", "eval", "loop"}:
        result["training"] = train(work, args)
        checkpoint = result["training"]["checkpoint"]
    if stages & {"fit", "eval"} and not (
        (work / f"fit-seed{args.seed}-M0" / "fit.json").exists()
        and (work / f"eval-seed{args.seed}" / "report.json").exists()
    ):
        import ray

        from acare_ray.training.trainer import start_local_ray

        # The training stage's Ray instance has 2 CPUs; the jobs need one more than their 2
        # scoring actors, for the read and write tasks.
        if ray.is_initialized():
            ray.shutdown()
        start_local_ray(num_cpus=3)
    if stages & {"fit", "eval", "loop"}:
        result["fit"] = fit(work, checkpoint, args)
    if "eval" in stages:
        fitted = {m: (best_of(result["fit"][m], "rrf"), best_of(result["fit"][m], "linear"))
                  for m in ("M0", "M3")}  # fmt: skip
        fusions = list(dict.fromkeys(s for pair in fitted.values() for s in pair))
        report = evaluate(work, checkpoint, fusions, args)
        m0_rrf, m0_lin = (f"M0+{s}" for s in fitted["M0"])
        m3_rrf, m3_lin = (f"M3+{s}" for s in fitted["M3"])
        claims = [
            ("first_stage", m3_lin),
            ("first_stage", m3_rrf),
            (m0_lin, m3_lin),
            ("M0", "M3"),
            ("first_stage", m0_lin),
        ]
        result["eval"] = {
            "systems": report["systems"],
            "fitted": fitted,
            "metrics": report["metrics"],
            "sessions": report.get("sessions", {}).get("metrics"),
            "groups": {
                agent: group.get("metrics") for agent, group in report.get("groups", {}).items()
            },
            "queries": report["queries"],
            "tests": focused_tests(report, claims, args),
        }
    import ray

    ray.shutdown()
    if "loop" in stages:
        result["loop"] = loop(work, checkpoint, args)
    result["seconds"] = time.perf_counter() - started
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = f"recipe-all-seed{args.seed}"
    dump_json(result, out / f"{name}.json")
    (out / f"{name}.md").write_text(markdown(result))
    print(
        json.dumps({k: v for k, v in result.items() if k not in ("eval", "loop")}, indent=1)[:4000]
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
