"""requirements/image.lock: every runtime dependency pinned with hashes (issue 21, part 6).

Before the fix the image installed ``torch==2.13.*`` and the package's open ranges at build
time, so two builds of one commit could hold different code, and nothing checked a wheel
against a known digest. The lock pins every package (``==``) with sha256 hashes; the Dockerfile
installs it with ``--require-hashes`` (tests/infra/test_dockerfile.py).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from infra_support import REPO, dockerfile_args
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

LOCK = REPO / "requirements" / "image.lock"
INPUT = REPO / "requirements" / "image.in"
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
GENERATE = re.compile(
    r"^#\s+uv pip compile requirements/image\.in --generate-hashes --python-version 3\.12 "
    r"--python-platform x86_64-manylinux_2_28 --only-binary :all: -o requirements/image\.lock$",
    re.M,
)


def parse_lock(text: str) -> dict[str, tuple[str, list[str]]]:
    """name -> (version, hashes); every requirement line must be ``name==version``."""
    entries: dict[str, tuple[str, list[str]]] = {}
    joined = re.sub(r"\\\n\s*", " ", text)
    for line in joined.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        head, *options = line.split(" --hash=")
        match = re.fullmatch(r"([A-Za-z0-9_.\-]+)(\[[^\]]*\])?==([^\s;]+)", head.strip())
        assert match, f"not pinned with ==: {head!r}"
        hashes = [h.strip() for h in options]
        entries[canonicalize_name(match.group(1))] = (match.group(3), hashes)
    return entries


LOCKED = parse_lock(LOCK.read_text(encoding="utf-8"))


def test_every_locked_package_has_sha256_hashes():
    assert LOCKED
    for name, (_, hashes) in LOCKED.items():
        assert hashes, f"{name} has no --hash"
        for h in hashes:
            assert re.fullmatch(r"sha256:[0-9a-f]{64}", h), (name, h)


@pytest.mark.parametrize("spec", PYPROJECT["project"]["dependencies"])
def test_every_pyproject_runtime_dependency_is_locked_within_its_range(spec):
    requirement = Requirement(spec)
    name = canonicalize_name(requirement.name)
    assert name in LOCKED, f"{requirement.name} is not in {LOCK.name}"
    version = Version(LOCKED[name][0])
    assert requirement.specifier.contains(version, prereleases=True), (spec, version)


def test_the_lock_input_lists_every_pyproject_dependency():
    inputs = {
        canonicalize_name(Requirement(line).name)
        for line in INPUT.read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith("#")
    }
    wanted = {canonicalize_name(Requirement(s).name) for s in PYPROJECT["project"]["dependencies"]}
    assert wanted <= inputs, wanted - inputs


def test_ray_and_its_image_extras_are_locked_at_the_image_version():
    assert LOCKED["ray"][0] == dockerfile_args()["RAY_VERSION"]
    # ray[default] (dashboard, job server), [serve], [train]: some of what each extra pulls in.
    for name in ("aiohttp", "uvicorn", "fastapi", "tensorboardx", "setuptools"):
        assert canonicalize_name(name) in LOCKED, name


def test_torch_is_the_cuda_build():
    """PyPI's Linux torch wheel is the CUDA build: its CUDA runtime wheels must be locked."""
    assert "+" not in LOCKED["torch"][0], "a local-version torch (+cpu/+cuXXX) is not on PyPI"
    assert any(n.startswith("nvidia-cuda-runtime") for n in LOCKED), "no CUDA runtime in the lock"
    assert "triton" in LOCKED


def test_the_lock_says_how_it_was_generated():
    assert GENERATE.search(LOCK.read_text(encoding="utf-8"))


def test_a_lock_line_without_a_hash_or_pin_is_caught():
    with pytest.raises(AssertionError, match="not pinned"):
        parse_lock("torch>=2.7 \\\n    --hash=sha256:" + "0" * 64 + "\n")
    assert parse_lock("x==1\n") == {"x": ("1", [])}


def test_the_cluster_doc_gives_the_lock_command():
    text = (REPO / "docs" / "cluster.md").read_text(encoding="utf-8")
    command = GENERATE.search(LOCK.read_text(encoding="utf-8")).group(0).lstrip("# ").strip()
    assert command in text
    assert Path(LOCK).relative_to(REPO).as_posix() in text


def uv_executable() -> str | None:
    import shutil
    import sys

    return shutil.which("uv") or shutil.which("uv", path=str(Path(sys.executable).parent))


def test_the_documented_lock_command_reproduces_the_committed_lock(tmp_path):
    """Runs the docs' command (uv keeps the pins already in its output file, so the result
    equals the committed lock unless image.in changed without a regeneration). Needs uv (in
    the test extra, so `make test` has it) and access to PyPI (or uv's cache); skipped, with
    the reason, without them."""
    import shlex
    import shutil
    import subprocess

    uv = uv_executable()
    if uv is None:
        pytest.skip("uv is not installed (pip install uv)")
    out = tmp_path / "image.lock"
    shutil.copy(LOCK, out)
    command = GENERATE.search(LOCK.read_text(encoding="utf-8")).group(0).lstrip("# ").strip()
    argv = shlex.split(command)
    argv[argv.index("-o") + 1] = str(out)
    result = subprocess.run([uv, *argv[1:]], cwd=REPO, capture_output=True, text=True, timeout=600)
    if result.returncode != 0 and re.search(r"(?i)network|connect|dns|offline", result.stderr):
        pytest.skip(f"PyPI unreachable: {result.stderr.strip()[-300:]}")
    assert result.returncode == 0, result.stderr[-2000:]
    assert parse_lock(out.read_text(encoding="utf-8")) == LOCKED
