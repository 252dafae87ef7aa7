"""``agent-bench --endpoint`` against a real ``acare serve`` app (Ray Serve): the same per-task
results as the same model in-process."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest

from acare_ray.agent.rerankers import EndpointReranker, ScorerReranker
from acare_ray.agent.simulate import run_sessions
from acare_ray.agent.tasks import build_tasks, select_records
from acare_ray.data.io import data_dir
from acare_ray.fusion import FusionConfig

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def served(tiny_qwen3_dir, tmp_path):
    """``acare serve --model <tiny Qwen3>`` on a free port; yields its base URL."""
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "acare_ray.cli",
        "serve",
        "--model",
        str(tiny_qwen3_dir),
        "--port",
        str(port),
        "--address",
        "local",
    ]
    env = os.environ | {"RAY_USAGE_STATS_ENABLED": "0", "ACARE_API_KEY": ""}
    log_path = tmp_path / "serve.log"
    log = log_path.open("w")
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            assert process.poll() is None, log_path.read_text()[-3000:]
            try:
                if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(1)
        else:
            pytest.fail("acare serve did not answer /health in 240 s")
        yield base
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=90)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


def test_endpoint_gives_the_same_per_task_results_as_in_process(served, require_data, tiny_scorer):
    from acare_ray.data.musique import load_musique

    require_data(data_dir() / "musique")
    tasks, corpus = build_tasks(select_records(load_musique(), 4, seed=0))
    # The fused system (issue 20 part 2f): the endpoint gets the BM25 scores and fuses them.
    for mode, fusion in (("M0", None), ("M3", None), ("M3", "rrf:k=5,weight=0.5")):
        config = FusionConfig.parse(fusion) if fusion else None
        local, _ = run_sessions(tasks, corpus, ScorerReranker(tiny_scorer, mode, fusion=config))
        remote = EndpointReranker(served, mode=mode, fusion=fusion)
        try:
            one, _ = run_sessions(tasks, corpus, remote, agents=1)
            four, _ = run_sessions(tasks, corpus, remote, agents=4)
        finally:
            remote.close()
        expected = [r.outcome() for r in local]
        assert [r.outcome() for r in one] == expected, mode
        assert [r.outcome() for r in four] == expected, mode
