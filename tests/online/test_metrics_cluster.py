"""Issue 23.1 on a real cluster: ``ray start --head --metrics-export-port``, the app deployed
with ``serve deploy``, a few requests of known sizes, then the Prometheus endpoint scraped and
parsed (``prometheus_client``): every counter moved by exactly what the requests did.

Two applications of the tiny Qwen3, each with its own ``served_model_name`` (the ``model``
label): ``main`` at ``/`` and ``slow`` at ``/slow``, whose batches wait ``SLOW_WAIT_S`` for
requests that never come and whose admission assumes 1 token/s, so a second request sent while
the first waits is refused (503) deterministically. Ray exports metrics with a delay: the test
polls the scrape until the expected values appear (a deadline for the export, not a timing
assertion). The cluster has its own temp dir and ports and is torn down by its processes
(:class:`~acare_ray.testing.LocalRayCluster`, never ``ray stop``).
"""

from __future__ import annotations

import copy
import re
import shlex
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest
import yaml
from online_support import local_serve_config
from prometheus_client.parser import text_string_to_metric_families

from acare_ray.online.metrics import SERVE_METRICS, exported_names
from acare_ray.testing import LocalRayCluster, free_port

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
MAIN, SLOW = "tiny-main", "tiny-slow"
SLOW_WAIT_S = 8.0
MAX_BATCH_TOKENS = 32768
EXPORT_DEADLINE_S = 240
DOCUMENTS = ["Ostrava is the capital of Velmoria.", "Paris.", "Velmoria is a small country."]
LONG = "word " * 200
FULL = {"original_question": "Where is Ostrava?", "reasoning": "It is a capital city."}


def serve_config(model: Path, port: int) -> dict:
    config, main = local_serve_config(model, port, "main")
    main["args"]["served_model_name"] = MAIN
    main["deployments"][0]["user_config"]["max_batch_tokens"] = MAX_BATCH_TOKENS
    slow = copy.deepcopy(main)
    slow.update(name="slow", route_prefix="/slow")
    slow["args"]["served_model_name"] = SLOW
    slow["deployments"][0]["user_config"] = {
        "max_batch_size": 8,
        "batch_wait_timeout_s": SLOW_WAIT_S,
        "admission_deadline_s": 1.0,
        "admission_prior_tokens_per_s": 1.0,
        # Keep the prior: a throughput measured at start would admit what this app must refuse.
        "admission_measure_at_start": False,
        "client_share": 1.0,
    }
    config["applications"] = [main, slow]
    return config


def run(cluster: LocalRayCluster, *argv: str, timeout: float = 180) -> str:
    done = subprocess.run(
        [str(BIN / argv[0]), *argv[1:]],
        env=cluster.env,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    return done.stdout


@pytest.fixture(scope="module")
def cluster():
    import ray

    ray.shutdown()  # the shared in-process cluster of other modules: its CPUs back
    local = LocalRayCluster(head_cpus=2, worker_cpus=[])
    local.env["RAY_AUTH_MODE"] = "token"
    # Workers send their metrics to the node's agent every second (default 10 s).
    local.env["RAY_metrics_report_interval_ms"] = "1000"
    with local:
        yield local


@pytest.fixture(scope="module")
def served(cluster, tiny_qwen3_dir, tmp_path_factory) -> str:
    config = serve_config(tiny_qwen3_dir, free_port())
    path = tmp_path_factory.mktemp("metrics") / "serve.yaml"
    path.write_text(yaml.safe_dump(config))
    run(cluster, "serve", "deploy", str(path), "--address", cluster.address)
    deadline, status = time.monotonic() + 300, {}
    while time.monotonic() < deadline:
        status = yaml.safe_load(run(cluster, "serve", "status", "--address", cluster.address))
        apps = status.get("applications") or {}
        states = {name: (apps.get(name) or {}).get("status") for name in ("main", "slow")}
        assert "DEPLOY_FAILED" not in states.values(), status
        if set(states.values()) == {"RUNNING"}:
            break
        time.sleep(3)
    else:
        pytest.fail(f"apps not running after 300 s: {status}")
    return f"http://127.0.0.1:{config['http_options']['port']}"


def scrape(port: int) -> list:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=30).text
    return [s for family in text_string_to_metric_families(text) for s in family.samples]


def total(samples, name: str, **labels: str) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels`` (all replicas)."""
    return sum(
        s.value
        for s in samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    )


def wait_for(port: int, expected: dict[tuple, float], baseline: list, names=frozenset()) -> list:
    """Scrape until every ``(name, labels)`` moved by its expected delta from ``baseline`` and
    every metric in ``names`` is exported (Serve's controller gauges arrive on their own
    schedule); the last scrape either way (the caller asserts)."""
    deadline = time.monotonic() + EXPORT_DEADLINE_S
    while True:
        samples = scrape(port)
        moved = {
            key: total(samples, key[0], **dict(key[1])) - total(baseline, key[0], **dict(key[1]))
            for key in expected
        }
        present = names <= {s.name for s in samples}
        if (moved == expected and present) or time.monotonic() > deadline:
            return samples
        time.sleep(2)


def key(name: str, **labels: str) -> tuple:
    return name, tuple(sorted(labels.items()))


def test_counters_move_by_exactly_what_the_requests_did(cluster, served):
    port = cluster.metrics_port
    baseline = scrape(port)
    http = httpx.Client(base_url=served, timeout=120)
    sent: Counter = Counter()  # (model, route, status class, mode) -> requests
    tokens: Counter = Counter()  # (model, mode) -> tokens

    def send(model: str, method: str, path: str, want: int, mode: str, route: str, **kw):
        response = http.request(method, path, **kw)
        assert response.status_code == want, response.text
        sent[(model, route, f"{want // 100}xx", mode)] += 1
        if want == 200 and "x-acare-tokens" in response.headers:
            tokens[(model, mode)] += int(response.headers["x-acare-tokens"])
        return response

    body = {"query": "capital", "documents": DOCUMENTS, **FULL}
    send(MAIN, "POST", "/v2/rerank", 200, "M3", "/v2/rerank", json=body)
    cut = {"query": "capital", "documents": [LONG, "Paris.", LONG], "max_tokens_per_doc": 16}
    truncated = send(MAIN, "POST", "/v2/rerank", 200, "M0", "/v2/rerank", json=cut | {"mode": "M0"})
    assert truncated.headers["x-acare-truncated-count"] == "2"
    empty = {"query": "capital", "documents": ["", "x"]}
    send(MAIN, "POST", "/v1/rerank", 422, "none", "/v1/rerank", json=empty)
    send(MAIN, "GET", "/v1/models", 200, "none", "/v1/models")
    send(MAIN, "GET", "/no/such/path", 404, "none", "other")

    # slow: A waits in its batch; once admission counts it, B is refused (503) at once.
    small = {"query": "capital", "documents": DOCUMENTS[:2], "mode": "M0"}
    first: dict = {}
    waiting = threading.Thread(
        target=lambda: first.update(r=http.post("/slow/v1/rerank", json=small))
    )
    waiting.start()
    polls, queued = 0, 0
    while queued == 0:
        polls += 1
        status = http.get("/slow/v1/status")
        assert status.status_code == 200
        queued = status.json()["admission"]["queued_requests"]
        assert polls < 200 and waiting.is_alive(), "A never queued"
    sent[(SLOW, "/v1/status", "2xx", "none")] += polls
    refused = http.post("/slow/v1/rerank", json=small)
    assert refused.status_code == 503, refused.text
    sent[(SLOW, "/v1/rerank", "5xx", "none")] += 1
    waiting.join(timeout=120)
    assert first["r"].status_code == 200, first["r"].text
    sent[(SLOW, "/v1/rerank", "2xx", "M0")] += 1
    tokens[(SLOW, "M0")] += int(first["r"].headers["x-acare-tokens"])

    expected = {
        key("ray_acare_requests_total", model=m, route=r, status_class=c, mode=md): float(n)
        for (m, r, c, md), n in sent.items()
    }
    expected |= {
        key("ray_acare_tokens_total", model=m, mode=md): float(n) for (m, md), n in tokens.items()
    }
    expected |= {
        key("ray_acare_documents_total", model=MAIN, mode="M3"): 3.0,
        key("ray_acare_documents_total", model=MAIN, mode="M0"): 3.0,
        key("ray_acare_documents_total", model=SLOW, mode="M0"): 2.0,
        key("ray_acare_truncated_total", model=MAIN, mode="M0"): 2.0,
        key("ray_acare_truncated_total", model=SLOW): 0.0,
        key("ray_acare_refusals_total", model=SLOW, reason="deadline"): 1.0,
        key("ray_acare_refusals_total", model=MAIN): 0.0,
        key("ray_acare_batches_total", model=MAIN): 2.0,
        key("ray_acare_batches_total", model=SLOW): 1.0,
        key("ray_acare_queue_wait_seconds_count", model=MAIN): 2.0,
        key("ray_acare_queue_wait_seconds_count", model=SLOW): 1.0,
        # A waited its whole batch window: nothing under 5 s.
        key("ray_acare_queue_wait_seconds_bucket", model=SLOW, le="5.0"): 0.0,
        key("ray_acare_batch_pairs_count", model=MAIN): 2.0,
        key("ray_acare_batch_pairs_bucket", model=MAIN, le="2.0"): 0.0,
        key("ray_acare_batch_pairs_bucket", model=MAIN, le="4.0"): 2.0,
        key("ray_acare_batch_requests_bucket", model=MAIN, le="1.0"): 2.0,
        key("ray_acare_batch_tokens_count", model=SLOW): 1.0,
        key("ray_acare_batch_seconds_count", model=MAIN): 2.0,
        # Two small requests alone in their batches: far under a tenth of max_batch_tokens.
        key("ray_acare_batch_fill_bucket", model=MAIN, le="0.05"): 2.0,
        key("ray_acare_request_seconds_count", model=MAIN): 5.0,
        key("ray_acare_request_seconds_count", model=SLOW): float(polls + 2),
    }
    samples = wait_for(port, expected, baseline, exported_names() | SERVE_METRICS)
    moved = {
        k: total(samples, k[0], **dict(k[1])) - total(baseline, k[0], **dict(k[1]))
        for k in expected
    }
    assert moved == expected
    # The names the dashboard and the alerts may use are the names Ray really exports.
    names = {s.name for s in samples}
    assert exported_names() | SERVE_METRICS <= names, sorted(
        (exported_names() | SERVE_METRICS) - names
    )
    assert "ray_serve_num_http_error_requests_total" in names  # docs/online.md names it
    for s in samples:
        if s.name in exported_names():
            assert s.labels.get("model") in (MAIN, SLOW), s
            assert s.labels.get("route", "/") in {
                "/v2/rerank",
                "/v1/rerank",
                "/v1/models",
                "/v1/status",
                "other",
            } | {"/"}, s


def test_the_documented_scrape_command_runs(cluster, served):
    """docs/online.md's metrics block: the ``ray start`` line names the flag this cluster's
    head was started with, and the ``curl`` line, run against it, finds the app's counter."""
    text = (REPO / "docs" / "online.md").read_text()
    (block,) = [
        b for b in re.findall(r"```bash\n(.*?)```", text, flags=re.S) if "metrics-export-port" in b
    ]
    lines = [line.strip() for line in block.splitlines() if line.strip()]
    start = shlex.split(lines[0])
    assert start[:3] == ["ray", "start", "--head"] and start[3].startswith("--metrics-export-port=")
    documented = start[3].split("=", 1)[1]
    ran = subprocess.run(["pgrep", "-af", str(cluster.temp)], capture_output=True, text=True).stdout
    assert f"--metrics-export-port={cluster.metrics_port}" in ran
    (scrape_line,) = [line for line in lines[1:] if line.startswith("curl")]
    command = scrape_line.replace(f":{documented}/", f":{cluster.metrics_port}/")
    deadline = time.monotonic() + EXPORT_DEADLINE_S
    while True:
        done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=60)
        if done.returncode == 0 or time.monotonic() > deadline:
            break
        time.sleep(2)
    assert done.returncode == 0, done.stderr
    assert re.search(r'^ray_acare_requests_total\{.*model="tiny-main"', done.stdout, re.M)
