"""The agent-loop results run: BM25 alone vs a MuSiQue-trained MiniLM in M0, M2, M3, in-process
and through ``acare serve`` at 1, 4 and 16 agents, on the quality run's held-out questions.

The tasks are exactly the questions ``quality_musique.py`` held out (``split_questions`` with the
same ``--test-questions`` and ``--seed``), so no task was trained on; ``--checkpoint`` is the
checkpoint that run trained. Every stage is one ``acare agent-bench`` command, run as a user
runs it (the commands are recorded); the served stages start ``acare serve --model CHECKPOINT``
on a fresh local Ray cluster and stop it after.

    RAY_USAGE_STATS_ENABLED=0 .venv/bin/python -m benchmarks.agent_musique \\
        --checkpoint runs/transfer_musique/runs/<run>/checkpoint_0000149

Writes ``benchmarks/results/<name>.{json,md,png}`` (the in-process chart). A stage whose
``agent_bench.json`` already exists under ``--work-dir`` is not run again.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from acare_ray.testing import free_port, running, wait_for_health
from benchmarks.quality_musique import split_questions
from benchmarks.report import commands_block, git_commit, machine_line, write_report

ROOT = Path(__file__).resolve().parents[1]

SUMMARY_KEYS = (
    "tasks",
    "success_rate",
    "searches_per_task",
    "searches_per_task_common",
    "searches_per_solved_step",
    "session_recall",
    "rerank_s_per_task",
    "rerank_tokens_per_task",
    "latency_ms",
    "searches_per_s",
    "refused_retried",
)


def held_out_ids(n_test: int, seed: int) -> list[str]:
    from acare_ray.data.musique import musique_searches

    _, test = split_questions(musique_searches("distractor"), n_test, seed)
    return sorted(set(test.column("session_id").to_pylist()))


def relative(text: str) -> str:
    """``text`` with this checkout's absolute paths made relative to it (results are shared)."""
    return text.replace(sys.executable + " ", "python ").replace(str(ROOT) + "/", "")


def acare(*args: str) -> list[str]:
    return [sys.executable, "-m", "acare_ray.cli", *args]


def run_stage(name: str, command: list[str], work: Path, log) -> dict:
    """One agent-bench command (skipped when its report exists); its report."""
    out = work / name
    report = out / "agent_bench.json"
    if not report.exists():
        print(f"[{name}] {' '.join(command)}", file=log, flush=True)
        started = time.perf_counter()
        subprocess.run(command + ["--out", str(out)], check=True, stdout=log, stderr=log)
        print(f"[{name}] done in {time.perf_counter() - started:.0f} s", file=log, flush=True)
    return json.loads(report.read_text())


@contextlib.contextmanager
def serving(checkpoint: str, work: Path, log: TextIO) -> Iterator[str]:
    """``acare serve --model CHECKPOINT`` on a fresh local cluster (its own Ray temp dir), run
    and stopped by :func:`acare_ray.testing.running`; yields its base URL once healthy."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    temp = Path(tempfile.mkdtemp(prefix="acare-bench-ray-"))
    env = {"RAY_USAGE_STATS_ENABLED": "0", "ACARE_API_KEY": "", "RAY_TMPDIR": str(temp)}
    command = acare("serve", "--model", checkpoint, "--port", str(port), "--address", "local")
    try:
        with running(command, work / "serve.log", env) as process:
            wait_for_health(base, process, work / "serve.log", timeout_s=300)
            print(f"serving at {base}", file=log, flush=True)
            yield base
    finally:
        shutil.rmtree(temp, ignore_errors=True)


def summary_row(system: str, where: str, agents: int, summary: dict) -> dict:
    return {"system": system, "where": where, "agents": agents} | {
        k: summary.get(k) for k in SUMMARY_KEYS
    }


def markdown(result: dict) -> str:
    lines = [
        "# Agent loop on MuSiQue: BM25 alone vs the MuSiQue-trained MiniLM (M0, M2, M3)",
        "",
        f"{result['n_tasks']} held-out questions (the quality run's split, seed "
        f"{result['seed']}), corpus {result['corpus_size']} paragraphs (every MuSiQue "
        f"question's), BM25 top 100, {result['depth']} unseen documents per search, 3 searches "
        "per step. Machine: "
        f"{result['machine']}.",
        "",
        "| system | where | agents | tasks | success | searches/task | on common | searches/solved step "
        "| session recall | rerank s/task | tokens/task | latency p50/p95/p99 ms | searches/s "
        "| 503s retried |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|",
    ]
    for r in result["rows"]:
        lat = r["latency_ms"] or {}
        common = r["searches_per_task_common"]
        lines.append(
            f"| {r['system']} | {r['where']} | {r['agents']} | {r['tasks']} "
            f"| {r['success_rate']:.3f} "
            f"| {r['searches_per_task']:.2f} | {'-' if common is None else f'{common:.2f}'} "
            f"| {r['searches_per_solved_step']:.2f} | {r['session_recall']:.3f} "
            f"| {r['rerank_s_per_task']:.2f} | {r['rerank_tokens_per_task']:.0f} "
            f"| {lat.get('p50', 0):.0f} / {lat.get('p95', 0):.0f} / {lat.get('p99', 0):.0f} "
            f"| {r['searches_per_s']:.2f} | {r.get('refused_retried') or 0} |"
        )
    lines += [
        "",
        "Paired tests by task (in-process systems; randomization, Holm over the pairs of each "
        "measure):",
        "",
        "| measure | a | b | mean b - a | p | p (Holm) |",
        "|---|---|---|---:|---:|---:|",
    ]
    for t in result["tests"]:
        lines.append(
            f"| {t['measure']} | {t['a']} | {t['b']} | {t['mean_diff']:+.3f} | {t['p_value']:.4f} "
            f"| {t['p_holm']:.4f} |"
        )
    lines += [
        "",
        "'on common': searches per task over the tasks every system of that run solved (the "
        "served runs have no BM25 system, so their common set can be larger).",
        "",
        f"Served stages: the first {result['served_tasks']} held-out tasks, compared with the "
        "same model in-process on the same task list (the row above them). They agree on "
        + ", ".join(f"{k}: {v}" for k, v in result["served_agreement"].items())
        + " (tasks with identical outcomes / all).",
        *commands_block(result["commands"]),
    ]
    return "\n".join(lines) + "\n"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", required=True, help="quality_musique.py's checkpoint")
    parser.add_argument("--test-questions", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--modes", default="M0,M2,M3")
    parser.add_argument("--served-modes", default="M3")
    parser.add_argument(
        "--agents", default="1,4,16", help="served concurrency levels ('' for none)"
    )
    parser.add_argument("--depth", type=int, default=10, help="unseen documents per search")
    parser.add_argument(
        "--served-tasks",
        type=int,
        default=None,
        help="run the served stages on the first N held-out tasks only (the corpus is the same)",
    )
    parser.add_argument("--work-dir", default=str(ROOT / "runs" / "agent_musique"))
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    parser.add_argument("--name", default="agent-musique-cpu-minilm")
    return parser.parse_args()


@dataclass
class Stages:
    """What the stages of a run share: its folder and log, the agent-bench flags every stage
    passes, and the commands recorded so far (for the results file)."""

    work: Path
    log: TextIO
    common: list[str]
    commands: list[str] = field(default_factory=list)

    def run(self, name: str, *flags: str, url: str | None = None) -> dict:
        """Stage ``name``: ``acare agent-bench`` with the common and these ``flags``; its
        report. The command is recorded with ``url`` (a served stage's) written ``$URL``."""
        command = acare(*self.common, *flags)
        recorded = "acare " + " ".join(command[3:])
        self.commands.append(recorded.replace(url, "$URL") if url else recorded)
        return run_stage(name, command, self.work, self.log)


def _outcome(task: dict) -> dict:
    """A task's record without its timings."""
    return {k: v for k, v in task.items() if k not in ("rerank_s", "tokens")}


def served_stages(
    stages: Stages, args: argparse.Namespace, checkpoint: str, ids_path: Path, reference: dict
) -> tuple[list[dict], dict[str, str]]:
    """The served runs at each ``--agents`` level: their rows, and per system and level how
    many tasks had the same outcome as in ``reference`` (in-process, same task list)."""
    rows, agreement = [], {}
    levels = [int(a) for a in args.agents.split(",") if a]
    pending = [n for n in levels if not (stages.work / f"served-{n}" / "agent_bench.json").exists()]
    with contextlib.ExitStack() as stack:
        url = "http://127.0.0.1:8000"  # unused: every stage's result is on disk already
        if pending:
            url = stack.enter_context(serving(checkpoint, stages.work, stages.log))
        for n in levels:
            served = stages.run(
                f"served-{n}",
                "--task-ids",
                str(ids_path),
                "--endpoint",
                url,
                "--modes",
                args.served_modes,
                "--agents",
                str(n),
                "--no-baseline",
                url=url,
            )
            for name, s in served["systems"].items():
                rows.append(summary_row(name, "acare serve", n, s))
                local_tasks = {t["task_id"]: _outcome(t) for t in reference["tasks"][name]}
                same = sum(local_tasks[t["task_id"]] == _outcome(t) for t in served["tasks"][name])
                agreement[f"{name} at {n} agents"] = f"{same}/{len(served['tasks'][name])}"
    return rows, agreement


def main() -> None:
    args = parse_args()
    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    checkpoint = str(Path(args.checkpoint).resolve())
    ids = held_out_ids(args.test_questions, args.seed)
    ids_path = work / "heldout_ids.txt"
    ids_path.write_text("\n".join(ids) + "\n", encoding="utf-8")
    served_ids_path = ids_path
    if args.served_tasks is not None:
        served_ids_path = work / "served_ids.txt"
        served_ids_path.write_text("\n".join(ids[: args.served_tasks]) + "\n", encoding="utf-8")
    log = (work / "agent_musique.log").open("a")
    common = ["agent-bench", "--seed", str(args.seed), "--depth", str(args.depth)]
    stages = Stages(work, log, common)

    local = stages.run(
        "inprocess",
        "--task-ids",
        str(ids_path),
        "--model",
        checkpoint,
        "--modes",
        args.modes,
        "--device",
        "cpu",
    )
    stages.commands.append(
        f"acare serve --model {checkpoint} --port $PORT --address local  # then:"
    )
    rows = [summary_row(name, "in-process", 1, s) for name, s in local["systems"].items()]
    # The served stages are compared with the same model in-process on the same task list: the
    # pooled corpus lists the run's tasks first, and that order breaks BM25 ties, so a task's
    # searches can differ between task lists.
    reference = local
    if args.served_tasks is not None:
        reference = stages.run(
            "inprocess-served-tasks",
            "--task-ids",
            str(served_ids_path),
            "--model",
            checkpoint,
            "--modes",
            args.served_modes,
            "--device",
            "cpu",
            "--no-baseline",
        )
        rows += [summary_row(name, "in-process", 1, s) for name, s in reference["systems"].items()]
    served_rows, agreement = served_stages(stages, args, checkpoint, served_ids_path, reference)
    rows += served_rows
    log.close()

    result = {
        "benchmark": "agent_musique",
        "checkpoint": relative(checkpoint),
        "seed": args.seed,
        "depth": args.depth,
        "n_tasks": local["n_tasks"],
        "corpus_size": local["corpus_size"],
        "task_ids": ids,
        "served_tasks": args.served_tasks or len(ids),
        "machine": machine_line(),
        "git_commit": git_commit(),
        "rows": rows,
        "tests": local["tests"],
        "served_agreement": agreement,
        "commands": [relative(c) for c in stages.commands],
    }
    out = Path(args.out)
    write_report(result, out, args.name, markdown(result))
    shutil.copyfile(work / "inprocess" / "agent_bench.png", out / f"{args.name}.png")


if __name__ == "__main__":
    main()
