"""A Serve autoscaling policy that sees refused and queued work: scale before refusing.

Serve's default policy scales on ongoing requests per replica (running + queued), averaged over
``look_back_period_s``. Admission control refuses (503) a request the replica could not start
within its deadline, and a refused request leaves at once: it never counts as ongoing. So under
a load step the default policy sees a replica that looks busy but not overloaded while clients
are already being turned away (``benchmarks/results/autoscale-cpu-minilm``: the first refusal at
3 s, the second replica at 10 s).

:func:`pressure_policy` adds what each replica reports through ``record_autoscaling_stats``
(:meth:`acare_ray.online.deployment.Reranker.record_autoscaling_stats`):

- ``acare_refused_per_s``: admission refusals per second since the last report;
- ``acare_wait_share``: the admission controller's expected wait for new work as a share of its
  deadline (1.0: the next request would be refused).

Desired replicas = the default's ``ongoing / target_ongoing_requests``, raised to one more than
the replicas running whenever work is being refused or a replica's expected wait passes
``WAIT_SHARE`` of the deadline (scaling before the first refusal, not after). Scaling down is
the default's arithmetic under Serve's ``downscale_delay_s`` (the hysteresis), and never while
work is refused or queued past the threshold. Serve applies ``min_replicas``/``max_replicas``,
``upscale_delay_s`` and the scaling factors around it (``AutoscalingConfig.policy``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

REFUSED = "acare_refused_per_s"
WAIT_SHARE_METRIC = "acare_wait_share"
WAIT_SHARE = 0.5
"""Scale up once a replica's expected wait passes this share of its admission deadline."""


def _values(metrics: Mapping[str, Mapping[Any, float]] | None, name: str) -> list[float]:
    if not metrics or name not in metrics:
        return []
    return [float(v) for v in metrics[name].values() if v is not None]


def desired_replicas(
    current: int,
    ongoing: float,
    target: float,
    refused_per_s: float,
    wait_share: float,
) -> tuple[float, bool]:
    """``(desired, pressured)``: the default's ``ongoing / target`` (``current`` with no
    target), at least ``current + 1`` while work is refused or waits past ``WAIT_SHARE``, and
    never below ``current`` then."""
    base = ongoing / target if target > 0 else float(current)
    pressured = refused_per_s > 0 or wait_share >= WAIT_SHARE
    if pressured:
        return max(base, current + 1.0), True
    return base, False


def pressure_policy(ctx: Any) -> tuple[float, dict[str, Any]]:
    """The policy Serve calls every control-loop period (``AutoscalingContext`` in, desired
    replicas and the policy state out)."""
    metrics = ctx.aggregated_metrics
    refused = sum(_values(metrics, REFUSED))
    wait = max(_values(metrics, WAIT_SHARE_METRIC), default=0.0)
    current = ctx.current_num_replicas
    if current == 0:
        return ctx.target_num_replicas, dict(ctx.policy_state)
    desired, pressured = desired_replicas(
        current, ctx.total_num_requests, ctx.config.get_target_ongoing_requests(), refused, wait
    )
    state = {
        **ctx.policy_state,
        "acare_pressured": pressured,
        "acare_refused_per_s": refused,
        "acare_wait_share": wait,
    }
    return desired, state
