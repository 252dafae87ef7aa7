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


def _built_config(monkeypatch, argv: list[str]):
    """The config the CLI hands the job's ``run`` for ``argv``."""
    import sys

    from acare_ray.offline.evaluate import EvalConfig
    from acare_ray.offline.fit_fusion import FitFusionConfig
    from acare_ray.offline.relabel import RelabelConfig
    from acare_ray.offline.rerank import RerankConfig

    classes = {
        "rerank": RerankConfig,
        "relabel": RelabelConfig,
        "eval": EvalConfig,
        "fit-fusion": FitFusionConfig,
    }
    seen = []

    def run(config):
        seen.append(config)
        raise SystemExit(0)

    monkeypatch.setattr(sys.modules[classes[argv[0]].__module__], "run", run)
    with pytest.raises(SystemExit):
        main(argv)
    return classes[argv[0]], seen[0]


@pytest.mark.parametrize(
    ("argv", "required"),
    [
        (["rerank", "--output", "o"], {"output": "o"}),
        (["relabel", "--output", "o"], {"output": "o"}),
        (["eval", "--report-dir", "r"], {"report_dir": "r"}),
        (["fit-fusion", "--work-dir", "w"], {"work_dir": "w"}),
    ],
)
def test_the_cli_leaves_every_default_to_the_job_config(monkeypatch, tmp_path, argv, required):
    """Defaults live in the job configs alone: flags not given build the config its own
    defaults build (issue 22: the CLI restated every default)."""
    model = str(tmp_path)  # fit-fusion stores into a checkpoint folder
    cls, built = _built_config(monkeypatch, [*argv, "--input", "in", "--model", model])
    assert built == cls(input="in", model=model, **required)


def test_every_flag_reaches_its_config_field(monkeypatch, tmp_path):
    _, built = _built_config(
        monkeypatch,
        ["eval", "--input", "in", "--model", "m", "--report-dir", "r"]
        + ["--modes", "M0, M3", "--measures", "nDCG@5", "--test", "bootstrap"]
        + ["--resamples", "50", "--seed", "3", "--sessions", "--session-depth", "4"]
        + ["--group-by", "agent", "--fusion", "none", "--fusion", "rrf", "--no-first-stage"]
        + ["--actors", "2", "--batch-size", "8", "--max-batch-tokens", "999"]
        + ["--revision", "abc", "--ray-address", "auto"],
    )
    assert (built.modes, built.measures, built.test) == (("M0", "M3"), ("nDCG@5",), "bootstrap")
    assert (built.n_resamples, built.seed, built.sessions, built.session_depth) == (50, 3, True, 4)
    assert (built.group_by, built.fusion, built.first_stage) == ("agent", ("none", "rrf"), False)
    assert (built.pool.min_size, built.pool.max_size, built.pool.batch_size) == (2, 2, 8)
    assert built.scorer.changed() == {"max_batch_tokens": 999} and built.revision == "abc"
    assert built.ray_address == "auto"
    _, relabel = _built_config(
        monkeypatch,
        ["relabel", "--input", "in", "--model", "m", "--output", "o", "--negatives", "3"]
        + ["--gold-aware", "--negatives-from", "hard", "--keep-failed", "--instruction", "Judge"]
        + ["--retry-errors"],
    )
    assert (relabel.negatives, relabel.gold_aware, relabel.negatives_from) == (3, True, "hard")
    assert (relabel.keep_failed, relabel.retry_errors) == (True, True)
    assert relabel.scorer.instruction == "Judge"
    _, fitting = _built_config(
        monkeypatch,
        ["fit-fusion", "--input", "in", "--model", str(tmp_path), "--work-dir", "w"]
        + ["--mode", "M2", "--methods", "rrf", "--k", "30", "--measure", "RR@10", "--no-write"]
        + ["--rule", "best", "--folds", "4", "--confidence", "0.9", "--fold-seed", "2"],
    )
    assert fitting.rule == "best"
    assert (fitting.safety.folds, fitting.safety.confidence, fitting.safety.seed) == (4, 0.9, 2)
    assert (fitting.mode, fitting.methods, fitting.k, fitting.write) == (
        "M2",
        ("rrf",),
        30.0,
        False,
    )
    assert fitting.measure == "RR@10"
