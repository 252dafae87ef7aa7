"""`acare train` flags -> TrainConfig, the jobs/train.yaml entrypoint, config validation."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
import yaml

from acare_ray.cli import build_parser
from acare_ray.scoring import ScorerSettings
from acare_ray.training.cli import config_from_args
from acare_ray.training.config import TrainConfig

JOB = Path(__file__).resolve().parents[2] / "jobs" / "train.yaml"


def _config(argv: list[str]) -> TrainConfig:
    return config_from_args(build_parser().parse_args(["train", *argv]))


def test_flags_become_the_config():
    flags = (
        "--data g.parquet --model m --output out --name run1 --workers 4 --gpus-per-worker 1 "
        "--epochs 2 --lr 3e-5 --temperature 0.3 --group-size 4 --batch-groups 2 --grad-accum 8 "
        "--eval-modes m0,M3 --no-eval-at-start --max-grad-norm 0 --strategy fsdp"
    )
    config = _config(shlex.split(flags))
    assert config == TrainConfig(
        data="g.parquet",
        model="m",
        output="out",
        name="run1",
        workers=4,
        gpus_per_worker=1.0,
        epochs=2,
        lr=3e-5,
        temperature=0.3,
        group_size=4,
        batch_groups=2,
        grad_accum=8,
        eval_modes=("M0", "M3"),
        eval_at_start=False,
        max_grad_norm=None,
        strategy="fsdp",
    )
    assert config.use_gpu and config.global_batch_groups == 64


def test_lever_flags_become_the_config():
    config = _config(
        shlex.split("--data g.parquet --chunk-tokens 1024 --freeze-embeddings --freeze-layers 2")
    )
    assert (config.chunk_tokens, config.freeze_embeddings, config.freeze_layers) == (1024, True, 2)
    plain = _config(["--data", "g.parquet"])
    assert (plain.chunk_tokens, plain.freeze_embeddings, plain.freeze_layers) == (None, False, 0)
    assert _config(shlex.split("--data g.parquet --ema-decay 0.98")).ema_decay == 0.98
    assert plain.ema_decay is None
    assert plain.cpu_bf16 is False
    assert _config(["--data", "g.parquet", "--cpu-bf16"]).cpu_bf16 is True
    assert _config(["--data", "g.parquet", "--cpu-bf16", "auto"]).cpu_bf16 == "auto"
    assert _config(["--data", "g.parquet", "--cpu-bf16", "off"]).cpu_bf16 is False


def test_a_bad_cpu_bf16_choice_is_refused_by_name(capsys):
    with pytest.raises(SystemExit):
        _config(["--data", "g.parquet", "--cpu-bf16", "yes"])
    assert "--cpu-bf16: choose on, off or auto, got 'yes'" in capsys.readouterr().err


def test_defaults_follow_the_design():
    config = _config(["--data", "g.parquet"])
    assert (config.temperature, config.group_size) == (0.5, 8)
    assert (config.p_question, config.p_reasoning) == (0.5, 0.5)
    assert config.eval_modes == ("M0", "M1", "M2", "M3") and not config.use_gpu


def test_job_spec_is_a_runtime_env_whose_entrypoint_parses():
    from ray.runtime_env import RuntimeEnv

    RuntimeEnv(**yaml.safe_load(JOB.read_text()))
    lines = [line[1:].strip() for line in JOB.read_text().splitlines() if line.startswith("#")]
    (command,) = [shlex.split(line) for line in lines if line.startswith("ray job submit")]
    assert command[command.index("--runtime-env") + 1] == "jobs/train.yaml"
    entrypoint = command[command.index("--") + 1 :]
    assert entrypoint[:2] == ["acare", "train"]
    config = _config(entrypoint[2:])
    assert config.workers == 8 and config.use_gpu and config.strategy == "fsdp"


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("workers", 0, "workers must be an integer >= 1, got 0"),
        ("group_size", 1, "group_size must be >= 2"),
        ("temperature", 0.0, "temperature must be > 0"),
        ("strategy", "zero", "strategy must be one of"),
        ("eval_modes", ("M5",), "eval_modes: 'M5' is not one of"),
        ("p_question", 1.5, "p_question must be in"),
        ("name", "a/b", "name must be a non-empty folder name"),
        ("ema_decay", 1.0, "ema_decay must be in \\(0, 1\\), got 1.0"),
        ("ema_decay", "0.9", "ema_decay must be a number in"),
        ("cpu_bf16", "yes", "cpu_bf16 must be true, false or 'auto', got 'yes'"),
        ("cpu_bf16", 1, "cpu_bf16 must be true, false or 'auto', got 1"),
    ],
)
def test_bad_setting_is_named(field, value, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig(data="g.parquet", **{field: value})


def test_resume_mismatches_name_the_settings_that_change_the_data_order():
    saved = TrainConfig(data="g.parquet", seed=0, lr=1e-5).to_dict()
    assert TrainConfig(data="g.parquet", seed=0, lr=5e-5).resume_mismatches(saved) == []
    assert TrainConfig(data="g.parquet", seed=1, batch_groups=4).resume_mismatches(saved) == [
        "batch_groups: saved 8, now 4",
        "seed: saved 0, now 1",
    ]
    assert TrainConfig.from_dict(saved) == TrainConfig(data="g.parquet", seed=0, lr=1e-5)
    averaged = TrainConfig(data="g.parquet", seed=0, ema_decay=0.98)
    assert averaged.resume_mismatches(saved) == ["ema_decay: saved None, now 0.98"]


def test_a_weight_average_is_refused_with_sharded_weights():
    with pytest.raises(ValueError, match="ema_decay is not supported with strategy 'fsdp'"):
        TrainConfig(data="g.parquet", strategy="fsdp", ema_decay=0.98)


def test_the_scorer_section_is_the_one_the_jobs_and_the_app_take():
    """Issue 33.5: --backend and --max-length fill ``scorer`` (ScorerSettings, as in the
    offline jobs and the Serve args); a run recorded with them flat reads back; a device or
    dtype there is refused (the worker decides both)."""
    config = _config(shlex.split("--data g --backend cross_encoder --max-length 320"))
    assert config.scorer == ScorerSettings(backend="cross_encoder", max_length=320)
    assert _config(["--data", "g"]).scorer == ScorerSettings()
    assert TrainConfig.from_dict(config.to_dict()) == config
    old = {k: v for k, v in config.to_dict().items() if k != "scorer"}
    old |= {"backend": "cross_encoder", "max_length": 320}
    assert TrainConfig.from_dict(old) == config
    as_yaml = TrainConfig(data="g", scorer={"max_length": 320})
    assert as_yaml.scorer == ScorerSettings(max_length=320)
    for bad in ({"device": "cuda"}, {"dtype": "bfloat16"}):
        with pytest.raises(ValueError, match="trainer places the model"):
            TrainConfig(data="g", scorer=bad)
    with pytest.raises(ValueError, match="unknown settings max_len"):
        TrainConfig(data="g", scorer={"max_len": 320})
