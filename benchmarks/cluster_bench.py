"""The harness of the benchmarks that drive a Serve app on a local Ray cluster with agent load
(``bench_autoscale.py``, ``bench_rollout.py``): the resolved Serve config, the deploy (what
``serve deploy`` does), a monitor of replica states and probe latency, the ``acare agent-bench
--endpoint`` command a user would run, the common flags and the result files
(:func:`report.write_report`).
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
from pathlib import Path
from typing import Any

import httpx

from benchmarks.report import write_report

ROOT = Path(__file__).resolve().parents[1]
APP = "acare"
PROBE = {
    "query": "capital population",
    "documents": [
        f"Paragraph {i}: the capital of Velmoria has {i} million people." for i in range(5)
    ],
    "mode": "M0",
}


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
        *(["--ramp-s", f"{args.ramp_s:g}"] if getattr(args, "ramp_s", 0) else []),
        "--out",
        str(out),
    ]


def run_agent_bench(command: list[str], log) -> dict[str, Any]:
    """The agent-bench run's report; raises if it failed (a search that failed for good)."""
    print(" ".join(command), file=log, flush=True)
    subprocess.run(command, check=True, stdout=log, stderr=log)
    out = Path(command[command.index("--out") + 1])
    return json.loads((out / "agent_bench.json").read_text())


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


def plot_probes(ax: Any, samples: list[dict[str, Any]], style: str, color: str, label: str) -> None:
    """The probes' latency in seconds against time (a probe without one at 0)."""
    ax.plot(
        [s["t"] for s in samples],
        [s.get("probe_ms", 0) / 1000 for s in samples],
        style,
        color=color,
        label=label,
    )


def add_load_flags(parser: argparse.ArgumentParser, tasks_help: str | None = None) -> None:
    """The flags of the agent load and the local cluster both cluster benchmarks run."""
    parser.add_argument("--tasks", type=int, default=16, help=tasks_help)
    parser.add_argument("--agents", type=int, default=16)
    parser.add_argument(
        "--ramp-s", type=float, default=0.0, help="start the agents over this many seconds"
    )
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


def start_ray(cpus: int, gpus: int | None = None) -> float:
    """A local Ray cluster of ``cpus`` CPUs (and ``gpus``) for the run, as every benchmark
    starts one: no dashboard, no usage stats, no progress bars, tokenizers single-threaded in
    the workers (Ray gives each worker its CPUs). Returns the seconds ``ray.init`` took, which
    benchmarks report apart from what they time."""
    import ray

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    started = time.perf_counter()
    ray.init(
        num_cpus=cpus,
        num_gpus=gpus,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"TOKENIZERS_PARALLELISM": "false"}},
    )
    ray.data.DataContext.get_current().enable_progress_bars = False
    return time.perf_counter() - started


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
    """What a results file records as its commands: ``python -m benchmarks.<script>`` with the run's
    flags (paths made public) and the agent-bench it ran against the served app."""
    argv_public = [public(a) for a in (argv if argv is not None else sys.argv[1:])]
    return [
        " ".join([f"python -m benchmarks.{script.removesuffix('.py')}", *argv_public]),
        "acare " + " ".join(agent_bench_command(args, "$URL", Path("$OUT"))[3:]),
    ]
