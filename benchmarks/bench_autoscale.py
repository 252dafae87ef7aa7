"""Autoscaling, shown (issues 23.2, 35.1): ``serve_configs/cpu-autoscale.yaml`` (1 to 2 one-core
replicas) under its pressure policy and under Serve's default policy, against the same config
fixed at one replica and at ``max_replicas`` (running before the load: the capacity no policy
can exceed), all driven by ``acare agent-bench --endpoint`` at 16 agents on the same tasks, in
one run on one machine.

Each phase deploys the app fresh on a local Ray cluster of ``--cpus`` CPUs started by this
script (``ray.init``; the deploy is what ``serve deploy`` does with the resolved config), runs
the agent-bench command a user would run, and meanwhile, every second, records from Serve's own
status (``serve.status()``) the replicas by state, and from a probe (a 5-document
``/v2/rerank``, never retried) the latency and status a newcomer would get; ``/v1/status``
adds the admission refusals of each replica it reaches. After the agents finish, the
autoscaling phase keeps recording until Serve is back to ``min_replicas`` (or ``--settle-s``).

    RAY_USAGE_STATS_ENABLED=0 .venv/bin/python -m benchmarks.bench_autoscale \\
        [--model CHECKPOINT] [--tasks 16] [--agents 16]

Writes ``benchmarks/results/<name>.{json,md,png}`` (chart: replicas and probe latency over
time, every phase). The target of the issue: 2 replicas give >= 1.6x the searches/s of one.
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from functools import partial
from pathlib import Path
from typing import Any

from acare_ray.online.autoscaling import load_upscale_delay_s
from acare_ray.scoring import DEFAULT_MODEL
from acare_ray.testing import free_port
from benchmarks.cluster_bench import (
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

TARGET_SPEEDUP = 1.6


def default_policy(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` with Serve's default autoscaling policy: the policy the pressure policy is
    measured against, same bounds, and Serve's ``upscale_delay_s`` set to the delay the
    pressure policy gives load growth (the config sets Serve's to 0 for it)."""
    out = copy.deepcopy(config)
    scaling = autoscaling(out)
    if scaling is not None:
        scaling["upscale_delay_s"] = load_upscale_delay_s(scaling)
        scaling.pop("policy", None)
    return out


def autoscaling(config: dict[str, Any]) -> dict[str, Any] | None:
    (app,) = config["applications"]
    (deployment,) = [d for d in app["deployments"] if d["name"] == "Reranker"]
    return deployment.get("autoscaling_config")


def phase_configs(config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each phase's deployment: ``config`` (its autoscaling, under its policy) fixed at one
    replica and at ``max_replicas``, under Serve's default policy, and as it is."""
    return {
        "fixed": fixed_replicas(config, 1),
        "fixed-max": fixed_replicas(config, autoscaling(config)["max_replicas"]),
        "autoscale-default": default_policy(config),
        "autoscale": config,
    }


def scale_up_wait_s(scaling: dict[str, Any], replica_start_s: float) -> float:
    """How long a request arriving with a step of load waits before an added replica serves:
    ``upscale_delay_s``, plus about half of ``look_back_period_s`` (the averaged ongoing
    requests crossing ``target_ongoing_requests``), plus the replica's start."""
    look_back = float(scaling.get("look_back_period_s", 30.0))
    return load_upscale_delay_s(scaling) + look_back / 2 + replica_start_s


def admission_window_s(user_config: dict[str, Any], clients: int = 1) -> float:
    """The expected wait at which a replica with this ``user_config`` starts refusing the
    requests of ``clients`` clients (:meth:`Admission.refusal_wait_s`)."""
    from acare_ray.online.admission import Admission
    from acare_ray.online.app_args import ReplicaSettings

    settings = ReplicaSettings.model_validate(user_config)
    admission = Admission(settings.admission_deadline_s, 1.0, client_share=settings.client_share)
    return admission.refusal_wait_s(clients)


def scaling_summary(samples: list[dict[str, Any]], marks: dict[str, float]) -> dict[str, Any]:
    """What the timeline shows: the most replicas RUNNING, when a replica was first being
    added (a state other than RUNNING) and when the most ran (``replica_start_s`` between),
    when they were back to the fewest after the load, when the first refusal was seen."""
    watched = [s for s in samples if "running" in s]
    running = [(s["t"], s["running"]) for s in watched]
    most = max((r for _, r in running), default=0)
    first_most = next((t for t, r in running if r == most), None)
    start = running[0][1] if running else 0
    adding = next(
        (
            s["t"]
            for s in watched
            if s["running"] == start and sum(s.get("replicas", {}).values()) > start
        ),
        None,
    )
    load_end = marks.get("load_end")
    fewest_after = None
    if load_end is not None:
        after = [(t, r) for t, r in running if t >= load_end]
        low = min((r for _, r in after), default=None)
        fewest_after = next((t for t, r in after if r == low), None) if low is not None else None
    # The agents' refusals: what the replicas refused beyond the probes' own.
    refusal = next(
        (s["t"] for s in samples if (s.get("refused_total") or 0) > (s.get("probe_refused") or 0)),
        None,
    )
    # The agents' refusals over time: the replicas' count less the probes' own by then.
    agents, probe_refused = [], 0
    for s in samples:
        probe_refused = s.get("probe_refused", probe_refused)
        if "refused_total" in s:
            agents.append((s["t"], (s["refused_total"] or 0) - (probe_refused or 0)))
    scaled_at = first_most if most > start else None
    before_scaled = [n for t, n in agents if scaled_at is not None and t <= scaled_at]
    probes = [s for s in samples if "probe_status" in s]
    return {
        "max_running_replicas": most,
        "t_max_replicas": first_most,
        "t_adding_replica": adding if most > start else None,
        "replica_start_s": (
            round(first_most - adding, 2)
            if most > start and adding is not None and first_most is not None
            else None
        ),
        "t_back_down": fewest_after,
        "running_at_end": running[-1][1] if running else None,
        "t_first_refusal_seen": refusal,
        "refusals_seen": max((s.get("refused_total") or 0 for s in watched), default=0),
        "agent_refusals": max((n for _, n in agents), default=0),
        "agent_refusals_before_scaled": max(before_scaled, default=None),
        "probes": len(probes),
        "probe_statuses": {
            str(k): sum(1 for p in probes if p["probe_status"] == k)
            for k in sorted({p["probe_status"] for p in probes})
        },
    }


def phase_row(name: str, report: dict[str, Any], monitor: Monitor) -> dict[str, Any]:
    (_, summary), *_ = report["systems"].items()
    return {
        "phase": name,
        **agent_bench_summary(report),
        "wall_s": summary["wall_s"],
        "marks": dict(monitor.marks),
        "scaling": scaling_summary(monitor.samples, monitor.marks),
        "timeline": monitor.samples,
    }


def run_phase(
    name: str, config: dict[str, Any], args: argparse.Namespace, work: Path, log
) -> dict[str, Any]:
    """Deploy ``config``, run agent-bench against it while monitoring, then (autoscaling) wait
    for the replicas to come back down; the phase's row."""
    from ray import serve

    port = config["http_options"]["port"]
    base = f"http://127.0.0.1:{port}"
    print(f"[{name}] deploying", file=log, flush=True)
    deploy(config)
    scaling = autoscaling(config)
    monitor = Monitor(base, args.interval_s).start()
    try:
        monitor.mark("load_start")
        report = run_agent_bench(agent_bench_command(args, base, work / name), log)
        monitor.mark("load_end")
        if scaling is not None:
            deadline = time.monotonic() + args.settle_s
            while time.monotonic() < deadline:
                if replica_states() == {"RUNNING": scaling["min_replicas"]}:
                    break
                time.sleep(1)
            monitor.mark("settled")
            time.sleep(2 * args.interval_s)
    finally:
        monitor.stop()
        serve.shutdown()
    return phase_row(name, report, monitor)


def write_chart(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 6), sharex=True)
    for row, color in zip(rows, ("tab:gray", "tab:purple", "tab:blue", "tab:green")):
        watched = [s for s in row["timeline"] if "running" in s]
        top.step(
            [s["t"] for s in watched],
            [s["running"] for s in watched],
            where="post",
            color=color,
            label=row["phase"],
        )
        probes = [s for s in row["timeline"] if s.get("probe_status") == 200]
        plot_probes(bottom, probes, ".-", color, f"{row['phase']} (200)")
        refused = [s for s in row["timeline"] if s.get("probe_status") in (429, 503)]
        plot_probes(bottom, refused, "x", color, f"{row['phase']} (refused)")
        if "load_end" in row["marks"]:
            top.axvline(row["marks"]["load_end"], color=color, ls=":", lw=1)
    top.set_ylabel("replicas RUNNING")
    top.set_yticks(range(0, 1 + max(r["scaling"]["max_running_replicas"] for r in rows)))
    bottom.set_ylabel("probe latency (s)")
    bottom.set_xlabel("seconds since the agents started (dotted: agents done)")
    top.legend()
    bottom.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def markdown(result: dict[str, Any]) -> str:
    a = result["args"]
    lines = [
        "# Autoscaling on CPU, 1 to 2 replicas (pressure policy, Serve's default, fixed): "
        + ", ".join(f"`{r['phase']}`" for r in result["rows"]),
        "",
        f"`{a['config']}` with model `{a['model']}`, `acare agent-bench --endpoint` at "
        f"{a['agents']} agents"
        + (f" started over {a['ramp_s']:g} s (a ramp)" if a.get("ramp_s") else " (a step)")
        + f" on {a['tasks']} MuSiQue tasks (seed {a['seed']}, mode "
        f"{a['modes']}), Ray with {a['cpus']} CPUs. Machine: {result['machine']}. Autoscaling: "
        f"`{json.dumps(result['autoscaling_config'])}`.",
        "",
        "| phase | searches | searches/s | latency p50/p95/p99 ms | 503/429 retried "
        "| most replicas | adding at s | running at s | start s | back down at s "
        "| first refusal at s |",
        "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in result["rows"]:
        lat, sc = r["latency_ms"] or {}, r["scaling"]
        lines.append(
            f"| {r['phase']} | {r['searches']} | {r['searches_per_s']:.3f} "
            f"| {lat.get('p50', 0):.0f} / {lat.get('p95', 0):.0f} / {lat.get('p99', 0):.0f} "
            f"| {r['refused_retried']} | {sc['max_running_replicas']} "
            f"| {sc['t_adding_replica']} | {sc['t_max_replicas']} | {sc['replica_start_s']} "
            f"| {sc['t_back_down'] if r['phase'].startswith('autoscale') else '-'} "
            f"| {sc['t_first_refusal_seen']} |"
        )
    speedup = result.get("speedup")
    if speedup is not None:
        verdict = "meets" if speedup >= TARGET_SPEEDUP else "misses"
        lines += [
            "",
            f"Autoscaled searches/s over the fixed replica's: **{speedup:.2f}x** ({verdict} the "
            f"{TARGET_SPEEDUP}x target).",
        ]
    by = {r["phase"]: r["scaling"] for r in result["rows"]}
    if {"autoscale", "autoscale-default"} <= set(by):
        new, old = by["autoscale"], by["autoscale-default"]
        before = new["t_adding_replica"] is not None and (
            new["t_first_refusal_seen"] is None
            or new["t_adding_replica"] < new["t_first_refusal_seen"]
        )
        halved = old["agent_refusals"] > 0 and new["agent_refusals"] <= old["agent_refusals"] / 2
        lines += [
            "",
            f"Pressure policy vs Serve's default, same load {'ramp' if a.get('ramp_s') else 'step'}"
            ": second replica requested at "
            f"{new['t_adding_replica']} s vs {old['t_adding_replica']} s, running at "
            f"{new['t_max_replicas']} s vs {old['t_max_replicas']} s; first refusal at "
            f"{new['t_first_refusal_seen']} s vs {old['t_first_refusal_seen']} s; the agents' "
            f"refusals {new['agent_refusals']} vs {old['agent_refusals']} in all, "
            f"{new['agent_refusals_before_scaled']} vs {old['agent_refusals_before_scaled']} "
            "until the second replica ran. Requested before the first refusal: "
            f"**{'yes' if before else 'no'}**; the agents' refusals at least halved: "
            f"**{'yes' if halved else 'no'}**.",
        ]
    if {"fixed-max", "autoscale-default"} <= set(by):
        floor, old = by["fixed-max"], by["autoscale-default"]
        lines += [
            "",
            f"With {floor['max_running_replicas']} replicas running before the load "
            f"(`fixed-max`), the agents' refusals are {floor['agent_refusals']}: what "
            "admission refuses at the most capacity a policy bounded by the same "
            "`max_replicas` can give, from the first second (half the default policy's "
            f"refusals: {old['agent_refusals'] / 2:g}).",
        ]
    lines += [
        "",
        "Times are seconds since the agents started. 'adding': Serve first showed a replica "
        "being added; 'start s': from then until it ran. 'first refusal': the first admission "
        "refusal of the agents' requests counted by a replica's `/v1/status` (the probes' own "
        "refusals left out, as in the agents' refusal counts; the table's retried column is "
        "what the agents' client counted).",
        *commands_block(result["commands"]),
    ]
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="serve_configs/cpu-autoscale.yaml")
    parser.add_argument("--model", default=DEFAULT_MODEL, help="model id or checkpoint")
    add_load_flags(parser, tasks_help="MuSiQue tasks per phase")
    parser.add_argument(
        "--phases",
        default="fixed,fixed-max,autoscale-default,autoscale",
        help="fixed (one replica), fixed-max (max_replicas running before the load: the most "
        "capacity any policy with that maximum can give), autoscale-default (Serve's default "
        "policy), autoscale (the config's policy: acare's pressure policy)",
    )
    parser.add_argument("--settle-s", type=float, default=180, help="wait for scale-down")
    add_output_flags(parser, "bench_autoscale", "autoscale-cpu-minilm")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    import ray

    args = parse_args(argv)
    work, out, config_path = run_paths(args)
    config = resolved_config(config_path, args.model, free_port())
    configs = phase_configs(config)
    phases = [p for p in args.phases.split(",") if p]
    unknown = set(phases) - set(configs)
    if unknown:
        raise SystemExit(f"--phases: unknown {sorted(unknown)}; known: {', '.join(configs)}")
    start_ray(args.cpus)
    rows = []
    with (work / "bench_autoscale.log").open("a") as log:
        try:
            for phase in phases:
                rows.append(run_phase(phase, configs[phase], args, work, log))
        finally:
            ray.shutdown()
    by = {r["phase"]: r for r in rows}
    speedup = None
    if {"fixed", "autoscale"} <= set(by) and by["fixed"]["searches_per_s"]:
        speedup = by["autoscale"]["searches_per_s"] / by["fixed"]["searches_per_s"]
    result = {
        "benchmark": "bench_autoscale",
        "args": vars(args)
        | {"config": public(args.config), "model": public(args.model)}
        | {"work_dir": None, "out": None},
        "machine": machine_line(),
        "git_commit": git_commit(),
        "autoscaling_config": autoscaling(config),
        "rows": rows,
        "speedup": speedup,
        "target_speedup": TARGET_SPEEDUP,
        "commands": run_commands("bench_autoscale.py", argv, args),
    }
    return save_result(result, out, args.name, markdown, partial(write_chart, rows))


if __name__ == "__main__":
    main()
