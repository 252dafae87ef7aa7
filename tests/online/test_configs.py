"""Serve configs, the application builder, the batch sizing rule and ``acare serve`` flags."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from ray.serve import Application
from ray.serve.schema import ServeDeploySchema

from acare_ray.cli import main
from acare_ray.online.app_args import DEFAULT_MAX_BATCH_SIZE, AppArgs, ReplicaSettings
from acare_ray.online.batch_queue import Pending, batch_slots
from acare_ray.online.deployment import Reranker, build_app
from acare_ray.online.service import ScoringJob
from acare_ray.scoring import AgentContext, Mode

REPO = Path(__file__).resolve().parents[2]
CONFIGS = sorted((REPO / "serve_configs").glob("*.yaml"))


def load(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def deployments(config: dict):
    for app in config["applications"]:
        for deployment in app.get("deployments", []):
            yield app, deployment


def test_acare_serve_without_config_serves_local_yaml_on_cpu(capsys):
    """``acare serve`` with no ``--config`` deploys ``serve_configs/local.yaml`` as written, and
    that config runs on a machine without a GPU; ``gpu.yaml`` sits beside it. (This used to
    check only that the two files exist.)"""
    assert {p.name for p in CONFIGS} >= {"local.yaml", "gpu.yaml"}
    assert main(["serve", "--print-config"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    local = load(REPO / "serve_configs" / "local.yaml")
    assert printed == local
    for app, deployment in deployments(local):
        assert app["args"]["scorer"]["device"] == "cpu"
        assert not deployment.get("ray_actor_options", {}).get("num_gpus")


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_config_is_a_valid_serve_config_for_this_app(path):
    config = load(path)
    ServeDeploySchema.model_validate(config)
    for app, deployment in deployments(config):
        assert app["import_path"] == "acare_ray.online.deployment:build_app"
        AppArgs.model_validate(app["args"])
        settings = ReplicaSettings.model_validate(deployment["user_config"])
        assert deployment["max_ongoing_requests"] >= settings.max_batch_size, (
            "a replica must accept enough requests to fill a batch"
        )
        assert deployment["max_queued_requests"] > 0, "the queue must be bounded"
        timeout = config["http_options"].get("request_timeout_s")
        assert timeout is not None, "set request_timeout_s, the admission deadline is below it"
        assert settings.admission_deadline_s <= timeout / 2, (
            "an admitted request must have time to be scored before the proxy gives up"
        )
        assert isinstance(build_app(AppArgs.model_validate(app["args"])), Application)


def test_gpu_config_autoscales_one_gpu_replicas():
    (app,) = load(REPO / "serve_configs" / "gpu.yaml")["applications"]
    (deployment,) = app["deployments"]
    assert deployment["ray_actor_options"]["num_gpus"] == 1
    scaling = deployment["autoscaling_config"]
    assert 1 <= scaling["min_replicas"] <= scaling["initial_replicas"] <= scaling["max_replicas"]
    assert 0 < scaling["target_ongoing_requests"] <= deployment["max_ongoing_requests"]
    assert "num_replicas" not in deployment
    assert app["args"]["scorer"]["device"] == "cuda"


def test_builder_takes_serve_run_string_arguments():
    args = AppArgs.model_validate(
        {"model": "some/ckpt", "max_documents": "10", "scorer": {"device": "cpu"}}
    )
    app = build_app(args)
    assert isinstance(app, Application)
    assert isinstance(build_app({"model": "x"}), Application)
    with pytest.raises(ValueError, match="max_document"):
        AppArgs.model_validate({"max_document": 3})


def test_the_scorer_section_is_the_one_the_jobs_and_the_trainer_take():
    """Issue 33.5: one ScorerSettings type, nested as ``scorer`` (no renamed or restated
    fields); an unknown or out-of-range setting is refused naming it."""
    from acare_ray.scoring import ScorerSettings

    args = AppArgs.model_validate(
        {"scorer": {"device": "cpu", "max_batch_tokens": 128, "caps": {"question": 64}}}
    )
    assert args.scorer == ScorerSettings(device="cpu", max_batch_tokens=128, caps={"question": 64})
    assert args.scorer.changed() == {
        "device": "cpu",
        "max_batch_tokens": 128,
        "caps": {"sub_query": 256, "question": 64, "reasoning": 512},
    }
    for bad, named in (
        ({"forward_batch_tokens": 1}, "forward_batch_tokens"),
        ({"max_length": 4}, "max_length"),
        ({"backend": "vllm"}, "backend"),
        ({"max_batch_tokens": "many"}, "max_batch_tokens"),
    ):
        with pytest.raises(ValueError, match=named):
            AppArgs.model_validate({"scorer": bad})
    with pytest.raises(ValueError, match="max_length"):
        AppArgs.model_validate({"max_length": 512})  # flat, as before: not an app argument
    on_the_command_line = AppArgs.model_validate({"scorer": '{"device": "cpu"}'})  # serve run
    assert on_the_command_line.scorer == ScorerSettings(device="cpu")


def test_code_defaults_keep_a_batch_fillable():
    options = Reranker._deployment_config
    assert options.max_ongoing_requests >= DEFAULT_MAX_BATCH_SIZE
    assert options.max_queued_requests > 0
    assert (
        ReplicaSettings.model_validate(options.user_config).max_batch_size == DEFAULT_MAX_BATCH_SIZE
    )


def test_local_config_names_the_admission_settings():
    (app,) = load(REPO / "serve_configs" / "local.yaml")["applications"]
    (deployment,) = app["deployments"]
    assert {"admission_deadline_s", "admission_prior_tokens_per_s"} <= set(
        deployment["user_config"]
    )
    with pytest.raises(ValueError, match="admission_deadline_s"):
        ReplicaSettings.model_validate({"admission_deadline_s": 0})


def pending(tokens: int, slot: float = 100.0) -> Pending:
    job = ScoringJob(AgentContext("q"), Mode.M0, ("d",), tokens=tokens)
    return Pending(job, slot)


@pytest.mark.parametrize(
    ("tokens", "size"),
    [
        ([5000], 1),
        ([10, 10, 10], 3),
        ([150, 150, 150], 5),
        ([1000, 1], 11),
    ],
)
def test_a_batch_is_sized_by_requests_or_tokens_whichever_is_more(tokens, size):
    assert batch_slots([pending(t) for t in tokens]) == size


def test_acare_serve_applies_model_and_port_overrides(capsys, tmp_path):
    model = tmp_path / "ckpt"
    model.mkdir()
    code = main(
        [
            "serve",
            "--config",
            str(REPO / "serve_configs" / "local.yaml"),
            "--model",
            str(model),
            "--port",
            "9123",
            "--print-config",
        ]
    )
    assert code == 0
    config = yaml.safe_load(capsys.readouterr().out)
    ServeDeploySchema.model_validate(config)
    assert config["http_options"]["port"] == 9123
    assert config["applications"][0]["args"]["model"] == str(model.resolve())
    assert load(REPO / "serve_configs" / "local.yaml")["http_options"]["port"] != 9123


def test_acare_serve_keeps_hub_ids_and_reports_a_missing_config(capsys, tmp_path):
    code = main(
        [
            "serve",
            "--config",
            str(REPO / "serve_configs" / "gpu.yaml"),
            "--model",
            "Qwen/Qwen3-Reranker-0.6B",
            "--print-config",
        ]
    )
    assert code == 0
    config = yaml.safe_load(capsys.readouterr().out)
    assert config["applications"][0]["args"]["model"] == "Qwen/Qwen3-Reranker-0.6B"
    assert main(["serve", "--config", str(tmp_path / "nope.yaml"), "--print-config"]) == 2
    assert "nope.yaml" in capsys.readouterr().err


def test_every_shipped_autoscaling_config_scales_on_refused_and_queued_work():
    """Issue 35.1: an autoscaling deployment in a shipped config (and so the RayService, which
    embeds gpu.yaml) uses the pressure policy, whose function Serve can import."""
    import importlib

    from acare_ray.online.autoscaling import PressurePolicy

    scaled = [
        (path.name, deployment["autoscaling_config"])
        for path in CONFIGS
        for _, deployment in deployments(load(path))
        if "autoscaling_config" in deployment
    ]
    assert {name for name, _ in scaled} >= {"gpu.yaml", "cpu-autoscale.yaml"}
    for name, scaling in scaled:
        module, _, function = scaling["policy"]["policy_function"].partition(":")
        assert getattr(importlib.import_module(module), function) is PressurePolicy, name
        # Serve's own delay would hold the policy's answer to refusals: the policy keeps it
        assert scaling["upscale_delay_s"] == 0, name
        assert scaling["policy"]["policy_kwargs"]["load_upscale_delay_s"] > 0, name
        # The policy sees a refusal only in a report: Serve's default 10 s would be its delay.
        assert scaling["metrics_interval_s"] <= 1, name
