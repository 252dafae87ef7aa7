"""The pressure autoscaling policy (issue 35): it asks for a replica while work is refused or
waits past half the admission deadline, which Serve's default policy cannot see, and otherwise
does the default's arithmetic; the shipped config names it in a form Serve accepts."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import yaml

from acare_ray.online.autoscaling import (
    REFUSED,
    WAIT_SHARE_METRIC,
    desired_replicas,
    pressure_policy,
)

REPO = Path(__file__).resolve().parents[2]


def _ctx(replicas: int, ongoing: float, refused: dict, wait: dict, target: float = 1.0):
    config = SimpleNamespace(get_target_ongoing_requests=lambda: target)
    return SimpleNamespace(
        current_num_replicas=replicas,
        target_num_replicas=replicas,
        total_num_requests=ongoing,
        aggregated_metrics={REFUSED: refused, WAIT_SHARE_METRIC: wait},
        policy_state={},
        config=config,
    )


def test_refused_work_asks_for_one_more_replica_though_ongoing_looks_low():
    # one replica, one request ongoing (the default would keep 1), but it refused work
    desired, state = pressure_policy(_ctx(1, 1.0, {"r1": 0.5}, {"r1": 0.2}))
    assert desired == 2 and state["acare_pressured"]


def test_a_long_expected_wait_scales_before_the_first_refusal():
    desired, _ = pressure_policy(_ctx(1, 1.0, {"r1": 0.0}, {"r1": 0.6}))
    assert desired == 2
    desired, _ = pressure_policy(_ctx(1, 1.0, {"r1": 0.0}, {"r1": 0.3}))
    assert desired == 1  # below half the deadline and nothing refused: the default's answer


def test_without_pressure_it_is_the_default_arithmetic():
    assert desired_replicas(2, 0.5, 1.0, 0.0, 0.0) == (0.5, False)  # scale down (Serve's delay)
    assert desired_replicas(1, 3.0, 1.0, 0.0, 0.0) == (3.0, False)
    assert desired_replicas(2, 0.5, 1.0, 0.1, 0.0) == (3.0, True)  # never down while refusing


def test_missing_metrics_mean_no_pressure():
    ctx = _ctx(1, 2.0, {}, {})
    ctx.aggregated_metrics = None
    assert pressure_policy(ctx)[0] == 2.0


def test_the_shipped_config_names_the_policy_in_a_form_serve_accepts():
    from ray.serve.config import AutoscalingConfig

    config = yaml.safe_load((REPO / "serve_configs" / "cpu-autoscale.yaml").read_text())
    (deployment,) = config["applications"][0]["deployments"]
    scaling = AutoscalingConfig(**deployment["autoscaling_config"])
    assert scaling.policy.policy_function == "acare_ray.online.autoscaling:pressure_policy"
    assert scaling.policy.get_policy() is not None
