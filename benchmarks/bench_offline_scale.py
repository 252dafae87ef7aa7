"""Offline scale benchmark: the rerank job (Ray Data) against a plain loop at 10^3..10^5 searches.

The scorer is the tiny random Qwen3 of ``acare_ray.testing`` (real Qwen3 tokenizer, hidden
size 64, 2 layers, 4 heads: ~9.8 M parameters, nearly all in the embedding table), cheap enough
that what is measured is the pipeline around it: reading, skipping written rows, batching,
actor calls, Arrow <-> Python conversion, writing. Inputs (synthetic searches, 20 candidates
each, ``acare_ray.data.synthetic``) are made in this process before any measurement; each
measurement runs in a fresh subprocess:

- ``loop``: ``pyarrow`` ``iter_batches`` -> ``rerank_rows`` (``Scorer.score_many``) ->
  ``ParquetWriter``, one torch thread;
- ``ray``: the ``acare rerank`` job (``acare_ray.offline.rerank.run``) on a new local cluster
  with ``--ray-cpus`` CPUs and ``--actors`` actors of one torch thread each; ``ray.init`` is
  timed apart.

Per run: wall seconds, searches/s, peak PSS of the driver and of the whole process tree (Ray's
GCS, raylet, workers and actors included; sampled every 0.2 s), object-store bytes used (peak)
and spilled (sampled every 2 s from the raylet), output part files (count, sizes). Summary: the
Ray/loop throughput ratio per size, the marginal rate between consecutive sizes (the fixed
start-up cancels), memory growth from the smallest to the largest input.

``--kill-resume N`` adds, at N searches: (a) the driver SIGKILLed once half the rows are
committed, then the same job run again over the same output; (b) one actor SIGKILLed mid-run.
Each checks that every search is in the output exactly once and reports the rows the re-run
scored. Writes ``<out>/<label>.{json,md,png}``.

    RAY_USAGE_STATS_ENABLED=0 .venv/bin/python -m benchmarks.bench_offline_scale \\
        --sizes 1000,10000,100000 --kill-resume 100000 --kill-actor-in-rerun
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from benchmarks.bench_offline import TreeMemory, _children, make_input, plain_loop
from benchmarks.cluster_bench import start_ray
from benchmarks.report import REPO, machine, write_report

RESULTS = Path(__file__).resolve().parent / "results"
ENV = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", TOKENIZERS_PARALLELISM="false")


class StoreSampler:
    """Peak object-store bytes used and the spilled totals, from the raylet every ``interval``.

    Uses Ray's internal memory-info call (what ``ray memory --stats-only`` prints)."""

    def __init__(self, interval: float = 2.0) -> None:
        self.interval = interval
        self.peak_used = 0
        self.spilled_bytes = self.spilled_objects = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> None:
        import ray
        from ray._private.internal_api import get_memory_info_reply, get_state_from_address

        try:
            reply = get_memory_info_reply(
                get_state_from_address(ray.get_runtime_context().gcs_address), timeout_seconds=10
            )
        except Exception:  # noqa: BLE001 - a missed sample is not a failed benchmark
            return
        stats = reply.store_stats
        self.peak_used = max(self.peak_used, int(stats.object_store_bytes_used))
        self.spilled_bytes = max(self.spilled_bytes, int(stats.spilled_bytes_total))
        self.spilled_objects = max(self.spilled_objects, int(stats.spilled_objects_total))

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def __enter__(self) -> StoreSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()


def output_files(path: Path) -> dict:
    files = [path] if path.is_file() else sorted(path.rglob("*.parquet"))
    sizes = [f.stat().st_size for f in files]
    return {
        "files": len(files),
        "bytes": sum(sizes),
        "min_file_bytes": min(sizes) if sizes else 0,
        "max_file_bytes": max(sizes) if sizes else 0,
    }


def rerank_config(args: argparse.Namespace, input_path: Path, output: Path):
    from acare_ray.offline.job import ActorPool
    from acare_ray.offline.rerank import RerankConfig

    low, high = ActorPool.parse_sizes(args.actors)
    pool = ActorPool(
        low,
        high,
        batch_size=args.batch_size,
        rows_per_file=args.rows_per_file,
        object_store_mb=args.object_store_mb,
    )
    return RerankConfig(str(input_path), str(output), args.model, args.mode, pool=pool)


def measure_one(args: argparse.Namespace) -> dict:
    """One measurement in this process (``--one loop|ray``) of ``--input`` into ``--output``."""
    import pyarrow.parquet as pq

    input_path, output = Path(args.input), Path(args.output)
    searches = pq.ParquetFile(input_path).metadata.num_rows
    result: dict = {"method": args.one, "searches": searches}
    if args.one == "loop":
        with TreeMemory() as memory:
            started = time.perf_counter()
            rows = plain_loop(args, input_path, output)  # args.threads: 1
            seconds = time.perf_counter() - started
    else:
        import ray

        from acare_ray.offline.rerank import run

        result["ray_init_s"] = start_ray(args.ray_cpus)
        with TreeMemory() as memory, StoreSampler() as store:
            started = time.perf_counter()
            config = rerank_config(args, input_path, output)
            counts = run(config)
            seconds = time.perf_counter() - started
        rows = counts.written
        result |= {
            "already_written": counts.already_written,
            "object_store_peak_mb": store.peak_used / 2**20,
            "object_store_budget_mb": config.pool.object_store_mb,  # None: Ray Data's limit
            "spilled_mb": store.spilled_bytes / 2**20,
            "spilled_objects": store.spilled_objects,
        }
        ray.shutdown()
    if rows + result.get("already_written", 0) != searches:
        raise RuntimeError(f"{args.one}: wrote {rows} rows for {searches} searches")
    return result | {
        "rows_written": rows,
        "seconds": seconds,
        "searches_per_s": searches / seconds,
        "peak_tree_mb": memory.peak_tree,
        "peak_driver_mb": memory.peak_self,
        "peak_tree_shmem_mb": memory.peak_shmem,
        "tree_at_peak_mb": memory.at_peak,
        "output": output_files(output),
    }


def argv_for(args: argparse.Namespace, method: str, input_path: Path, output: Path) -> list[str]:
    argv = [sys.executable, "-m", "benchmarks.bench_offline_scale", "--one", method]
    argv += ["--input", str(input_path)]
    argv += ["--output", str(output)]
    for flag in ("model", "mode", "batch_size", "actors", "ray_cpus", "rows_per_file"):
        argv += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
    if args.object_store_mb is not None:
        argv += ["--object-store-mb", str(args.object_store_mb)]
    return argv


def run_subprocess(args: argparse.Namespace, method: str, input_path: Path, output: Path) -> dict:
    done = subprocess.run(
        argv_for(args, method, input_path, output),
        capture_output=True,
        text=True,
        env=ENV,
        cwd=REPO,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{method} on {input_path} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def committed_rows(output: Path) -> int:
    """Rows in the output's complete part files (a file whose footer reads)."""
    import pyarrow.parquet as pq

    total = 0
    for path in output.rglob("*.parquet"):
        # A file still being written has no footer yet: it holds nothing committed.
        with contextlib.suppress(Exception):
            total += pq.ParquetFile(path).metadata.num_rows
    return total


def output_ids(output: Path) -> list[str]:
    import pyarrow.dataset as pads

    return (
        pads.dataset(output, format="parquet")
        .to_table(columns=["search_id"])["search_id"]
        .to_pylist()
    )


def check_exactly_once(output: Path, input_path: Path) -> dict:
    import pyarrow.parquet as pq

    expected = pq.read_table(input_path, columns=["search_id"])["search_id"].to_pylist()
    ids = output_ids(output)
    return {
        "rows": len(ids),
        "duplicates": len(ids) - len(set(ids)),
        "missing": len(set(expected) - set(ids)),
        "exactly_once": sorted(ids) == sorted(expected),
    }


def descendants(pid: int) -> list[int]:
    tree, todo, out = _children(), [pid], []
    while todo:
        for child in tree.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def process_title(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def run_killing_actor(
    args: argparse.Namespace, input_path: Path, output: Path, at_rows: int
) -> tuple[dict, int]:
    """Run the job, SIGKILL one of its actors once ``at_rows`` rows are committed, let it end.

    Returns the job's measurement and the rows committed when the actor was killed."""
    driver = subprocess.Popen(
        argv_for(args, "ray", input_path, output),
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=ENV,
        text=True,
    )
    # Drain stderr while waiting: a full pipe would block the job.
    errors: list[str] = []
    drain = threading.Thread(target=lambda: errors.extend(driver.stderr), daemon=True)
    drain.start()
    victim = None
    while victim is None:
        if driver.poll() is not None:
            raise RuntimeError("the job finished before an actor could be killed")
        if committed_rows(output) >= at_rows:
            actors = [p for p in descendants(driver.pid) if "MapWorker" in process_title(p)]
            victim = actors[0] if actors else None
        time.sleep(0.5)
    committed = committed_rows(output)
    os.kill(victim, signal.SIGKILL)
    stdout = driver.stdout.read()
    driver.wait()
    drain.join()
    if driver.returncode != 0:
        raise RuntimeError(f"the job with a killed actor failed:\n{''.join(errors)[-3000:]}")
    return json.loads(stdout.strip().splitlines()[-1]), committed


def kill_resume(args: argparse.Namespace, input_path: Path, work: Path) -> dict:
    """(a) SIGKILL the driver at half the rows, run again; (b) SIGKILL one actor mid-run.

    With ``--kill-actor-in-rerun``, (b) happens inside (a)'s re-run (at three quarters of the
    rows) instead of in a run of its own: one job's worth of time less at 10^5 searches."""
    import pyarrow.parquet as pq

    searches = pq.ParquetFile(input_path).metadata.num_rows
    out: dict = {"searches": searches, "actor_killed_in_rerun": args.kill_actor_in_rerun}
    for stale in ("kill-driver", "kill-actor"):  # from an earlier benchmark in this work dir
        shutil.rmtree(work / stale, ignore_errors=True)

    output = work / "kill-driver"
    driver = subprocess.Popen(
        argv_for(args, "ray", input_path, output),
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=ENV,
    )
    started = time.perf_counter()
    while committed_rows(output) < searches // 2:
        if driver.poll() is not None:
            raise RuntimeError("the driver finished before half its rows were committed")
        time.sleep(0.5)
    committed = committed_rows(output)
    os.kill(driver.pid, signal.SIGKILL)
    driver.wait()
    killed_after = time.perf_counter() - started
    time.sleep(5)  # let the killed driver's local cluster (fate-shared) go down
    if args.kill_actor_in_rerun:
        rerun, actor_at = run_killing_actor(args, input_path, output, searches * 3 // 4)
    else:
        rerun = run_subprocess(args, "ray", input_path, output)
    out["driver_killed"] = {
        "killed_after_s": killed_after,
        "rows_committed_at_kill": committed,
        "rerun_already_written": rerun["already_written"],
        "rerun_rows_scored": rerun["rows_written"],
        # Rows the re-run scored that were already committed: input - committed - scored.
        "rows_rescored": rerun["rows_written"] - (searches - rerun["already_written"]),
        "rerun_seconds": rerun["seconds"],
    } | check_exactly_once(output, input_path)

    if args.kill_actor_in_rerun:
        result = rerun
    else:
        output = work / "kill-actor"
        result, actor_at = run_killing_actor(args, input_path, output, searches // 3)
    out["actor_killed"] = {
        "rows_committed_at_kill": actor_at,
        # A kill after the last part file was committed would test nothing.
        "killed_before_done": actor_at < searches,
        "rows_scored": result["rows_written"],
        "seconds": result["seconds"],
    } | check_exactly_once(output, input_path)
    return out


def public_argv(argv: list[str], private: tuple[str, ...] = ("--work-dir", "--out")) -> list[str]:
    """The command line without the flags whose values are paths on the machine that ran it;
    a ``--model`` that is a local path (not a hub id) keeps only its last part."""

    def local(path: str) -> bool:
        return os.path.isabs(path) or Path(path).exists()

    out, skip = [], False
    for i, arg in enumerate(argv):
        if skip:
            skip = False
        elif arg in private:
            skip = True
        elif arg.startswith(tuple(f"{flag}=" for flag in private)):
            continue
        elif i and argv[i - 1] == "--model" and local(arg):
            out.append(Path(arg).name)
        elif arg.startswith("--model=") and local(arg.split("=", 1)[1]):
            out.append(f"--model={Path(arg.split('=', 1)[1]).name}")
        else:
            out.append(arg)
    return out


def summarise(results: list[dict]) -> dict:
    by = {(r["method"], r["searches"]): r for r in results}
    sizes = sorted({r["searches"] for r in results})
    out: dict = {"ratio_ray_over_loop": {}, "marginal_searches_per_s": {}, "growth": {}}
    for n in sizes:
        out["ratio_ray_over_loop"][str(n)] = (
            by["ray", n]["searches_per_s"] / by["loop", n]["searches_per_s"]
        )
    for method in ("loop", "ray"):
        marginal = {}
        for small, large in zip(sizes, sizes[1:]):
            extra = by[method, large]["seconds"] - by[method, small]["seconds"]
            marginal[f"{small}-{large}"] = (large - small) / extra if extra > 0 else None
        out["marginal_searches_per_s"][method] = marginal
        first, last = by[method, sizes[0]], by[method, sizes[-1]]
        out["growth"][method] = {
            "input_ratio": sizes[-1] / sizes[0],
            "time_ratio": last["seconds"] / first["seconds"],
            "peak_tree_mb_ratio": last["peak_tree_mb"] / first["peak_tree_mb"],
            "peak_driver_mb_ratio": last["peak_driver_mb"] / first["peak_driver_mb"],
        }
    return out


def chart(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for method, marker in (("loop", "o"), ("ray", "s")):
        rows = sorted((r for r in results if r["method"] == method), key=lambda r: r["searches"])
        n = [r["searches"] for r in rows]
        left.plot(n, [r["seconds"] for r in rows], marker=marker, label=method)
        right.plot(n, [r["peak_tree_mb"] for r in rows], marker=marker, label=f"{method} tree")
        right.plot(
            n,
            [r["peak_driver_mb"] for r in rows],
            marker=marker,
            ls="--",
            label=f"{method} driver",
        )
    for ax, label in ((left, "wall seconds"), (right, "peak PSS (MB)")):
        ax.set_xscale("log")
        ax.set_xlabel("searches (20 candidates each)")
        ax.set_ylabel(label)
        ax.legend()
    left.set_yscale("log")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def markdown(report: dict) -> str:
    a = report["args"]
    lines = [
        "# Offline scale: the rerank job (Ray Data) vs a plain loop",
        "",
        f"- scorer: tiny random Qwen3 (hidden 64, 2 layers, real Qwen3 tokenizer), mode "
        f"{a['mode']}, {a['batch_size']} searches per call, 20 candidates per search",
        f"- Ray: `ray.init(num_cpus={a['ray_cpus']})`, actors {a['actors']} (1 torch thread "
        f"each), at least {a['rows_per_file']} rows per part file; loop: 1 torch thread",
        f"- machine: {report['environment']}",
        "",
        "| method | searches | seconds | searches/s | peak tree MB | peak driver MB "
        "| store peak MB | spilled MB | files | output MB |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in report["results"]:
        o = r["output"]
        lines.append(
            f"| {r['method']} | {r['searches']} | {r['seconds']:.1f} | {r['searches_per_s']:.1f} "
            f"| {r['peak_tree_mb']:.0f} | {r['peak_driver_mb']:.0f} "
            f"| {r.get('object_store_peak_mb', 0):.1f} | {r.get('spilled_mb', 0):.1f} "
            f"| {o['files']} | {o['bytes'] / 2**20:.1f} |"
        )
    s = report["summary"]
    lines += ["", "Ray / loop throughput ratio:"]
    lines += [f"- {n} searches: {v:.2f}" for n, v in s["ratio_ray_over_loop"].items()]
    lines += ["", "Marginal rate (searches/s between consecutive sizes):"]
    for method, marginal in s["marginal_searches_per_s"].items():
        parts = ", ".join(f"{k}: {'n/a' if v is None else f'{v:.1f}'}" for k, v in marginal.items())
        lines.append(f"- {method}: {parts}")
    lines += ["", "Growth from the smallest to the largest input:"]
    for method, g in s["growth"].items():
        lines.append(
            f"- {method}: input x{g['input_ratio']:.0f} -> time x{g['time_ratio']:.1f}, peak "
            f"tree memory x{g['peak_tree_mb_ratio']:.2f}, driver x{g['peak_driver_mb_ratio']:.2f}"
        )
    if report.get("kill_resume"):
        k = report["kill_resume"]
        d, c = k["driver_killed"], k["actor_killed"]
        lines += [
            "",
            f"Kill and resume at {k['searches']} searches:",
            f"- driver SIGKILLed after {d['killed_after_s']:.0f} s with {d['rows_committed_at_kill']}"
            f" rows committed; the re-run found {d['rerun_already_written']} written, scored "
            f"{d['rerun_rows_scored']} ({d['rows_rescored']} rescored) in "
            f"{d['rerun_seconds']:.0f} s; output {d['rows']} rows, {d['duplicates']} duplicates, "
            f"{d['missing']} missing",
            f"- one actor SIGKILLed"
            f"{' during that re-run' if k.get('actor_killed_in_rerun') else ''} with "
            f"{c['rows_committed_at_kill']} rows committed"
            f"{'' if c.get('killed_before_done', True) else ' (after the last one: tests nothing)'}"
            f": the job "
            f"went on, output {c['rows']} rows, {c['duplicates']} duplicates, "
            f"{c['missing']} missing",
        ]
    lines += ["", f"Command: `{report['command']}`", ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--model", default=None, help="default: build the tiny random Qwen3")
    parser.add_argument("--mode", default="M0")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--actors", default="1")
    parser.add_argument("--ray-cpus", type=int, default=2)
    parser.add_argument("--rows-per-file", type=int, default=2000)
    parser.add_argument(
        "--object-store-mb", type=int, default=None, help="the job's object-store budget"
    )
    parser.add_argument("--kill-resume", type=int, default=0, help="searches for kill/resume")
    parser.add_argument(
        "--kill-actor-in-rerun",
        action="store_true",
        help="kill the actor during the driver-kill re-run instead of in a run of its own",
    )
    parser.add_argument(
        "--work-dir",
        default=None,
        help="inputs, outputs and measured.jsonl; a measurement already in measured.jsonl "
        "is not run again (a benchmark stopped half-way goes on where it was)",
    )
    parser.add_argument("--out", default=str(RESULTS))
    parser.add_argument("--label", default="offline-scale-cpu-tiny-qwen3")
    parser.add_argument("--one", choices=["loop", "ray"], help=argparse.SUPPRESS)
    parser.set_defaults(threads=1)  # the loop's torch threads (bench_offline.plain_loop)
    parser.add_argument("--input", help=argparse.SUPPRESS)
    parser.add_argument("--output", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure_one(args)))
        return
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="bench-offline-scale-"))
    work.mkdir(parents=True, exist_ok=True)
    if args.model is None:
        from acare_ray.testing import build_random_qwen3

        args.model = str(build_random_qwen3(work / "tiny-qwen3"))
    sizes = [int(s) for s in args.sizes.split(",")]
    inputs = {}
    for n in sorted(set(sizes + ([args.kill_resume] if args.kill_resume else []))):
        inputs[n] = work / f"searches-{n}.parquet"
        if not inputs[n].exists():
            make_input(n, inputs[n])
    measured_path = work / "measured.jsonl"
    measured = {}
    if measured_path.exists():
        for line in measured_path.read_text().splitlines():
            r = json.loads(line)
            measured[r["method"], r["searches"]] = r
    results = []
    for n in sizes:
        for method in ("loop", "ray"):
            if (method, n) not in measured:
                output = work / f"{method}-{n}" / ("out.parquet" if method == "loop" else "")
                if output.exists():  # a measurement cut short: start it again from nothing
                    shutil.rmtree(output) if output.is_dir() else output.unlink()
                output.parent.mkdir(parents=True, exist_ok=True)
                measured[method, n] = run_subprocess(args, method, inputs[n], output)
                with measured_path.open("a") as f:
                    f.write(json.dumps(measured[method, n]) + "\n")
            results.append(measured[method, n])
            print(json.dumps(results[-1]), flush=True)
    report = {
        "command": "python -m benchmarks.bench_offline_scale "
        + " ".join(public_argv(sys.argv[1:])),
        "args": {
            k: v
            for k, v in vars(args).items()
            if k not in ("one", "input", "output", "work_dir", "threads", "out")
        }
        | {"model": "tiny random Qwen3" if "tiny-qwen3" in args.model else args.model},
        "environment": machine(),
        "results": results,
        "summary": summarise(results),
    }
    if args.kill_resume:
        report["kill_resume"] = kill_resume(args, inputs[args.kill_resume], work)
        print(json.dumps(report["kill_resume"]), flush=True)
    write_report(report, Path(args.out), args.label, markdown(report))
    chart(results, Path(args.out) / f"{args.label}.png")


if __name__ == "__main__":
    main()
