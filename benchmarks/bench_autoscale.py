"""Autoscaling, shown (issue 23.2): ``serve_configs/cpu-autoscale.yaml`` (1 to 2 one-core
replicas) against a fixed single replica of the same config, both driven by ``acare agent-bench
--endpoint`` at 16 agents on the same tasks, in one run on one machine.

Each phase deploys the app fresh on a local Ray cluster of ``--cpus`` CPUs started by this
script (``ray.init``; the deploy is what ``serve deploy`` does with the resolved config), runs
the agent-bench command a user would run, and meanwhile, every second, records from Serve's own
status (``serve.status()``) the replicas by state, and from a probe (a 5-document
``/v2/rerank``, never retried) the latency and status a newcomer would get; ``/v1/status``
adds the admission refusals of each replica it reaches. After the agents finish, the
autoscaling phase keeps recording until Serve is back to ``min_replicas`` (or ``--settle-s``).

    RAY_USAGE_STATS_ENABLED=0 .venv/bin/python benchmarks/bench_autoscale.py \\
        [--model CHECKPOINT] [--tasks 16] [--agents 16]

Writes ``benchmarks/results/<name>.{json,md,png}`` (chart: replicas and probe latency over
time, both phases). The target of the issue: 2 replicas give >= 1.6x the searches/s of one.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import httpx
from report import commands_block, git_commit, machine_line, write_report

from acare_ray.scoring import DEFAULT_MODEL
from acare_ray.testing import free_port

ROOT = Path(__file__).resolve().parents[1]
APP = "acare"
PROBE = {
    "query": "capital population",
    "documents": [
        f"Paragraph {i}: the capital of Velmoria has {i} million people." for i in range(5)
    ],
    "mode": "M0",
}
TARGET_SPEEDUP = 1.6


def relative(text: str) -> str:
    """``text`` with this checkout's absolute paths made relative to it (results are shared)."""
    return text.replace(sys.executable + " ", "python ").replace(str(ROOT) + "/", "")


def public(value: str) -> str:
    """A path argument as results may record it: relative to this checkout, or its last part
    for a path elsewhere (no machine paths in shared results); other values unchanged."""
    value = relative(value)
    return Path(value).name if value.startswith("/") else value


def resolved_config(config: Path, model: str | None, port: int) -> dict[str, Any]:
    """The Serve config ``acare serve --config CONFIG --model MODEL --port PORT`` would run."""
    from acare_ray.online.cli import ServeConfig, serve_config

    return serve_config(ServeConfig(config=config, model=model, port=port))


def fixed_replicas(config: dict[str, Any], replicas: int) -> dict[str, Any]:
    """``config`` with the Reranker at a fixed ``replicas`` (its autoscaling removed)."""
    out = copy.deepcopy(config)
    for app in out["applications"]:
        for deployment in app.get("deployments", []):
            if deployment.get("name") == "Reranker":
                deployment.pop("autoscaling_config", None)
                deployment["num_replicas"] = replicas
    return out


def default_policy(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` with Serve's default autoscaling policy (its ``policy`` removed): the policy
    the pressure policy is measured against, same bounds and delays."""
    out = copy.deepcopy(config)
    scaling = autoscaling(out)
    if scaling is not None:
        scaling.pop("policy", None)
    return out


def autoscaling(config: dict[str, Any]) -> dict[str, Any] | None:
    (app,) = config["applications"]
    (deployment,) = [d for d in app["deployments"] if d["name"] == "Reranker"]
    return deployment.get("autoscaling_config")


def deploy(config: dict[str, Any], timeout_s: float = 600) -> None:
    """Submit ``config`` to Serve (as ``serve deploy`` does) and wait until the app runs."""
    from ray import serve
    from ray.serve._private.api import serve_start
    from ray.serve.schema import ServeDeploySchema

    client = serve_start(
        http_options=config["http_options"], proxy_location=config["proxy_location"]
    )
    client.deploy_apps(ServeDeploySchema.model_validate(config))
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        app = serve.status().applications.get(APP)
        if app is not None:
            if app.status == "DEPLOY_FAILED":
                raise RuntimeError(f"deploy failed: {app.message}")
            if app.status == "RUNNING" and app.deployments["Reranker"].status == "HEALTHY":
                return
        time.sleep(1)
    raise TimeoutError(f"the app was not running after {timeout_s} s")


def replica_states() -> dict[str, int] | None:
    """The Reranker's replicas by state, from Serve's own status; None while Serve's status
    does not list the deployment (the app being built, as at the start of an update)."""
    from ray import serve

    app = serve.status().applications.get(APP)
    if app is None or "Reranker" not in app.deployments:
        return None
    return {str(k): int(v) for k, v in app.deployments["Reranker"].replica_states.items()}


class Monitor:
    """Two threads until :meth:`stop`: every ``interval_s`` Serve's replica states and one
    ``/v1/status`` (a sample with ``running``, ``replicas``, ``refused_total``...), and every
    ``probe_every`` intervals one probe request, never retried (a sample with ``probe_status``,
    ``probe_ms``, ``version``, ``t`` when it was sent), so a slow probe never delays the
    replica counts. ``samples`` holds both kinds in time order, ``t`` seconds since
    :meth:`start`; ``refused_total`` counts what the replicas refused, ``probe_refused`` the
    probes' own refusals by then."""

    def __init__(self, base: str, interval_s: float = 1.0, probe_every: int = 2) -> None:
        self.base = base
        self.interval_s = interval_s
        self.probe_every = probe_every
        self.samples: list[dict[str, Any]] = []
        self.marks: dict[str, float] = {}
        self.refused_by_replica: dict[str, int] = {}
        self.probe_refused = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._watch, daemon=True),
            threading.Thread(target=self._probes, daemon=True),
        ]
        self.t0 = 0.0

    def now(self) -> float:
        return round(time.monotonic() - self.t0, 2)

    def mark(self, name: str) -> None:
        self.marks[name] = self.now()

    def start(self) -> Monitor:
        self.t0 = time.monotonic()
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=150)
        self.samples.sort(key=lambda s: s["t"])

    def _add(self, sample: dict[str, Any]) -> None:
        with self._lock:
            self.samples.append(sample)

    def _status(self, http: httpx.Client) -> dict[str, Any]:
        try:
            response = http.get("/v1/status", timeout=10)
            status = response.json() if response.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            status = None
        if not status:
            return {}
        admission = status.get("admission") or {}
        self.refused_by_replica[status["replica"]] = int(admission.get("refused", 0))
        return {
            "status_replica": status["replica"],
            "queued_requests": admission.get("queued_requests"),
            "expected_wait_s": admission.get("expected_wait_s"),
            "refused_total": sum(self.refused_by_replica.values()),
            "probe_refused": self.probe_refused,
        }

    def _watch(self) -> None:
        with httpx.Client(base_url=self.base, timeout=30) as http:
            while not self._stop.is_set():
                started = time.monotonic()
                sample: dict[str, Any] = {"t": self.now()}
                try:
                    states = replica_states()
                except Exception as err:  # the controller restarting: keep recording
                    states, sample["status_error"] = None, type(err).__name__
                if states is not None:  # else no count: unknown is not zero
                    sample["replicas"] = states
                    sample["running"] = states.get("RUNNING", 0)
                self._add(sample | self._status(http))
                self._stop.wait(max(0.0, self.interval_s - (time.monotonic() - started)))

    def _probes(self) -> None:
        period = self.interval_s * self.probe_every
        with httpx.Client(base_url=self.base, timeout=130) as http:
            while not self._stop.is_set():
                started = time.monotonic()
                sample: dict[str, Any] = {"t": self.now()}
                try:
                    response = http.post("/v2/rerank", json=PROBE)
                except httpx.HTTPError as err:
                    sample |= {"probe_status": 0, "probe_error": type(err).__name__}
                else:
                    if response.status_code in (429, 503):
                        self.probe_refused += 1
                    sample |= {
                        "probe_status": response.status_code,
                        "probe_ms": round(1000 * (time.monotonic() - started), 1),
                        "version": response.headers.get("x-acare-model-version"),
                    }
                self._add(sample)
                self._stop.wait(max(0.0, period - (time.monotonic() - started)))


def agent_bench_command(args: argparse.Namespace, url: str, out: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "acare_ray.cli",
        "agent-bench",
        "--tasks",
        str(args.tasks),
        "--seed",
        str(args.seed),
        "--depth",
        str(args.depth),
        "--endpoint",
        url,
        "--modes",
        args.modes,
        "--agents",
        str(args.agents),
        "--no-baseline",
        "--out",
        str(out),
    ]


def run_agent_bench(command: list[str], log) -> dict[str, Any]:
    """The agent-bench run's report; raises if it failed (a search that failed for good)."""
    print(" ".join(command), file=log, flush=True)
    subprocess.run(command, check=True, stdout=log, stderr=log)
    out = Path(command[command.index("--out") + 1])
    return json.loads((out / "agent_bench.json").read_text())


def scale_up_wait_s(scaling: dict[str, Any], replica_start_s: float) -> float:
    """How long a request arriving with a step of load waits before an added replica serves:
    ``upscale_delay_s``, plus about half of ``look_back_period_s`` (the averaged ongoing
    requests crossing ``target_ongoing_requests``), plus the replica's start."""
    defaults = {"upscale_delay_s": 30.0, "look_back_period_s": 30.0}
    settings = defaults | {k: scaling[k] for k in defaults if k in scaling}
    return settings["upscale_delay_s"] + settings["look_back_period_s"] / 2 + replica_start_s


def admission_window_s(user_config: dict[str, Any], clients: int = 1) -> float:
    """The expected wait at which a replica starts refusing the requests of ``clients``
    clients sharing it evenly: ``admission_deadline_s``, or each client's ``client_share`` of
    it when that is less (one client alone is refused past its share)."""
    from acare_ray.online.app_args import ReplicaSettings

    settings = ReplicaSettings.model_validate(user_config)
    share = settings.client_share * settings.admission_deadline_s * clients
    return min(settings.admission_deadline_s, share)


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
        "probes": len(probes),
        "probe_statuses": {
            str(k): sum(1 for p in probes if p["probe_status"] == k)
            for k in sorted({p["probe_status"] for p in probes})
        },
    }


def agent_bench_summary(report: dict[str, Any]) -> dict[str, Any]:
    """The first system of an agent-bench report: its name, load and latency figures."""
    (system, summary), *_ = report["systems"].items()
    return {
        "system": system,
        "tasks": summary["tasks"],
        "searches": summary["searches"],
        "searches_per_s": summary["searches_per_s"],
        "latency_ms": summary["latency_ms"],
        "refused_retried": summary.get("refused_retried", 0),
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


def plot_probes(ax: Any, samples: list[dict[str, Any]], style: str, color: str, label: str) -> None:
    """The probes' latency in seconds against time (a probe without one at 0)."""
    ax.plot(
        [s["t"] for s in samples],
        [s.get("probe_ms", 0) / 1000 for s in samples],
        style,
        color=color,
        label=label,
    )


def write_chart(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 6), sharex=True)
    for row, color in zip(rows, ("tab:gray", "tab:blue", "tab:green")):
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
        "# Autoscaling on CPU: 1 to 2 replicas (acare's pressure policy and Serve's default) vs a "
        "fixed single replica",
        "",
        f"`{a['config']}` with model `{a['model']}`, `acare agent-bench --endpoint` at "
        f"{a['agents']} agents on {a['tasks']} MuSiQue tasks (seed {a['seed']}, mode "
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
        halved = old["refusals_seen"] > 0 and new["refusals_seen"] <= old["refusals_seen"] / 2
        lines += [
            "",
            "Pressure policy vs Serve's default, same load step: second replica requested at "
            f"{new['t_adding_replica']} s vs {old['t_adding_replica']} s; first refusal at "
            f"{new['t_first_refusal_seen']} s vs {old['t_first_refusal_seen']} s; refusals "
            f"{new['refusals_seen']} vs {old['refusals_seen']}. Requested before the first "
            f"refusal: **{'yes' if before else 'no'}**; refusals at least halved: "
            f"**{'yes' if halved else 'no'}**.",
        ]
    lines += [
        "",
        "Times are seconds since the agents started. 'adding': Serve first showed a replica "
        "being added; 'start s': from then until it ran. 'first refusal': the first admission "
        "refusal of the agents' requests counted by a replica's `/v1/status` (the probes' own "
        "refusals left out).",
        *commands_block(result["commands"]),
    ]
    return "\n".join(lines) + "\n"


def add_load_flags(parser: argparse.ArgumentParser, tasks_help: str | None = None) -> None:
    """The flags of the agent load and the local cluster both cluster benchmarks run."""
    parser.add_argument("--tasks", type=int, default=16, help=tasks_help)
    parser.add_argument("--agents", type=int, default=16)
    parser.add_argument("--modes", default="M3")
    parser.add_argument("--depth", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cpus", type=int, default=2, help="CPUs of the local Ray cluster")
    parser.add_argument("--interval-s", type=float, default=1.0, help="status polling period")


def add_output_flags(parser: argparse.ArgumentParser, script: str, name: str) -> None:
    """Where a run works (``runs/<script>``) and writes its results (``<out>/<name>.*``)."""
    parser.add_argument("--work-dir", default=str(ROOT / "runs" / script))
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    parser.add_argument("--name", default=name)


def start_ray(cpus: int) -> None:
    """A local Ray cluster of ``cpus`` CPUs for the run (no dashboard, no usage stats)."""
    import ray

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(num_cpus=cpus, include_dashboard=False, log_to_driver=False)


def run_paths(args: argparse.Namespace) -> tuple[Path, Path, Path]:
    """``(work dir, results dir, serve config)`` of a run: both folders made, the config
    resolved against the repository root when relative."""
    work, out = Path(args.work_dir), Path(args.out)
    work.mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    config_path = Path(args.config)
    return work, out, config_path if config_path.is_absolute() else ROOT / config_path


def save_result(
    result: dict[str, Any],
    out: Path,
    name: str,
    markdown: Callable[[dict[str, Any]], str],
    write_chart: Callable[[Path], None],
) -> dict[str, Any]:
    """``<out>/<name>.json`` and ``.md`` (:func:`report.write_report`) and ``.png`` of a run's
    ``result``; returns ``result``."""
    write_report(result, out, name, markdown(result))
    write_chart(out / f"{name}.png")
    return result


def run_commands(script: str, argv: list[str] | None, args: argparse.Namespace) -> list[str]:
    """What a results file records as its commands: ``benchmarks/<script>`` with the run's
    flags (paths made public) and the agent-bench it ran against the served app."""
    argv_public = [public(a) for a in (argv if argv is not None else sys.argv[1:])]
    return [
        " ".join([f"python benchmarks/{script}", *argv_public]),
        "acare " + " ".join(agent_bench_command(args, "$URL", Path("$OUT"))[3:]),
    ]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="serve_configs/cpu-autoscale.yaml")
    parser.add_argument("--model", default=DEFAULT_MODEL, help="model id or checkpoint")
    add_load_flags(parser, tasks_help="MuSiQue tasks per phase")
    parser.add_argument(
        "--phases",
        default="fixed,autoscale-default,autoscale",
        help="fixed (one replica), autoscale-default (Serve's default policy), autoscale (the "
        "config's policy: acare's pressure policy)",
    )
    parser.add_argument("--settle-s", type=float, default=180, help="wait for scale-down")
    add_output_flags(parser, "bench_autoscale", "autoscale-cpu-minilm")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    import ray

    args = parse_args(argv)
    work, out, config_path = run_paths(args)
    config = resolved_config(config_path, args.model, free_port())
    configs = {
        "fixed": fixed_replicas(config, 1),
        "autoscale-default": default_policy(config),
        "autoscale": config,
    }
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
