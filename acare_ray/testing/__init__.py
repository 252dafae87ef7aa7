"""Random-weight models with the real Qwen3 tokenizer, for tests and speed benchmarks.

These machines cannot download weights, so tests build a tiny random Qwen3, save it with
``save_pretrained`` and load it back through the same ``Scorer.from_pretrained`` users run.
The tokenizer and the real models' ``config.json`` files ship as package data
(``acare_ray/testing/fixtures/``, each folder with a SOURCE.md), so an installed package builds
the same tiny models as a source checkout.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

__all__ = [
    "HEALTH_CHECK_ENV",
    "LocalRayCluster",
    "build_random_qwen3",
    "deploy_serve_config",
    "fixture_path",
    "json_stub_server",
    "free_port",
    "free_ports",
    "model_config_path",
    "qwen3_tokenizer_dir",
    "replica_class",
    "running",
    "submit_serve_config",
    "wait_for_health",
    "wait_until",
]

FIXTURES = Path(__file__).resolve().parent / "fixtures"


def fixture_path(*parts: str) -> Path:
    """``acare_ray/testing/fixtures/<parts...>``; FileNotFoundError when it is not there."""
    path = FIXTURES.joinpath(*parts)
    if not path.exists():
        raise FileNotFoundError(f"test fixture {path} not found in the installed package")
    return path


def qwen3_tokenizer_dir() -> Path:
    """The real Qwen3 tokenizer (``acare_ray/testing/fixtures/qwen3_tokenizer``)."""
    return fixture_path("qwen3_tokenizer")


def model_config_path(name: str) -> Path:
    """``config.json`` of a real model by folder name, e.g. ``Qwen3-Reranker-0.6B``."""
    return fixture_path("model_configs", name, "config.json")


TINY_QWEN3 = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=8192,
    initializer_range=0.1,
)


def build_random_qwen3(
    out_dir: str | Path,
    seed: int = 0,
    base_config: str | None = None,
    dtype: torch.dtype = torch.float32,
    **overrides: Any,
) -> Path:
    """Save a random-weight Qwen3ForCausalLM + the real tokenizer to ``out_dir``.

    ``base_config``: a folder name under ``acare_ray/testing/fixtures/model_configs`` (e.g.
    ``Qwen3-Reranker-0.6B``) whose shapes to use; otherwise the tiny shapes above. ``overrides``
    change config fields (``num_hidden_layers=4`` for a shallower model of real width).
    """
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(qwen3_tokenizer_dir())
    if base_config:
        fields = json.loads(model_config_path(base_config).read_text())
        fields = {
            k: v
            for k, v in fields.items()
            if k not in ("architectures", "torch_dtype", "transformers_version")
        }
    else:
        fields = dict(TINY_QWEN3, vocab_size=len(tokenizer), tie_word_embeddings=True)
    fields.update(overrides)
    config = Qwen3Config(**fields)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(config).to(dtype)
    out = Path(out_dir)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def replica_class() -> type:
    """The Serve replica's own class (``serve.ingress`` wraps ``Reranker`` in a class whose
    ``__init__`` is async), to build a replica in-process with ``cls.__init__(obj, args)``."""
    import inspect

    from acare_ray.online.deployment import Reranker

    (own,) = [
        k
        for k in Reranker.func_or_class.__mro__
        if "__init__" in vars(k)
        and k.__module__ == "acare_ray.online.deployment"
        and not inspect.iscoroutinefunction(k.__init__)
    ]
    return own


def free_ports(n: int) -> list[int]:
    """``n`` distinct TCP ports free on 127.0.0.1 at the time of the call.

    All ``n`` sockets are held open together, so the ports differ; they are closed before
    returning, so another process may take one before the caller binds it (rare on one host).
    """
    sockets, ports = [], []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        sockets.append(s)
        ports.append(s.getsockname()[1])
    for s in sockets:
        s.close()
    return ports


def free_port() -> int:
    """A TCP port free on 127.0.0.1 at the time of the call (see :func:`free_ports`)."""
    return free_ports(1)[0]


@contextlib.contextmanager
def running(
    command: list[str], log: Path, env: Mapping[str, str] | None = None
) -> Iterator[subprocess.Popen]:
    """``command`` running with its output in ``log``; stopped on exit as Ctrl-C stops it.

    ``env`` is added to this process's environment. The command starts with SIGINT ignored,
    as a script's ``command &`` starts it (the harder case for a server to stop on). On exit
    it gets SIGINT (what ``acare serve`` and ``acare mcp`` shut down on); one still running
    90 s later is killed and fails the caller: a server that ignores Ctrl-C is a defect, not
    a slow teardown.
    """
    with Path(log).open("w") as out:
        process = subprocess.Popen(
            command,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=os.environ | dict(env or {}),
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
        )
        try:
            yield process
        finally:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(timeout=90)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
                raise AssertionError(
                    f"{command[:4]} did not stop within 90 s of SIGINT; log: {log}"
                ) from None


def wait_until(
    check: Callable[[], bool],
    process: subprocess.Popen,
    log: Path,
    what: str,
    timeout_s: float = 300,
) -> None:
    """Call ``check`` each second until it is true; fail with the end of ``log`` when
    ``process`` exits first or ``timeout_s`` passes. An ``httpx.HTTPError`` from ``check``
    (the server not listening yet) counts as not ready."""
    import httpx
    import pytest

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert process.poll() is None, Path(log).read_text()[-3000:]
        with contextlib.suppress(httpx.HTTPError):
            if check():
                return
        time.sleep(1)
    pytest.fail(f"{what} not ready in {timeout_s} s: {Path(log).read_text()[-2000:]}")


def wait_for_health(
    base: str, process: subprocess.Popen, log: Path, timeout_s: float = 240
) -> None:
    """:func:`wait_until` ``GET {base}/health`` answers 200 (an ``acare serve`` app is up)."""
    import httpx

    wait_until(
        lambda: httpx.get(f"{base}/health", timeout=2).status_code == 200,
        process,
        log,
        "acare serve",
        timeout_s,
    )


@contextlib.contextmanager
def json_stub_server(
    answer: Callable[[str, Any], tuple[int, Any, Mapping[str, str]]],
) -> Iterator[str]:
    """A stand-in JSON server (stdlib, a thread, a free local port); yields its base URL.

    Every POST gets ``answer(path, parsed JSON body)``, which returns ``(status, JSON payload,
    extra headers)``. The server is shut down on exit.
    """
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            status, payload, headers = answer(self.path, body)
            data = json.dumps(payload).encode()
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()


def submit_serve_config(config: dict[str, Any]) -> None:
    """What ``serve deploy`` does with a config file, on the Ray cluster this process is
    connected to: start Serve with the config's HTTP options if it is not running, then submit
    every application (an in-place update of the ones that exist; the others are removed)."""
    from ray.serve._private.api import serve_start
    from ray.serve.schema import ServeDeploySchema

    client = serve_start(
        http_options=config["http_options"], proxy_location=config["proxy_location"]
    )
    client.deploy_apps(ServeDeploySchema.model_validate(config))


def deploy_serve_config(config: dict[str, Any], timeout_s: float = 300) -> None:
    """:func:`submit_serve_config`, then wait until every application of ``config`` is RUNNING
    and each of its deployments HEALTHY; an AssertionError with the app's message when one
    fails to deploy, TimeoutError after ``timeout_s``."""
    from ray import serve

    names = {app["name"] for app in config["applications"]}
    submit_serve_config(config)
    deadline = time.monotonic() + timeout_s
    states: dict[str, str] = {}
    while time.monotonic() < deadline:
        apps = serve.status().applications
        states = {name: apps[name].status if name in apps else "NOT_STARTED" for name in names}
        failed = [n for n, state in states.items() if state == "DEPLOY_FAILED"]
        assert not failed, f"deploy failed: {[apps[n].message for n in failed]}"
        if set(states.values()) == {"RUNNING"} and all(
            apps[n].deployments and all(d.status == "HEALTHY" for d in apps[n].deployments.values())
            for n in names
        ):
            return
        time.sleep(0.5)
    raise TimeoutError(f"apps not running after {timeout_s}s: {states}")


# Tolerate ~3 minutes of missed node health checks (Ray's defaults: 10 s timeout, 5 misses).
HEALTH_CHECK_ENV = {
    "RAY_health_check_timeout_ms": "30000",
    "RAY_health_check_failure_threshold": "6",
}


class LocalRayCluster:
    """A real multi-node Ray cluster on this host: ``ray start --head`` plus one
    ``ray start --address`` per entry of ``worker_cpus``, each node with its own CPUs.

    The cluster gets its own temp dir and ports, so it never meets another cluster on the host,
    and is torn down by signalling the processes it started (never ``ray stop``, which would
    stop every cluster on the host). Ray 2.60's ``ray start --head`` turns on token auth:
    ``env`` carries ``RAY_AUTH_MODE=token`` for the Jobs/Serve CLIs. ``address`` is the
    dashboard (Jobs API) address, ``gcs_address`` what ``ray.init(address=...)`` takes,
    ``metrics_port`` the head's ``--metrics-export-port`` (Prometheus endpoint ``/metrics``).

        with LocalRayCluster(head_cpus=2, worker_cpus=[1]) as cluster:
            subprocess.run(["ray", "job", "submit", "--address", cluster.address, ...],
                           env=cluster.env)
    """

    _NODE_PORTS = (
        "node-manager-port",
        "object-manager-port",
        "dashboard-agent-listen-port",
        "dashboard-agent-grpc-port",
        "metrics-export-port",
        "runtime-env-agent-port",
    )

    def __init__(self, head_cpus: int = 2, worker_cpus: tuple[int, ...] | list[int] = (1,)):
        self.head_cpus, self.worker_cpus = head_cpus, list(worker_cpus)
        self.ray = str(Path(sys.executable).parent / "ray")
        self.temp: Path | None = None
        self.address = self.gcs_address = ""
        self.metrics_port = 0
        self.env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="token")
        self.env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{self.env.get('PATH', '')}"
        self.env.pop("RAY_ADDRESS", None)
        # A loaded small host can stall a raylet for longer than Ray's default health check
        # tolerates (about 15 s), and the GCS then declares a healthy node dead mid-job. Every
        # process of the cluster reads its RayConfig from these RAY_<name> variables.
        self.env.update(HEALTH_CHECK_ENV)

    def _node_flags(self, index: int) -> list[str]:
        ports = free_ports(len(self._NODE_PORTS))
        flags = [f"--{name}={port}" for name, port in zip(self._NODE_PORTS, ports)]
        if index == 0:
            self.metrics_port = ports[self._NODE_PORTS.index("metrics-export-port")]
        # Disjoint worker port ranges per node (20000-20999, 21000-21999, ...).
        return (
            flags
            + [f"--min-worker-port={20000 + 1000 * index}"]
            + [
                f"--max-worker-port={20999 + 1000 * index}",
                "--disable-usage-stats",
            ]
        )

    def _ray(self, *argv: str, timeout: float = 180) -> subprocess.CompletedProcess:
        return subprocess.run(
            [self.ray, *argv], env=self.env, capture_output=True, text=True, timeout=timeout
        )

    def start(self) -> LocalRayCluster:
        self.temp = Path(tempfile.mkdtemp(prefix="acare-cluster-", dir="/tmp"))
        gcs, dashboard = free_ports(2)
        head = ["start", "--head", f"--port={gcs}", f"--num-cpus={self.head_cpus}"]
        head += ["--include-dashboard=true", f"--dashboard-port={dashboard}"]
        head += [f"--temp-dir={self.temp}", *self._node_flags(0)]
        steps = [head] + [
            ["start", f"--address=127.0.0.1:{gcs}", f"--num-cpus={cpus}", *self._node_flags(i)]
            for i, cpus in enumerate(self.worker_cpus, start=1)
        ]
        for argv in steps:
            done = self._ray(*argv)
            if done.returncode != 0:
                self.stop()
                raise RuntimeError(f"ray {' '.join(argv[:2])} failed:\n{done.stderr[-3000:]}")
        self.gcs_address = f"127.0.0.1:{gcs}"
        self.address = f"http://127.0.0.1:{dashboard}"
        deadline = time.monotonic() + 120
        # The job agent answers some seconds after `ray start` returns.
        while self._ray("job", "list", "--address", self.address, timeout=60).returncode != 0:
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("the Ray Jobs API did not answer within 120 s")
            time.sleep(3)
        return self

    def _signal(self, sig: int) -> None:
        # Every process of the cluster has its temp dir in its command line.
        out = subprocess.run(["pgrep", "-f", str(self.temp)], capture_output=True, text=True)
        for pid in map(int, out.stdout.split()):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)

    def stop(self) -> None:
        if self.temp is None:
            return
        self._signal(signal.SIGTERM)
        time.sleep(3)
        self._signal(signal.SIGKILL)
        shutil.rmtree(self.temp, ignore_errors=True)
        self.temp = None

    def __enter__(self) -> LocalRayCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
