"""A rollout and a replica kill during an agent-bench run (issue 23.3).

The app (``--config``, default ``serve_configs/local.yaml``, at ``--replicas`` fixed replicas)
serves checkpoint ``--from``; ``acare agent-bench --endpoint`` runs its agents against it. After
``--switch-after-s`` the same config is deployed with checkpoint ``--to`` (Serve's in-place
update, what ``serve deploy`` or a RayService ``serveConfigV2`` edit does); ``--kill-after-s``
after the update is done, one replica actor is killed (``ray.kill``) and Serve replaces it.
Meanwhile, every second, Serve's status gives the replicas by state and a probe request the
``x-acare-model-version`` that answered (:class:`bench_autoscale.Monitor`).

    RAY_USAGE_STATS_ENABLED=0 .venv/bin/python -m benchmarks.bench_rollout \\
        --from runs/a/final --to runs/b/final [--tasks 16 --agents 16]

Recorded: when the update started and finished, the last probe answered by the old version and
the first by the new, the kill and the recovery, and agent-bench's own report: it exits with an
error if any search failed for good, and counts the 503/429 answers its client retried.
Writes ``<out>/<name>.{json,md,png}``.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from functools import partial
from pathlib import Path
from typing import Any

import httpx

from acare_ray.testing import free_port
from benchmarks.cluster_bench import (
    APP,
    Monitor,
    add_load_flags,
    add_output_flags,
    agent_bench_command,
    agent_bench_summary,
    deploy,
    fixed_replicas,
    plot_probes,
    public,
    replica_states,
    resolved_config,
    run_agent_bench,
    run_commands,
    run_paths,
    save_result,
    start_ray,
)
from benchmarks.report import commands_block, git_commit, machine_line


def with_model(config: dict[str, Any], model: str) -> dict[str, Any]:
    """``config`` serving ``model`` (an absolute path when it is a local folder)."""
    out = json.loads(json.dumps(config))
    path = Path(model)
    for app in out["applications"]:
        app["args"]["model"] = str(path.resolve()) if path.exists() else model
    return out


def wait_replicas(replicas: int, timeout_s: float = 600) -> None:
    """Until ``replicas`` RUNNING replicas and no other (an update or a replacement done)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if replica_states() == {"RUNNING": replicas}:
            return
        time.sleep(0.5)
    raise TimeoutError(f"not {replicas} RUNNING replicas after {timeout_s} s: {replica_states()}")


def replica_ids(base: str, want: int, timeout_s: float = 60) -> list[str]:
    """Distinct replica ids ``/v1/status`` names, until ``want`` of them answered."""
    seen: set[str] = set()
    deadline = time.monotonic() + timeout_s
    with httpx.Client(base_url=base, timeout=30) as http:
        while len(seen) < want and time.monotonic() < deadline:
            response = http.get("/v1/status")
            if response.status_code == 200:
                seen.add(response.json()["replica"])
    return sorted(seen)


def kill_one_replica(base: str, replicas: int) -> str:
    """Kill one replica actor of the app (no restart: Serve must start a replacement)."""
    import ray

    victim = replica_ids(base, replicas)[0]
    ray.kill(ray.get_actor(f"SERVE_REPLICA::{APP}#Reranker#{victim}", namespace="serve"))
    return victim


def switch_summary(samples: list[dict[str, Any]], old: str | None, new: str | None) -> dict:
    """From the probes: the last answered by ``old``, the first by ``new``, and any answered
    by ``old`` after ``new`` first answered (an interleaving rollout)."""
    probes = [s for s in samples if s.get("probe_status") == 200]
    last_old = max((s["t"] for s in probes if s.get("version") == old), default=None)
    first_new = min((s["t"] for s in probes if s.get("version") == new), default=None)
    return {
        "last_probe_old": last_old,
        "first_probe_new": first_new,
        "old_after_new": sum(
            1
            for s in probes
            if first_new is not None and s["t"] > first_new and s.get("version") == old
        ),
        "probe_versions": sorted({str(s.get("version")) for s in probes}),
        "probe_statuses": {
            str(k): sum(1 for s in samples if s.get("probe_status") == k)
            for k in sorted({s["probe_status"] for s in samples if "probe_status" in s})
        },
    }


def write_chart(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    timeline, marks = result["timeline"], result["marks"]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 6), sharex=True)
    watched = [s for s in timeline if "running" in s]
    top.step([s["t"] for s in watched], [s["running"] for s in watched], where="post")
    top.set_ylabel("replicas RUNNING")
    for label, version, color in (
        ("from", result["versions"]["from"], "tab:gray"),
        ("to", result["versions"]["to"], "tab:blue"),
    ):
        probes = [s for s in timeline if s.get("probe_status") == 200 and s["version"] == version]
        plot_probes(bottom, probes, ".", color, f"answered by --{label}")
    other = [s for s in timeline if "probe_status" in s and s["probe_status"] != 200]
    plot_probes(bottom, other, "x", "tab:red", "not 200")
    for name, color in (
        ("switch_start", "tab:blue"),
        ("switched", "tab:blue"),
        ("kill", "tab:red"),
        ("recovered", "tab:red"),
        ("load_end", "k"),
    ):
        if name in marks:
            for ax in (top, bottom):
                ax.axvline(marks[name], color=color, ls=":", lw=1)
            top.annotate(name, (marks[name], 0.1), rotation=90, fontsize="small")
    bottom.set_ylabel("probe latency (s)")
    bottom.set_xlabel("seconds since the agents started")
    bottom.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def markdown(result: dict[str, Any]) -> str:
    a, m, s, b = result["args"], result["marks"], result["switch"], result["agent_bench"]
    lat = b["latency_ms"] or {}
    lines = [
        "# A checkpoint rollout and a replica kill under agent load",
        "",
        f"`{a['config']}` at {a['replicas']} replicas, `acare agent-bench --endpoint` at "
        f"{a['agents']} agents on {a['tasks']} MuSiQue tasks (mode {a['modes']}); Ray with "
        f"{a['cpus']} CPUs. Machine: {result['machine']}.",
        "",
        f"- agent-bench: {b['tasks']} tasks, {b['searches']} searches, none failed (the run "
        f"exits with an error otherwise), {b['refused_retried']} 503/429 answers retried; "
        f"{b['searches_per_s']:.3f} searches/s, latency p50/p95/p99 {lat.get('p50', 0):.0f} / "
        f"{lat.get('p95', 0):.0f} / {lat.get('p99', 0):.0f} ms",
        f"- versions: from `{result['versions']['from']}` to `{result['versions']['to']}`",
        f"- update: started at {m.get('switch_start')} s, done (every replica the new one) at "
        f"{m.get('switched')} s; probes: last answered by the old version at "
        f"{s['last_probe_old']} s, first by the new at {s['first_probe_new']} s, old answers "
        f"after the first new one: {s['old_after_new']}",
        f"- replica kill: at {m.get('kill', '-')} s, {a['replicas']} RUNNING again at "
        f"{m.get('recovered', '-')} s",
        f"- probe statuses: {s['probe_statuses']}",
        "",
        "Times are seconds since the agents started.",
        *commands_block(result["commands"]),
    ]
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--from", dest="source", required=True, help="checkpoint served first")
    parser.add_argument("--to", dest="target", required=True, help="checkpoint rolled out")
    parser.add_argument("--config", default="serve_configs/local.yaml")
    parser.add_argument("--replicas", type=int, default=2)
    add_load_flags(parser)
    parser.add_argument("--switch-after-s", type=float, default=30)
    parser.add_argument(
        "--kill-after-s", type=float, default=20, help="after the update; negative: no kill"
    )
    add_output_flags(parser, "bench_rollout", "rollout-cpu-minilm")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    import ray
    from ray import serve

    from acare_ray.online.models import ModelSource, checkpoint_version

    args = parse_args(argv)
    work, out, config_path = run_paths(args)
    base_config = fixed_replicas(resolved_config(config_path, None, free_port()), args.replicas)
    first, second = with_model(base_config, args.source), with_model(base_config, args.target)
    versions = {
        "from": checkpoint_version(ModelSource(first["applications"][0]["args"]["model"])),
        "to": checkpoint_version(ModelSource(second["applications"][0]["args"]["model"])),
    }
    base = f"http://127.0.0.1:{base_config['http_options']['port']}"
    start_ray(args.cpus)
    command = agent_bench_command(args, base, work / "agents")
    report: dict[str, Any] = {}
    failure: list[BaseException] = []
    with (work / "bench_rollout.log").open("a") as log:
        try:
            deploy(first)
            monitor = Monitor(base, args.interval_s).start()

            def agents() -> None:
                try:
                    report.update(run_agent_bench(command, log))
                except BaseException as err:  # noqa: BLE001 - re-raised below
                    failure.append(err)
                finally:
                    monitor.mark("load_end")

            runner = threading.Thread(target=agents)
            monitor.mark("load_start")
            runner.start()
            runner.join(timeout=args.switch_after_s)
            if runner.is_alive():
                monitor.mark("switch_start")
                from ray.serve._private.api import serve_start
                from ray.serve.schema import ServeDeploySchema

                client = serve_start(
                    http_options=second["http_options"], proxy_location=second["proxy_location"]
                )
                client.deploy_apps(ServeDeploySchema.model_validate(second))
                wait_replicas(args.replicas)
                monitor.mark("switched")
                if args.kill_after_s >= 0:
                    runner.join(timeout=args.kill_after_s)
                    if runner.is_alive():
                        monitor.mark("kill")
                        kill_one_replica(base, args.replicas)
                        time.sleep(2)  # Serve's controller notices the death
                        wait_replicas(args.replicas)
                        monitor.mark("recovered")
            runner.join()
            time.sleep(2 * args.interval_s)
            monitor.stop()
        finally:
            serve.shutdown()
            ray.shutdown()
    if failure:
        raise RuntimeError("agent-bench failed: a search failed for good") from failure[0]
    result = {
        "benchmark": "bench_rollout",
        "args": vars(args)
        | {k: public(getattr(args, k)) for k in ("source", "target", "config")}
        | {"work_dir": None, "out": None},
        "machine": machine_line(),
        "git_commit": git_commit(),
        "versions": versions,
        "marks": monitor.marks,
        "switch": switch_summary(monitor.samples, versions["from"], versions["to"]),
        "agent_bench": agent_bench_summary(report),
        "timeline": monitor.samples,
        "commands": run_commands("bench_rollout.py", argv, args),
    }
    return save_result(result, out, args.name, markdown, partial(write_chart, result))


if __name__ == "__main__":
    main()
