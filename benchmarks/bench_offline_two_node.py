"""The rerank job on a real two-node Ray cluster, submitted as the docs say (``ray job submit``).

Starts ``ray start --head`` and a second node with ``ray start --address`` on this host
(``acare_ray.testing.LocalRayCluster``: own temp dir and ports, each node with its own CPUs),
submits ``ray job submit --runtime-env jobs/rerank.yaml -- acare rerank ...`` over a searches
Parquet made before the cluster starts (synthetic, 20 candidates each; the tiny random Qwen3 of
``bench_offline_scale.py`` as the scorer), with the output on a folder both nodes reach (one
host: the same local disk). Then reads back from the cluster's state API which node each of the
job's actors ran on and how many batches each finished, and checks the output holds every
search exactly once. Writes ``<out>/<label>.{json,md}``.

    RAY_USAGE_STATS_ENABLED=0 .venv/bin/python -m benchmarks.bench_offline_two_node \\
        --searches 10000 --actors 2
"""

from __future__ import annotations

import argparse
import collections
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from acare_ray.testing import LocalRayCluster, build_random_qwen3
from benchmarks.bench_offline import make_input
from benchmarks.bench_offline_scale import check_exactly_once, output_files, public_argv
from benchmarks.report import machine, write_report

REPO = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).resolve().parent / "results"


def state(cluster: LocalRayCluster, kind: str) -> list[dict]:
    """``ray list <kind> --detail --format json`` against the cluster."""
    done = subprocess.run(
        [cluster.ray, "list", kind, "--address", cluster.address, "--detail"]
        + ["--format", "json", "--limit", "10000"],
        env=cluster.env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if done.returncode != 0:
        raise RuntimeError(f"ray list {kind} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout)


def per_node_work(cluster: LocalRayCluster) -> list[dict]:
    """The rerank actors per node and the blocks each finished (Ray Data calls an actor once per
    block of searches: ``submit``)."""
    nodes = {
        n["node_id"]: ("head" if n["is_head_node"] else "worker") for n in state(cluster, "nodes")
    }
    actors = [a for a in state(cluster, "actors") if "MapWorker" in a["class_name"]]
    calls = collections.Counter(
        t["actor_id"]
        for t in state(cluster, "tasks")
        if t.get("actor_id") in {a["actor_id"] for a in actors}
        and t["state"] == "FINISHED"
        and t["name"].endswith(".submit")
    )
    out = []
    for node_id, role in sorted(nodes.items(), key=lambda kv: kv[1]):
        mine = [a for a in actors if a["node_id"] == node_id]
        out.append(
            {
                "node": role,
                "node_id": node_id,
                "actors": len(mine),
                "blocks_finished": sum(calls[a["actor_id"]] for a in mine),
            }
        )
    return out


def markdown(report: dict) -> str:
    a, r = report["args"], report["result"]
    lines = [
        "# The rerank job on a two-node Ray cluster (`ray job submit`)",
        "",
        f"- cluster: `ray start --head --num-cpus={a['head_cpus']}` + `ray start --address ... "
        f"--num-cpus={a['worker_cpus']}` on one host ({report['environment']})",
        f"- job: `{report['job_command']}`",
        f"- input: {r['searches']} synthetic searches, 20 candidates each; scorer: tiny random "
        "Qwen3 (hidden 64, 2 layers, real Qwen3 tokenizer)",
        "",
        f"Job wall time {r['seconds']:.1f} s ({r['searches'] / r['seconds']:.1f} searches/s, "
        f"cluster start-up not counted); output {r['rows']} rows in {r['output']['files']} "
        f"part files, {r['duplicates']} duplicates, {r['missing']} missing.",
        "",
        "| node | rerank actors | blocks of searches scored |",
        "|---|---:|---:|",
    ]
    lines += [f"| {n['node']} | {n['actors']} | {n['blocks_finished']} |" for n in r["nodes"]]
    lines += ["", f"Command: `{report['command']}`", ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--searches", type=int, default=10000)
    parser.add_argument("--actors", default="2")
    parser.add_argument("--head-cpus", type=int, default=2)
    parser.add_argument("--worker-cpus", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--rows-per-file", type=int, default=2000)
    parser.add_argument("--work-dir", default=None)
    parser.add_argument("--out", default=str(RESULTS))
    parser.add_argument("--label", default="offline-two-node-cpu-tiny-qwen3")
    args = parser.parse_args()
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="bench-two-node-"))
    work.mkdir(parents=True, exist_ok=True)
    model = work / "tiny-qwen3"
    if not model.exists():
        build_random_qwen3(model)
    searches = work / f"searches-{args.searches}.parquet"
    if not searches.exists():
        make_input(args.searches, searches)
    output = work / "reranked"
    job = ["acare", "rerank", "--input", str(searches), "--output", str(output)]
    job += ["--model", str(model), "--mode", "M0", "--actors", args.actors]
    job += ["--batch-size", str(args.batch_size), "--rows-per-file", str(args.rows_per_file)]
    with LocalRayCluster(head_cpus=args.head_cpus, worker_cpus=[args.worker_cpus]) as cluster:
        argv = [cluster.ray, "job", "submit", "--address", cluster.address]
        argv += ["--runtime-env", str(REPO / "jobs" / "rerank.yaml"), "--", *job]
        started = time.perf_counter()
        done = subprocess.run(argv, env=cluster.env, capture_output=True, text=True, cwd=REPO)
        seconds = time.perf_counter() - started
        if done.returncode != 0:
            raise RuntimeError(f"ray job submit failed:\n{(done.stdout + done.stderr)[-4000:]}")
        # Task events reach the state API some seconds after the job ends: read until stable.
        nodes, previous = per_node_work(cluster), None
        while nodes != previous:
            time.sleep(5)
            previous, nodes = nodes, per_node_work(cluster)
    result = {"searches": args.searches, "seconds": seconds, "nodes": nodes}
    result |= check_exactly_once(output, searches) | {"output": output_files(output)}
    report = {
        "command": "python -m benchmarks.bench_offline_two_node "
        + " ".join(public_argv(sys.argv[1:])),
        "job_command": "ray job submit --runtime-env jobs/rerank.yaml -- "
        + " ".join(
            "SEARCHES"
            if a == str(searches)
            else "OUT"
            if a == str(output)
            else "TINY_QWEN3"
            if a == str(model)
            else a
            for a in job
        ),
        "args": {k: v for k, v in vars(args).items() if k != "work_dir"},
        "environment": machine(),
        "job_output_tail": done.stdout[-1500:].replace(str(work), "WORK"),
        "result": result,
    }
    write_report(report, Path(args.out), args.label, markdown(report))


if __name__ == "__main__":
    main()
