"""The pressure autoscaling policy (issue 35): it asks for a replica at once while work is
refused or waits past half the admission deadline, which Serve's default policy cannot see;
ongoing load without refusals waits the configured load delay, as Serve's default would; the
shipped config names it in a form Serve accepts and builds."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from acare_ray.online.autoscaling import (
    LOAD_SINCE,
    REFUSED,
    WAIT_SHARE_METRIC,
    PressurePolicy,
    desired_replicas,
    load_upscale_delay_s,
)

REPO = Path(__file__).resolve().parents[2]


def _series(*points: tuple[float, float]) -> list:
    return [SimpleNamespace(timestamp=t, value=v) for t, v in points]


def _ctx(
    running: int,
    ongoing: float,
    refused: dict,
    wait: dict,
    *,
    target: int | None = None,
    target_ongoing: float = 1.0,
    now: float = 100.0,
    state: dict | None = None,
):
    config = SimpleNamespace(get_target_ongoing_requests=lambda: target_ongoing)
    return SimpleNamespace(
        current_num_replicas=running,
        target_num_replicas=running if target is None else target,
        total_num_requests=ongoing,
        raw_metrics={REFUSED: refused, WAIT_SHARE_METRIC: wait},
        aggregated_metrics=None,
        policy_state=dict(state or {}),
        current_time=now,
        config=config,
    )


def test_refused_work_asks_for_one_more_replica_at_once_though_ongoing_looks_low():
    policy = PressurePolicy(load_upscale_delay_s=5)
    desired, state = policy(_ctx(1, 1.0, {"r1": _series((99.0, 0.5))}, {"r1": _series()}))
    assert desired == 2 and state["acare_pressured"]


def test_the_latest_report_decides_not_the_look_back_average():
    """Two quiet reports then a refusing one: the latest counts (an average over the window
    would dilute the step); and a replica that stopped refusing is not pressure."""
    policy = PressurePolicy(load_upscale_delay_s=5)
    rising = {"r1": _series((96.0, 0.0), (98.0, 0.0), (99.9, 1.5))}
    assert policy(_ctx(1, 1.0, {}, rising))[0] == 2
    settled = {"r1": _series((96.0, 1.5), (99.9, 0.1))}
    assert policy(_ctx(1, 1.0, {}, settled))[0] == 1


def test_a_long_expected_wait_scales_before_the_first_refusal():
    policy = PressurePolicy(load_upscale_delay_s=5)
    assert policy(_ctx(1, 1.0, {}, {"r1": _series((99.0, 0.6))}))[0] == 2
    assert policy(_ctx(1, 1.0, {}, {"r1": _series((99.0, 0.3))}))[0] == 1
    strict = PressurePolicy(wait_share=0.25, load_upscale_delay_s=5)
    assert strict(_ctx(1, 1.0, {}, {"r1": _series((99.0, 0.3))}))[0] == 2


def test_one_replica_per_start_while_pressure_lasts():
    """While the replica it asked for starts, pressure holds the target instead of adding a
    third; once it runs and pressure remains, the next one."""
    policy = PressurePolicy(load_upscale_delay_s=5)
    refusing = {"r1": _series((99.0, 2.0))}
    assert policy(_ctx(1, 1.0, refusing, {}, target=2))[0] == 2
    assert policy(_ctx(2, 1.0, refusing, {}, target=2))[0] == 3


def test_load_without_refusals_waits_the_load_delay():
    policy = PressurePolicy(load_upscale_delay_s=5)
    desired, state = policy(_ctx(1, 3.0, {}, {}, now=100.0))
    assert desired == 1 and state[LOAD_SINCE] == 100.0
    desired, state = policy(_ctx(1, 3.0, {}, {}, now=103.0, state=state))
    assert desired == 1
    desired, state = policy(_ctx(1, 3.0, {}, {}, now=105.0, state=state))
    assert desired == 3.0
    # the wish lapsed in between: the delay starts again
    _, lapsed = policy(_ctx(1, 0.5, {}, {}, now=106.0, state=state))
    assert LOAD_SINCE not in lapsed
    assert policy(_ctx(1, 3.0, {}, {}, now=107.0, state=lapsed))[0] == 1


def test_without_pressure_it_is_the_default_arithmetic():
    assert desired_replicas(2, 2, 0.5, 1.0, 0.0, 0.0) == (0.5, False)  # down (Serve's delay)
    assert desired_replicas(1, 1, 3.0, 1.0, 0.0, 0.0) == (3.0, False)
    assert desired_replicas(2, 2, 0.5, 1.0, 0.1, 0.0) == (3.0, True)  # never down while refusing


def test_missing_metrics_mean_no_pressure():
    ctx = _ctx(1, 2.0, {}, {})
    ctx.raw_metrics = None
    assert PressurePolicy(load_upscale_delay_s=0)(ctx)[0] == 2.0
    # aggregated values (a float per replica) are read when no raw series came
    ctx.aggregated_metrics = {REFUSED: {"r1": 0.0}, WAIT_SHARE_METRIC: {"r1": 0.9}}
    assert PressurePolicy(load_upscale_delay_s=60)(ctx)[0] == 2


@pytest.mark.parametrize(
    "kwargs", [{"wait_share": 0}, {"wait_share": 1.5}, {"load_upscale_delay_s": -1}]
)
def test_bad_policy_kwargs_are_refused(kwargs):
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        PressurePolicy(**kwargs)


def test_the_load_delay_a_config_gives():
    ours = {
        "upscale_delay_s": 0,
        "policy": {
            "policy_function": "acare_ray.online.autoscaling:PressurePolicy",
            "policy_kwargs": {"load_upscale_delay_s": 5},
        },
    }
    assert load_upscale_delay_s(ours) == 5.0
    assert load_upscale_delay_s({"upscale_delay_s": 7}) == 7.0
    assert load_upscale_delay_s({}) == 30.0


def test_the_shipped_config_names_the_policy_in_a_form_serve_builds():
    """Serve's own resolution: the class built once with the config's kwargs."""
    from ray.serve._private.autoscaling_state import _resolve_policy_callable
    from ray.serve.config import AutoscalingConfig

    config = yaml.safe_load((REPO / "serve_configs" / "cpu-autoscale.yaml").read_text())
    (deployment,) = config["applications"][0]["deployments"]
    scaling = AutoscalingConfig(**deployment["autoscaling_config"])
    policy = _resolve_policy_callable(scaling.policy)
    assert isinstance(policy, PressurePolicy)
    assert policy.load_upscale_delay_s == 5.0 and scaling.upscale_delay_s == 0
