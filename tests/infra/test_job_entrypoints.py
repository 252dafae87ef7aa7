"""Every job entrypoint (RayJob manifests and jobs/*.yaml specs) parses with the real ``acare`` CLI.

An entrypoint is split with shlex, its leading ``acare`` (or ``python -m acare_ray.cli``) is
stripped, and the rest goes through ``acare_ray.cli.build_parser().parse_args``: a renamed or
removed flag fails here, not on the cluster.
"""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml
from infra_support import KUBERAY, REPO, load_yaml_documents
from ray.runtime_env import RuntimeEnv

from acare_ray.cli import build_parser

JOB_COMMANDS = ("rerank", "relabel", "eval", "train")
CLI_PREFIXES = (["acare"], ["python", "-m", "acare_ray.cli"], ["python3", "-m", "acare_ray.cli"])
JOB_SPECS = {name: REPO / "jobs" / f"{name}.yaml" for name in JOB_COMMANDS}
RAYJOBS = {name: KUBERAY / f"rayjob-{name}.yaml" for name in JOB_COMMANDS}
CLUSTER_DOC = REPO / "docs" / "cluster.md"
README = REPO / "README.md"


def documented_shell_lines() -> list[str]:
    """The lines of the bash blocks of docs/cluster.md and the README, continuations joined,
    comments cut."""
    text = "\n".join(
        doc.read_text(encoding="utf-8") for doc in (CLUSTER_DOC, README) if doc.is_file()
    )
    lines = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        for line in re.sub(r"\\\n\s*", " ", block).splitlines():
            lines.append(re.sub(r"\s+#\s.*$", "", line).strip())
    return lines


def documented_cli_commands() -> list[str]:
    """``acare ...`` command lines in the doc, also those after ``ray job submit ... --``."""
    commands = []
    for line in documented_shell_lines():
        line = re.split(r"\s(?:>>?|\||&&|;)\s", line)[0]  # the command, not its redirection
        if " -- acare " in line:
            commands.append(line.split(" -- ", 1)[1])
        elif line.startswith("acare "):
            commands.append(line)
    return commands


def cli_argv(entrypoint: str) -> list[str]:
    """The ``acare`` arguments of an entrypoint command line."""
    argv = shlex.split(entrypoint)
    for prefix in CLI_PREFIXES:
        if argv[: len(prefix)] == prefix:
            return argv[len(prefix) :]
    raise AssertionError(f"entrypoint does not run the acare CLI: {entrypoint!r}")


def parse(argv: list[str]) -> argparse.Namespace:
    try:
        return build_parser().parse_args(argv)
    except SystemExit as exit:
        pytest.fail(f"the acare CLI rejects `acare {shlex.join(argv)}` (exit {exit.code})")


def flag_values(argv: list[str]) -> list[str]:
    """Every argument value, ``--flag=value`` split, in order."""
    return [
        token.split("=", 1)[1] if token.startswith("--") and "=" in token else token
        for token in argv
    ]


def only_doc(path: Path) -> dict[str, Any]:
    assert path.is_file(), f"{path.relative_to(REPO)} is missing"
    (doc,) = load_yaml_documents(path)
    return doc


def shared_mounts() -> set[str]:
    """Mount paths present on the head and on every worker group of raycluster.yaml."""
    spec = only_doc(KUBERAY / "raycluster.yaml")["spec"]
    pods = [spec["headGroupSpec"]["template"]["spec"]] + [
        g["template"]["spec"] for g in spec["workerGroupSpecs"]
    ]
    per_pod = [
        {m["mountPath"] for c in pod["containers"] for m in c.get("volumeMounts", [])}
        for pod in pods
    ]
    return set.intersection(*per_pod)


@pytest.mark.parametrize("command", JOB_COMMANDS)
def test_rayjob_entrypoint_parses_with_the_real_cli(command):
    args = parse(cli_argv(only_doc(RAYJOBS[command])["spec"]["entrypoint"]))
    assert args.command == command and callable(args.func)


@pytest.mark.parametrize("command", JOB_COMMANDS)
def test_rayjob_paths_live_on_storage_every_ray_pod_mounts(command):
    argv = cli_argv(only_doc(RAYJOBS[command])["spec"]["entrypoint"])
    mounts = [PurePosixPath(m) for m in shared_mounts()]
    paths = [PurePosixPath(v) for v in flag_values(argv) if v.startswith("/")]
    assert paths, f"rayjob-{command}: no cluster path in the entrypoint"
    for path in paths:
        assert any(path.is_relative_to(m) for m in mounts), f"{path} is on no shared mount"


def documented_submit(path: Path) -> tuple[list[str], list[str]]:
    """(``ray job submit`` options, entrypoint) of the command in a job spec's header comment."""
    comments = [line.lstrip("#").strip() for line in path.read_text().splitlines()]
    (command,) = [line for line in comments if line.startswith("ray job submit")]
    argv = shlex.split(command)
    split = argv.index("--")
    return argv[3:split], argv[split + 1 :]


def option(options: list[str], name: str) -> str | None:
    return options[options.index(name) + 1] if name in options else None


@pytest.mark.parametrize("command", JOB_COMMANDS)
def test_job_spec_entrypoint_parses_and_its_files_exist(command):
    path = JOB_SPECS[command]
    assert path.is_file(), f"{path.relative_to(REPO)} is missing"
    options, entrypoint = documented_submit(path)
    args = parse(cli_argv(shlex.join(entrypoint)))
    assert args.command == command and callable(args.func)
    runtime_env = option(options, "--runtime-env")
    assert runtime_env and (REPO / runtime_env).resolve() == path.resolve(), runtime_env
    RuntimeEnv(**load_yaml_documents(path)[0])
    working_dir = option(options, "--working-dir")
    if working_dir and "://" not in working_dir:
        assert (REPO / working_dir).is_dir(), f"{path.name}: --working-dir {working_dir} missing"
    for value in flag_values(entrypoint):
        if value.endswith((".yaml", ".yml")) and "://" not in value:
            assert (REPO / value).is_file(), f"{path.name} references missing {value}"


@pytest.mark.parametrize("command", JOB_COMMANDS)
def test_rayjob_runs_with_the_job_spec_runtime_env(command):
    rayjob = only_doc(RAYJOBS[command])["spec"]
    (runtime_env,) = load_yaml_documents(JOB_SPECS[command])
    assert yaml.safe_load(rayjob.get("runtimeEnvYAML", "{}")) == runtime_env


def test_the_cluster_doc_submits_every_job():
    documented = {cli_argv(c)[0] for c in documented_cli_commands()}
    assert set(JOB_COMMANDS) <= documented, documented


@pytest.mark.parametrize("command", documented_cli_commands(), ids=lambda c: c.split()[1])
def test_documented_command_parses_with_the_real_cli(command):
    args = parse(cli_argv(command))
    assert callable(args.func)


def test_files_the_cluster_doc_applies_or_deploys_exist():
    pattern = re.compile(r"(?:kubectl apply(?: --dry-run=\S+)? -f|serve deploy) (\S+)")
    paths = [m.group(1) for line in documented_shell_lines() for m in pattern.finditer(line)]
    assert paths, "no kubectl apply / serve deploy in docs/cluster.md"
    for path in paths:
        if path.startswith(("infra/", "serve_configs/", "jobs/")):
            assert (REPO / path).exists(), f"docs/cluster.md uses missing {path}"


def test_a_renamed_flag_is_caught():
    argv = cli_argv(only_doc(RAYJOBS["rerank"])["spec"]["entrypoint"])
    with pytest.raises(pytest.fail.Exception, match="rejects"):
        parse([*argv, "--no-such-flag", "1"])


def test_an_entrypoint_that_is_not_the_cli_is_caught():
    with pytest.raises(AssertionError, match="does not run the acare CLI"):
        cli_argv("python my_script.py --input x")
    assert cli_argv("python -m acare_ray.cli rerank --x 1") == ["rerank", "--x", "1"]


def test_the_documented_health_check_settings_are_the_test_clusters():
    """docs/cluster.md's `export RAY_health_check_...` line is what every LocalRayCluster (so
    the real-cluster tests) starts its nodes with."""
    from acare_ray.testing import HEALTH_CHECK_ENV

    exports = [line for line in documented_shell_lines() if "RAY_health_check" in line]
    assert len(exports) == 1, exports
    assigned = dict(part.split("=", 1) for part in exports[0].split()[1:])
    assert assigned == HEALTH_CHECK_ENV
