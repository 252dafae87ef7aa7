"""A clone of the committed repository, with no folder beside it, runs its tests.

The clone sees only committed files, so a fixture that lives outside the repository (or is not
committed) fails here. It runs, with the clone's own code, no dataset (``ACARE_DATA_DIR``
points nowhere) and ``CI`` unset (dataset-dependent tests skip instead of failing), tests that
between them load every committed fixture from the clone:

- ``acare_ray/testing/fixtures/qwen3_tokenizer``: the prompt layout tests (``tests/scoring/test_prompt.py``) load
  it with ``AutoTokenizer``, and the tiny random Qwen3 of ``tiny_qwen3_dir`` is built with it
  (``acare_ray.testing.build_random_qwen3``), which a scorer test then loads and scores;
- ``acare_ray/testing/fixtures/model_configs/*/config.json``: the real Qwen3 layouts checked against the
  fast path, one test per config;
- ``tests/fixtures/kuberay_crds/*.yaml``: every KubeRay manifest is validated against the CRD
  of its kind (RayCluster, RayService, RayJob).

The rest of the scorer's tests read no fixture beyond the tiny model, so they are not run a
second time here.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
SUBSET = (
    "tests/scoring/test_prompt.py",
    "tests/infra/test_kuberay_manifests.py",
    "tests/scoring/test_causal_fallback.py::test_real_qwen3_configs_fit_the_fast_path",
    "tests/scoring/test_scorer.py::test_scores_are_float32_in_input_order",
)
CLEARED = ("CI", "ACARE_DATA_DIR", "PYTHONPATH")


@pytest.fixture(scope="module")
def clone(tmp_path_factory) -> Path:
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("needs git and a git checkout of the repository")
    root = tmp_path_factory.mktemp("self-contained")
    dest = root / "repo"
    subprocess.run(
        ["git", "clone", "--quiet", "--no-hardlinks", str(REPO), str(dest)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    assert not (dest.parent / "shared").exists()
    return dest


@pytest.fixture(scope="module")
def env(clone, tmp_path_factory) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in CLEARED}
    missing = tmp_path_factory.mktemp("no-data") / "absent"
    return env | {
        "PYTHONPATH": str(clone),
        "ACARE_DATA_DIR": str(missing),
        "HF_HUB_OFFLINE": "1",
        "RAY_USAGE_STATS_ENABLED": "0",
        "TOKENIZERS_PARALLELISM": "false",
    }


def test_the_clone_imports_its_own_package(clone, env):
    done = subprocess.run(
        [sys.executable, "-c", "import acare_ray; print(acare_ray.__file__)"],
        cwd=clone,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert Path(done.stdout.strip()).resolve().is_relative_to(clone.resolve())


def test_scorer_prompt_and_infra_tests_pass_in_the_clone(clone, env):
    """The SUBSET passes from the clone: a fixture missing from it fails its tests."""
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", *SUBSET],
        cwd=clone,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    output = done.stdout + done.stderr
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    assert done.returncode == 0, output[-5000:]
    assert "passed" in summary and "error" not in summary and "failed" not in summary, summary
    # The real-paragraph tokenization check needs MuSiQue: it skips and says where to point.
    assert "ACARE_DATA_DIR" in output, output[-5000:]
