"""Scorer speed of two revisions of the code, in one run: did a change slow the scorer down?

Exports ``--base`` (a git revision) to a temporary folder and runs ``bench_scorer.py`` of the
base and of the working tree alternately (base, head, base, head, ...; ``--repeats`` pairs),
each in its own process with its own code on ``PYTHONPATH``, on the same machine and inputs.
Reports the scorer's pairs per CPU-second per mode, head / base, with the spread of the runs, so
a difference can be read against the noise. Writes ``<out>/<name>.json`` and ``.md``::

    python -m benchmarks.compare_revisions --base b22479e --repeats 2

Arguments after ``--`` go to both ``bench_scorer.py`` runs (defaults: a short CPU run).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.report import write_report

REPO = Path(__file__).resolve().parents[1]
BENCH_ARGS = ["--workload", "fixed", "--rounds", "2", "--official-pairs", "0"]


def export(revision: str, into: Path) -> Path:
    """The files of ``revision`` in ``into`` (``git archive``; no checkout is touched)."""
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", revision], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def bench(tree: Path, label: str, out: Path, args: list[str]) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree))
    if (tree / "benchmarks" / "__init__.py").exists():  # benchmarks/ as a package
        command = [sys.executable, "-m", "benchmarks.bench_scorer"]
    else:  # an older tree: its scripts import each other from their own folder
        command = [sys.executable, str(tree / "benchmarks" / "bench_scorer.py")]
    command += [*args, "--out", str(out), "--name", label]
    subprocess.run(command, check=True, env=env, cwd=tree, stdout=subprocess.DEVNULL)
    found = sorted(out.glob(f"{label}*.json"))
    if not found:
        raise FileNotFoundError(f"bench_scorer wrote no {label}*.json in {out}")
    return json.loads(found[-1].read_text())


def summary(runs: dict[str, list[dict]]) -> dict:
    modes = sorted(runs["head"][0]["modes"])
    out = {}
    for mode in modes:
        rates = {
            side: [r["modes"][mode]["ours"]["pairs_per_cpu_s"] for r in results]
            for side, results in runs.items()
        }
        base, head = statistics.mean(rates["base"]), statistics.mean(rates["head"])
        spread = max(
            (max(v) - min(v)) / statistics.mean(v) if len(v) > 1 else 0.0 for v in rates.values()
        )
        out[mode] = {
            "base_pairs_per_cpu_s": rates["base"],
            "head_pairs_per_cpu_s": rates["head"],
            "head_over_base": head / base,
            "run_spread": spread,
        }
    return out


def markdown(result: dict) -> str:
    lines = [
        f"# Scorer speed: working tree vs {result['base']}",
        "",
        f"`bench_scorer.py {' '.join(result['bench_args'])}`, base and head alternately "
        f"({result['repeats']} runs each), pairs per CPU-second of the scorer.",
        "",
        "| mode | base | head | head / base | spread of runs |",
        "| --- | --- | --- | --- | --- |",
    ]
    for mode, row in result["modes"].items():
        base = ", ".join(f"{v:.2f}" for v in row["base_pairs_per_cpu_s"])
        head = ", ".join(f"{v:.2f}" for v in row["head_pairs_per_cpu_s"])
        lines.append(
            f"| {mode} | {base} | {head} | {row['head_over_base']:.3f} | {row['run_spread']:.1%} |"
        )
    lines += ["", "Spread: the largest (max - min) / mean of one side's runs."]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base", required=True, help="the git revision to compare with")
    parser.add_argument("--repeats", type=int, default=2, help="runs of each side")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results"))
    parser.add_argument("--name", default="scorer-speed-vs-base")
    parser.add_argument("bench_args", nargs="*", help="after --: bench_scorer.py arguments")
    args = parser.parse_args()
    bench_args = args.bench_args or BENCH_ARGS
    runs: dict[str, list[dict]] = {"base": [], "head": []}
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "base").mkdir()
        base = export(args.base, Path(tmp) / "base")
        scratch = Path(tmp) / "results"
        scratch.mkdir()
        for i in range(args.repeats):
            runs["base"].append(bench(base, f"base-{i}", scratch, bench_args))
            runs["head"].append(bench(REPO, f"head-{i}", scratch, bench_args))
    result = {
        "base": args.base,
        "repeats": args.repeats,
        "bench_args": bench_args,
        "modes": summary(runs),
    }
    write_report(result, Path(args.out), args.name, markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
