"""Offline benchmark: the Ray Data rerank job against a plain single-process loop.

Both rerank the same synthetic searches (20 candidates each) with the same ``Scorer`` and the
same per-batch function (``acare_ray.offline.score.rerank_rows``); the loop streams the input
with pyarrow (``iter_batches``) and writes with a ``ParquetWriter``, so it is a fair, not a
naive, baseline. By default both get the same compute (the loop one torch thread, the job one
actor with one thread), so the ratio is the cost or gain of the Ray Data machinery itself;
``--actors 1,N`` shows scaling where there are cores to scale onto. Each measurement runs in
a fresh subprocess at 1x, 2x and 4x input:

- time: wall seconds from the start of the work (model load and, for Ray, actor start-up
  included; ``ray.init`` itself is reported separately); with ``--repeats N`` the fastest of
  N runs (the others are kept in ``seconds_all``), as load from other processes only adds;
- memory: peak PSS (proportional set size, so pages shared between processes count once)
  of the whole process tree (driver, Ray's GCS/raylet, workers and actors), sampled every
  0.2 s, and the peak of the driver process alone.

Writes ``<out>/<label>.json`` and ``<out>/<label>.md``. Defaults take a few minutes on 2 CPU
cores: ``python -m benchmarks.bench_offline`` (``--help`` for sizes, model, pool).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from acare_ray.scoring import DEFAULT_MODEL
from benchmarks.cluster_bench import start_ray
from benchmarks.report import REPO, machine, write_report

RESULTS = Path(__file__).resolve().parent / "results"


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        tree.setdefault(ppid, []).append(int(entry))
    return tree


def _pss(pid: int) -> tuple[float, float]:
    """(PSS, its shared-memory part) of ``pid`` in MB; Ray's object store is shared memory."""
    pss = shmem = 0.0
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    pss = int(line.split()[1]) / 1024
                elif line.startswith("Pss_Shmem:"):
                    shmem = int(line.split()[1]) / 1024
    except OSError:
        pass
    return pss, shmem


def _label(pid: int) -> str:
    """What a process is: Ray's process title (``ray::ScorerActor``, ``ray::IDLE``), else the
    executable's name (``raylet``, ``gcs_server``) or the Python script it runs."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return "?"
    if not argv:
        return "?"
    if argv[0].startswith("ray::"):
        return argv[0].split()[0].split(".")[0]
    name = os.path.basename(argv[0])
    if name.startswith("python"):
        scripts = [os.path.basename(a) for a in argv[1:] if a.endswith(".py")]
        return f"python {scripts[0]}" if scripts else name
    return name


class TreeMemory:
    """Peak PSS of this process and all its descendants, and of this process alone; at the
    tree's peak, the PSS per kind of process and the shared-memory part of the total."""

    def __init__(self, interval: float = 0.2) -> None:
        self.interval = interval
        self.peak_tree = self.peak_self = self.peak_shmem = 0.0
        self.at_peak: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> None:
        me = os.getpid()
        tree, todo, total, shared, mine = _children(), [me], 0.0, 0.0, 0.0
        kinds: dict[str, float] = {}
        while todo:
            pid = todo.pop()
            pss, shmem = _pss(pid)
            total += pss
            shared += shmem
            mine = pss if pid == me else mine
            kind = _label(pid)
            kinds[kind] = kinds.get(kind, 0.0) + pss
            todo.extend(tree.get(pid, []))
        if total > self.peak_tree:
            self.peak_tree, self.peak_shmem = total, shared
            ranked = sorted(kinds.items(), key=lambda kv: -kv[1])
            self.at_peak = {kind: round(mb, 1) for kind, mb in ranked}
        self.peak_self = max(self.peak_self, mine)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def __enter__(self) -> TreeMemory:
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()


def make_input(searches: int, path: Path) -> int:
    """``searches`` synthetic searches (20 candidates each) in one Parquet file; returns pairs."""
    from acare_ray.data.io import write_parquet
    from acare_ray.data.synthetic import synthetic_searches

    table = synthetic_searches(searches // 2 + 1, seed=0).slice(0, searches)
    write_parquet(table, path)
    return sum(len(c) for c in table.column("candidates").to_pylist())


def plain_loop(args: argparse.Namespace, input_path: Path, output: Path) -> int:
    import pyarrow as pa
    import pyarrow.parquet as pq
    import torch

    from acare_ray.data.schema import RERANK_OUTPUT
    from acare_ray.offline.score import rerank_rows
    from acare_ray.scoring import Scorer

    torch.set_num_threads(args.threads)
    scorer = Scorer.from_pretrained(args.model, device="cpu")
    rows = 0
    with pq.ParquetWriter(output, RERANK_OUTPUT) as writer:
        for batch in pq.ParquetFile(input_path).iter_batches(batch_size=args.batch_size):
            out = rerank_rows(scorer, batch.to_pylist(), [args.mode])
            writer.write_table(pa.Table.from_pylist(out, schema=RERANK_OUTPUT))
            rows += len(out)
    return rows


def ray_job(args: argparse.Namespace, input_path: Path, output: Path) -> int:
    from acare_ray.offline.job import ActorPool
    from acare_ray.offline.rerank import RerankConfig, run

    low, high = ActorPool.parse_sizes(args.actors)
    pool = ActorPool(low, high, batch_size=args.batch_size, rows_per_file=args.rows_per_file)
    config = RerankConfig(str(input_path), str(output), args.model, args.mode, pool=pool)
    return run(config).written


def measure_one(args: argparse.Namespace) -> dict:
    """One measurement in this process (``--one loop|ray``) over ``--input``."""
    import pyarrow.parquet as pq

    work = Path(tempfile.mkdtemp(prefix="bench-offline-"))
    input_path = Path(args.input)
    searches = pq.ParquetFile(input_path).metadata.num_rows
    init_s = 0.0
    if args.one == "ray":
        init_s = start_ray(args.ray_cpus)
    with TreeMemory() as memory:
        started = time.perf_counter()
        if args.one == "ray":
            rows = ray_job(args, input_path, work / "out")
        else:
            rows = plain_loop(args, input_path, work / "out.parquet")
        seconds = time.perf_counter() - started
    if rows != searches:
        raise RuntimeError(f"{args.one}: wrote {rows} rows for {searches} searches")
    return {
        "method": args.one,
        "searches": searches,
        "seconds": seconds,
        "searches_per_s": searches / seconds,
        "peak_tree_mb": memory.peak_tree,
        "peak_driver_mb": memory.peak_self,
        "ray_init_s": init_s,
    }


def run_subprocess(args: argparse.Namespace, method: str, input_path: Path) -> dict:
    argv = [sys.executable, "-m", "benchmarks.bench_offline", "--one", method]
    argv += ["--input", str(input_path)]
    for flag in ("model", "mode", "batch_size", "actors", "threads", "ray_cpus", "rows_per_file"):
        argv += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", TOKENIZERS_PARALLELISM="false")
    done = subprocess.run(argv, capture_output=True, text=True, env=env, check=False, cwd=REPO)
    if done.returncode != 0:
        raise RuntimeError(f"{method} on {input_path} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def summarise(results: list[dict]) -> dict:
    by = {(r["method"], r["searches"]): r for r in results}
    sizes = sorted({r["searches"] for r in results})
    base, top = sizes[0], sizes[-1]
    out = {"throughput_ratio_ray_over_loop": {}, "growth": {}}
    for n in sizes:
        out["throughput_ratio_ray_over_loop"][str(n)] = (
            by["ray", n]["searches_per_s"] / by["loop", n]["searches_per_s"]
        )
    for method in ("loop", "ray"):
        first, last = by[method, base], by[method, top]
        marginal = (last["seconds"] - first["seconds"]) / (top - base)
        out["growth"][method] = {
            "time_ratio": last["seconds"] / first["seconds"],
            "input_ratio": top / base,
            "peak_tree_mb_ratio": last["peak_tree_mb"] / first["peak_tree_mb"],
            "peak_driver_mb_ratio": last["peak_driver_mb"] / first["peak_driver_mb"],
            "marginal_searches_per_s": 1 / marginal if marginal > 0 else None,
        }
    return out


def markdown(report: dict) -> str:
    lines = [
        "# Offline benchmark: Ray Data rerank job vs a plain loop",
        "",
        f"- model `{report['args']['model']}`, mode {report['args']['mode']}, "
        f"{report['args']['batch_size']} searches per call, 20 candidates per search",
        f"- Ray: actors {report['args']['actors']} (1 CPU thread each), "
        f"`ray.init(num_cpus={report['args']['ray_cpus']})`; loop: "
        f"{report['args']['threads']} torch threads; fastest of {report['args']['repeats']} "
        "runs per cell, each in a fresh process",
        f"- machine: {report['environment']}",
        "",
        "| method | searches | pairs | seconds | searches/s | peak tree PSS MB | "
        "peak driver PSS MB |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in report["results"]:
        lines.append(
            f"| {r['method']} | {r['searches']} | {r['pairs']} | {r['seconds']:.1f} | "
            f"{r['searches_per_s']:.2f} | {r['peak_tree_mb']:.0f} | {r['peak_driver_mb']:.0f} |"
        )
    s = report["summary"]
    lines += ["", "Throughput ratio (Ray / loop, searches per second):"]
    lines += [f"- {n} searches: {v:.2f}" for n, v in s["throughput_ratio_ray_over_loop"].items()]
    lines += ["", "Growth from the smallest to the largest input:"]
    for method, g in s["growth"].items():
        marginal = g["marginal_searches_per_s"]
        lines.append(
            f"- {method}: input x{g['input_ratio']:.0f} -> time x{g['time_ratio']:.2f}, "
            f"peak tree memory x{g['peak_tree_mb_ratio']:.2f}, driver x"
            f"{g['peak_driver_mb_ratio']:.2f}; marginal rate "
            + (f"{marginal:.2f} searches/s" if marginal else "n/a")
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--mode", default="M0")
    parser.add_argument("--base-searches", type=int, default=24)
    parser.add_argument("--scales", default="1,2,4")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--actors", default="1")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the loop")
    parser.add_argument("--ray-cpus", type=int, default=2)
    parser.add_argument("--rows-per-file", type=int, default=10_000)
    parser.add_argument("--out", default=str(RESULTS))
    parser.add_argument("--label", default="offline-cpu-minilm")
    parser.add_argument("--one", choices=["loop", "ray"], help=argparse.SUPPRESS)
    parser.add_argument("--input", help=argparse.SUPPRESS)
    parser.add_argument("--repeats", type=int, default=2, help="keep the fastest of N runs")
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure_one(args)))
        return
    scales = [int(s) for s in args.scales.split(",")]
    work = Path(tempfile.mkdtemp(prefix="bench-offline-inputs-"))
    results = []
    for scale in scales:
        # Inputs are made here, so no measured process holds the generator's data.
        path = work / f"searches-x{scale}.parquet"
        pairs = make_input(args.base_searches * scale, path)
        for method in ("loop", "ray"):
            runs = []
            for _ in range(args.repeats):
                runs.append(run_subprocess(args, method, path) | {"pairs": pairs})
                print(json.dumps(runs[-1]), flush=True)
            best = min(runs, key=lambda r: r["seconds"])
            best["pairs_per_s"] = pairs / best["seconds"]
            best["seconds_all"] = [r["seconds"] for r in runs]
            results.append(best)
    report = {
        "args": {k: v for k, v in vars(args).items() if k not in ("one", "input")},
        "environment": machine(),
        "results": results,
        "summary": summarise(results),
    }
    write_report(report, Path(args.out), args.label, markdown(report))


if __name__ == "__main__":
    main()
