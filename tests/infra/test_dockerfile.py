"""The image recipe: CUDA base, every package from the hashed lock, the package and Ray installed,
and every file it copies present in the repository and let through the build-context filter."""

from __future__ import annotations

import fnmatch
import re
import shlex
from pathlib import Path

import pytest
from infra_support import DOCKERFILE, REPO, dockerfile_args, dockerfile_instructions

IGNORE_FILE = DOCKERFILE.with_name(DOCKERFILE.name + ".dockerignore")
INSTRUCTIONS = dockerfile_instructions()
ARGS = dockerfile_args()


def runs() -> list[str]:
    return [rest for word, rest in INSTRUCTIONS if word == "RUN"]


def copy_sources() -> list[str]:
    sources = []
    for word, rest in INSTRUCTIONS:
        if word == "COPY":
            parts = [p for p in shlex.split(rest) if not p.startswith("--")]
            sources.extend(parts[:-1])
    return sources


def excluded_by_context_filter(path: str, patterns: list[str]) -> bool:
    """Docker's rule: the last pattern matching the path or one of its parents decides."""
    candidates = [path] + [str(p) for p in Path(path).parents if str(p) != "."]
    excluded = False
    for pattern in patterns:
        negated = pattern.startswith("!")
        pattern = pattern.lstrip("!").rstrip("/")
        if any(fnmatch.fnmatchcase(c, pattern) for c in candidates):
            excluded = not negated
    return excluded


def test_base_image_is_cuda():
    base = next(rest for word, rest in INSTRUCTIONS if word == "FROM")
    resolved = re.sub(r"\$\{(\w+)\}", lambda m: ARGS[m.group(1)], base)
    assert resolved.startswith("nvidia/cuda:"), resolved


def test_every_package_is_installed_from_the_hashed_lock_before_the_package():
    """Issue 21 part 6: the image installed torch and Ray unpinned, with no hashes."""
    pip_runs = [r for r in runs() if "pip install" in r]
    assert pip_runs, runs()
    locked = [r for r in pip_runs if "-r requirements/image.lock" in r]
    assert len(locked) == 1, pip_runs
    assert "--require-hashes" in locked[0] and "--only-binary :all:" in locked[0]
    others = [r for r in pip_runs if r is not locked[0]]
    for run in others:
        # Anything installed after the lock may not pull dependencies or build tools.
        assert "--no-deps" in run and "--no-build-isolation" in run, run
    assert pip_runs.index(locked[0]) == 0, "the lock must be installed first"
    package = [r for r in others if re.search(r"pip install (--[\w-]+ )*\.( |$)", r)]
    assert len(package) == 1, others


def test_the_image_checks_its_ray_version():
    (package,) = [r for r in runs() if "ray.__version__" in r]
    assert "${RAY_VERSION}" in package


def ignore_patterns() -> list[str]:
    lines = IGNORE_FILE.read_text(encoding="utf-8").splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


@pytest.mark.parametrize("source", copy_sources())
def test_copied_paths_exist_and_pass_the_context_filter(source):
    assert (REPO / source).exists(), f"COPY {source}: not in the repository"
    assert not excluded_by_context_filter(source, ignore_patterns()), (
        f"{IGNORE_FILE.name} drops {source}"
    )


@pytest.mark.parametrize("path", [".venv/bin/python", ".git/HEAD", "acare_ray/__pycache__/x.pyc"])
def test_context_filter_keeps_local_state_out_of_the_image(path):
    assert excluded_by_context_filter(path, ignore_patterns())


def test_build_command_is_documented():
    command = "docker build -f infra/docker/Dockerfile"
    assert command in DOCKERFILE.read_text(encoding="utf-8")
    assert command in (REPO / "docs" / "cluster.md").read_text(encoding="utf-8")
