"""The README's "any Ray cluster" path for real: ``ray start --head`` plus a second node with
``ray start --address``, then ``ray job submit --runtime-env jobs/<job>.yaml -- acare ...`` for
rerank, relabel, eval and train, and the serving steps (``serve deploy``, ``serve status``, the
README's ``cohere`` client).

Regression: the offline jobs exited 2 under ``ray job submit`` ("Failed to merge the Job's
runtime env ... with a ray.init's runtime env") because the driver set the job's env var keys
again. Ray 2.60's ``ray start --head`` turns on token auth; the CLIs then need
``RAY_AUTH_MODE=token`` (docs/cluster.md). The cluster gets its own temp dir and ports, and is
torn down by the processes it started (never ``ray stop``, which would stop every cluster on
the host).
"""

from __future__ import annotations

import math
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pyarrow.dataset as pads
import pytest
import yaml

from acare_ray.data.io import write_parquet
from acare_ray.data.synthetic import synthetic_searches
from acare_ray.testing import LocalRayCluster

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def cluster():
    import ray

    ray.shutdown()  # the shared in-process cluster of other modules
    with LocalRayCluster(head_cpus=2, worker_cpus=[1]) as local:
        yield local.address, local.env


@pytest.fixture(scope="module")
def searches(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("rc") / "searches.parquet"
    return write_parquet(synthetic_searches(3, seed=5), path)


def _submit(cluster, job: str, command: list[str]) -> subprocess.CompletedProcess:
    address, env = cluster
    argv = [str(BIN / "ray"), "job", "submit", "--address", address]
    argv += ["--runtime-env", str(REPO / "jobs" / f"{job}.yaml"), "--", *command]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600, cwd=REPO)


def _ok(argv: list[str], env: dict[str, str], timeout: float, **options: Any) -> str:
    """Runs ``argv`` with the cluster's ``env``; asserts that it exited 0 (the end of its output
    is the message) and returns its stdout."""
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout, **options)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    return done.stdout


def _rows(path: Path) -> list[dict]:
    return pads.dataset(str(path), format="parquet").to_table().to_pylist()


def test_two_nodes_joined(cluster):
    address, env = cluster
    nodes = [str(BIN / "ray"), "list", "nodes", "--address", address, "--format", "json"]
    assert _ok(nodes, env, 120).count('"state": "ALIVE"') == 2


@pytest.mark.parametrize("job", ["rerank", "relabel", "eval"])
def test_ray_job_submit_runs_the_offline_job(cluster, searches, tiny_qwen3_dir, tmp_path, job):
    rows_in = len(_rows(searches))
    common = ["--input", str(searches), "--model", str(tiny_qwen3_dir), "--actors", "1"]
    if job == "rerank":
        command = ["acare", "rerank", *common, "--output", str(tmp_path / "out"), "--mode", "M3"]
    elif job == "relabel":
        command = ["acare", "relabel", *common, "--output", str(tmp_path / "out")]
    else:
        command = ["acare", "eval", *common, "--modes", "M0,M3", "--resamples", "200"]
        command += ["--report-dir", str(tmp_path / "out")]
    result = _submit(cluster, job, command)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    assert "Failed to merge" not in result.stdout + result.stderr
    output = tmp_path / "out" / ("rerank" if job == "eval" else "")
    written = _rows(output)
    assert len(written) == rows_in * (2 if job == "eval" else 1)
    if job == "relabel":
        assert sum(r["status"] == "ok" for r in written) > 0
    else:
        assert all(r["error"] is None for r in written)
    if job == "eval":
        assert (tmp_path / "out" / "report.json").is_file()


def test_ray_job_submit_runs_training(cluster, tiny_qwen3_dir, tmp_path):
    """``ray job submit --runtime-env jobs/train.yaml -- acare train ...``: a Ray Train run on
    the two nodes whose final checkpoint loads and scores."""
    from acare_ray.data.synthetic import synthetic_groups
    from acare_ray.scoring import AgentContext, Scorer

    data = write_parquet(synthetic_groups(6, seed=2), tmp_path / "groups.parquet")
    command = ["acare", "train", "--data", str(data), "--model", str(tiny_qwen3_dir)]
    command += ["--output", str(tmp_path / "runs"), "--name", "rc", "--workers", "2"]
    command += ["--max-steps", "2", "--batch-groups", "1", "--grad-accum", "1"]
    command += ["--checkpoint-every", "2", "--no-eval-at-start", "--eval-modes", "M0"]
    result = _submit(cluster, "train", command)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    final = [line for line in result.stdout.splitlines() if line.startswith("final checkpoint:")]
    assert final, result.stdout[-3000:]
    checkpoint = Path(final[-1].split(":", 1)[1].strip())
    assert checkpoint.is_dir() and checkpoint.is_relative_to(tmp_path / "runs")
    scores = Scorer.from_pretrained(str(checkpoint), device="cpu").score(
        AgentContext(sub_query="capital population"),
        ["Ostrava is the capital of Velmoria.", "A painter."],
        "M0",
    )
    assert len(scores) == 2 and all(math.isfinite(s) for s in scores)


def _readme_python_client() -> str:
    text = (REPO / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    (block,) = [b for b in blocks if "cohere.ClientV2" in b]
    return block


def test_serve_deploy_status_and_the_cohere_client(cluster):
    """docs/cluster.md's serving steps with the CPU config: ``serve deploy``, ``serve status``
    until RUNNING, then the README's ``cohere`` client code against the proxy."""
    address, env = cluster
    serve = str(BIN / "serve")
    _ok([serve, "deploy", "serve_configs/local.yaml", "--address", address], env, 180, cwd=REPO)
    deadline, status = time.monotonic() + 300, ""
    while time.monotonic() < deadline:
        status = _ok([serve, "status", "--address", address], env, 120)
        parsed = yaml.safe_load(status) or {}
        app = (parsed.get("applications") or {}).get("acare") or {}
        if app.get("status") == "RUNNING":
            break
        assert app.get("status") != "DEPLOY_FAILED", status
        time.sleep(3)
    else:
        pytest.fail(f"the app did not reach RUNNING in 300 s:\n{status}")
    deployments = app["deployments"]
    assert deployments["Reranker"]["status"] == "HEALTHY", status
    port = yaml.safe_load((REPO / "serve_configs" / "local.yaml").read_text())["http_options"][
        "port"
    ]
    assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=30).status_code == 200
    code = _readme_python_client().replace("http://localhost:8000", f"http://127.0.0.1:{port}")
    namespace: dict = {}
    exec(compile(code, "README.md", "exec"), namespace)  # noqa: S102 - the README's own code
    response = namespace["response"]
    assert [r.index for r in response.results] and response.meta.mode == "M3"
    _ok([serve, "shutdown", "--yes", "--address", address], env, 180)
