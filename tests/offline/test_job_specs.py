"""jobs/*.yaml: valid runtime environments whose documented entrypoints the CLI accepts."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
import yaml

from acare_ray.cli import build_parser, main

JOBS = Path(__file__).resolve().parents[2] / "jobs"


def submit_command(path: Path) -> list[str]:
    """The ``ray job submit ...`` line documented in the file's header comment."""
    lines = [line[1:].strip() for line in path.read_text().splitlines() if line.startswith("#")]
    (command,) = [line for line in lines if line.startswith("ray job submit")]
    return shlex.split(command)


@pytest.mark.parametrize("name", ["rerank", "relabel", "eval"])
def test_job_spec_is_a_runtime_env_and_its_entrypoint_parses(name):
    from ray.runtime_env import RuntimeEnv

    path = JOBS / f"{name}.yaml"
    spec = yaml.safe_load(path.read_text())
    RuntimeEnv(**spec)  # raises on unknown or malformed fields
    command = submit_command(path)
    assert command[command.index("--runtime-env") + 1] == f"jobs/{name}.yaml"
    entrypoint = command[command.index("--") + 1 :]
    assert entrypoint[:2] == ["acare", name]
    args = build_parser().parse_args(entrypoint[1:])
    assert args.command == name and callable(args.func)


def test_bad_flags_exit_2_with_a_message(capsys, tmp_path):
    code = main(
        ["rerank", "--input", "x", "--output", str(tmp_path), "--model", "m"] + ["--actors", "3,1"]
    )
    assert code == 2
    assert "actors: need 1 <= MIN <= MAX, got MIN=3, MAX=1" in capsys.readouterr().err


def test_a_submitted_job_does_not_set_its_runtime_env_keys_again(monkeypatch):
    """Regression: `ray job submit --runtime-env jobs/rerank.yaml` exited 2 because ray.init
    set the same env var keys as the job ("Failed to merge the Job's runtime env")."""
    import json

    from acare_ray.offline.job import WORKER_ENV, job_env_vars

    monkeypatch.delenv("RAY_JOB_CONFIG_JSON_ENV_VAR", raising=False)
    assert job_env_vars() == {}
    job = {"runtime_env": {"env_vars": dict(WORKER_ENV)}}
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", json.dumps(job))
    assert job_env_vars() == WORKER_ENV
    assert {k: v for k, v in WORKER_ENV.items() if k not in job_env_vars()} == {}


@pytest.mark.parametrize("job", ["rerank", "relabel", "eval"])
def test_object_store_budget_reaches_the_pool_and_is_off_by_default(job):
    from acare_ray.offline.cli import _pool

    base = [job, "--input", "in", "--model", "m"]
    base += ["--output", "out"] if job != "eval" else ["--report-dir", "r"]
    assert _pool(build_parser().parse_args(base)).store_budget_bytes is None
    capped = build_parser().parse_args([*base, "--object-store-mb", "300"])
    assert _pool(capped).store_budget_bytes == 300 * 2**20


def test_the_documented_retry_errors_command_reaches_the_job(monkeypatch):
    """docs/offline.md's ``--retry-errors`` command, through the CLI to the job's config."""
    import acare_ray.offline.rerank as rerank

    doc = (Path(__file__).resolve().parents[2] / "docs" / "offline.md").read_text()
    block = doc.split("```bash\n")[1:]
    (command,) = [b.split("```")[0] for b in block if "--retry-errors" in b.split("```")[0]]
    argv = shlex.split(command.replace("\\\n", " "))
    assert argv[:2] == ["acare", "rerank"]
    seen = []

    class Counts:
        def describe(self) -> str:
            return "ok"

    monkeypatch.setattr(rerank, "run", lambda config: seen.append(config) or Counts())
    assert main(argv[1:]) == 0
    assert seen[0].retry_errors is True and seen[0].mode == "M3"
    assert main([a for a in argv[1:] if a != "--retry-errors"]) == 0
    assert seen[1].retry_errors is False


def test_a_locked_output_exits_2_naming_the_holder(monkeypatch, capsys, tmp_path):
    import acare_ray.offline.rerank as rerank
    from acare_ray.offline.lock import OutputLocked

    def locked(config):
        raise OutputLocked(f"output {config.output} is locked by run r1 (pid 1 on h)")

    monkeypatch.setattr(rerank, "run", locked)
    argv = ["rerank", "--input", "x", "--output", str(tmp_path), "--model", "m"]
    assert main(argv) == 2
    assert f"acare rerank: error: output {tmp_path} is locked by run r1" in capsys.readouterr().err
