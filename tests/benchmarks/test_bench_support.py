"""What the offline benchmarks report about themselves: no machine paths in the command they
record, and a memory breakdown that names the processes it measured."""

import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import bench_offline
        import bench_offline_scale

        yield bench_offline, bench_offline_scale
    finally:
        sys.path.remove(str(BENCHMARKS))


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
        with offline.TreeMemory(interval=60) as memory:
            pass
    finally:
        child.kill()
        child.wait()
    # The child runs no script: its kind is "python"; its 80 MB buffer is in it.
    assert memory.at_peak["python"] >= 75
    assert memory.peak_tree == pytest.approx(sum(memory.at_peak.values()), abs=1)
    assert memory.peak_self < memory.peak_tree
