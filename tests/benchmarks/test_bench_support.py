"""What the offline benchmarks report about themselves: no machine paths in the command they
record, and a memory breakdown that names the processes it measured."""

import subprocess
import sys

import pytest
from benchmarks_import import BENCHMARKS, benchmark_modules


@pytest.fixture(scope="module")
def bench():
    with benchmark_modules("bench_offline", "bench_offline_scale") as modules:
        yield modules


def test_recorded_command_keeps_no_machine_path(bench):
    _, scale = bench
    argv = ["--sizes", "1000", "--model", "/data/runs/x/tiny-qwen3", "--work-dir", "/tmp/w"]
    argv += ["--out=/tmp/o", "--model=/a/b/ckpt", "--mode", "M3"]
    assert scale.public_argv(argv) == [
        "--sizes",
        "1000",
        "--model",
        "tiny-qwen3",
        "--model=ckpt",
        "--mode",
        "M3",
    ]
    hub_id = ["--model", "BAAI/bge-reranker-base"]
    assert scale.public_argv(hub_id) == hub_id


def test_tree_memory_breaks_the_peak_down_by_process(bench):
    offline, _ = bench
    script = "import time; b = b'x' * (80 * 2**20); print('ready', flush=True); time.sleep(60)"
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        kind = offline._label(child.pid)
        with offline.TreeMemory(interval=60) as memory:
            pass
    finally:
        child.kill()
        child.wait()
    # The child runs no script: its kind is its interpreter's name ("python", "python3", as
    # it was started); its 80 MB buffer is in that kind.
    assert kind.startswith("python") and " " not in kind
    assert memory.at_peak[kind] >= 75
    assert memory.peak_tree == pytest.approx(sum(memory.at_peak.values()), abs=1)
    assert memory.peak_self < memory.peak_tree


@pytest.mark.slow
def test_scale_benchmark_runs_end_to_end_at_a_tiny_size(tiny_qwen3_dir, tmp_path):
    """``bench_offline_scale.py`` as documented, at 40 searches: both methods measured, the
    report written without machine paths."""
    import json
    import os

    out = tmp_path / "report"
    argv = [sys.executable, "-m", "benchmarks.bench_offline_scale", "--sizes", "40"]
    argv += ["--model", str(tiny_qwen3_dir), "--work-dir", str(tmp_path / "w")]
    argv += ["--out", str(out), "--label", "smoke", "--batch-size", "8"]
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0")
    env.pop("RAY_ADDRESS", None)
    done = subprocess.run(
        argv, capture_output=True, text=True, timeout=600, env=env, cwd=BENCHMARKS.parent
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((out / "smoke.json").read_text())
    by_method = {r["method"]: r for r in report["results"]}
    assert set(by_method) == {"loop", "ray"}
    assert all(r["rows_written"] == 40 for r in by_method.values())
    assert by_method["ray"]["tree_at_peak_mb"]
    # Neither this test's folders nor the model's (both under pytest's base temp dir) show.
    assert str(tmp_path.parents[1]) not in (out / "smoke.json").read_text()
    assert (out / "smoke.md").is_file()
