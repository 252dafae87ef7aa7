"""``acare serve`` end to end: the real command starts the app and the Cohere client works."""

from __future__ import annotations

import signal
import subprocess
import sys

import cohere
import pytest

from acare_ray.testing import free_port, running, wait_for_health

pytestmark = pytest.mark.slow


def test_acare_serve_serves_the_cohere_client_and_stops_on_sigterm_with_exit_0(
    tiny_qwen3_dir, tmp_path
):
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
    env = {"RAY_USAGE_STATS_ENABLED": "0", "ACARE_API_KEY": ""}
    log = tmp_path / "serve.log"
    base = f"http://127.0.0.1:{port}"
    with running(command, log, env) as process:
        wait_for_health(base, process, log)
        co = cohere.ClientV2(api_key="unused", base_url=base)
        response = co.rerank(
            model="acare",
            query="capital population",
            documents=["Ostrava is the capital of Velmoria.", "Bananas are yellow."],
            request_options={"additional_body_parameters": {"reasoning": "Need the capital."}},
        )
        assert sorted(r.index for r in response.results) == [0, 1]
        assert response.meta.mode == "M1"
        # What a service manager or Kubernetes sends: Serve shuts down and the command exits 0
        # (Ray's own driver handler used to exit at once, without Serve's shutdown).
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0, log.read_text()[-3000:]
    assert "shutting down" in log.read_text()


def test_the_default_config_is_found_from_any_directory(tmp_path):
    """Issue 22: `acare serve` used a config path relative to the repository root, so it failed
    from any other directory."""
    import sys

    import yaml

    done = subprocess.run(
        [sys.executable, "-m", "acare_ray.cli", "serve", "--print-config", "--port", "8123"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    config = yaml.safe_load(done.stdout)
    assert config["http_options"]["port"] == 8123
    assert config["applications"][0]["import_path"].startswith("acare_ray.")


def test_sigterm_and_an_ignored_sigint_both_stop_the_app_as_ctrl_c_does():
    """A background job of a non-interactive shell starts with SIGINT ignored, and SIGTERM
    (a service manager's stop) ended the driver without Serve's shutdown; after
    ``stop_on_signals`` both raise KeyboardInterrupt, which ``serve run`` shuts down on."""
    import os
    import signal

    from acare_ray.online.cli import stop_on_signals

    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        stop_on_signals()
        for signum in (signal.SIGINT, signal.SIGTERM):
            with pytest.raises(KeyboardInterrupt):
                os.kill(os.getpid(), signum)
                signal.sigtimedwait([], 0)  # let the handler run before leaving the block
    finally:
        for signum, handler in saved.items():
            signal.signal(signum, handler)
