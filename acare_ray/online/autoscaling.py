"""A Serve autoscaling policy that sees refused and queued work: scale before refusing.

Serve's default policy scales on ongoing requests per replica (running + queued), averaged over
``look_back_period_s``, after ``upscale_delay_s``. Admission control refuses (503) a request the
replica could not start within its deadline, and a refused request leaves at once: it never
counts as ongoing. So under a load step the default policy sees a replica that looks busy but
not overloaded while clients are already being turned away (docs/online.md, "Autoscaling and
admission", has the measurement).

:class:`PressurePolicy` adds what each replica reports through ``record_autoscaling_stats``
(:meth:`acare_ray.online.deployment.Reranker.record_autoscaling_stats`):

- ``acare_refused_per_s``: admission refusals per second since the last report;
- ``acare_wait_share``: the admission controller's expected wait for new work as a share of its
  deadline (1.0: the next request would be refused).

Two kinds of scale-up, with different delays:

- **Pressure** (work refused, or a replica's expected wait past ``wait_share`` of its deadline,
  in the latest report): one more replica than are running, at once. Refusals are certain
  evidence, not a noisy average, so waiting for them to persist only turns more clients away.
  While a replica is still starting the policy holds the target instead of adding another, so
  it grows one replica per start while pressure lasts, never in a burst.
- **Load** (the default's ``ongoing / target_ongoing_requests`` above the target, nothing
  refused): after ``load_upscale_delay_s`` of consecutive wanting, the delay Serve's
  ``upscale_delay_s`` gives the default policy.

Serve applies its own ``upscale_delay_s`` to every policy's answer, before either path can act,
so a config using this policy sets ``upscale_delay_s: 0`` and gives the load delay to the
policy (``policy_kwargs``). Scaling down is the default's arithmetic under Serve's
``downscale_delay_s`` (the hysteresis), and never while work is refused or waits past the
threshold. Serve applies ``min_replicas``/``max_replicas`` and the scaling factors around it.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

REFUSED = "acare_refused_per_s"
WAIT_SHARE_METRIC = "acare_wait_share"
WAIT_SHARE = 0.5
"""Scale up once a replica's expected wait passes this share of its admission deadline."""
LOAD_UPSCALE_DELAY_S = 30.0
"""Serve's default ``upscale_delay_s``: how long load growth without refusals must last."""
LOAD_SINCE = "acare_load_upscale_since"


def _latest(metrics: Mapping[str, Mapping[Any, Any]] | None, name: str) -> list[float]:
    """Each replica's latest reported value of ``name`` (raw time series), not the look-back
    average: an average over a window that began before the step dilutes the first refusals."""
    if not metrics or name not in metrics:
        return []
    values = []
    for series in metrics[name].values():
        if isinstance(series, (int, float)):
            values.append(float(series))
        elif series:
            values.append(float(max(series, key=lambda point: point.timestamp).value))
    return values


def _reported(ctx: Any, name: str) -> list[float]:
    raw = _latest(ctx.raw_metrics, name)
    return raw if raw else _latest(ctx.aggregated_metrics, name)


def desired_replicas(
    running: int,
    target: int,
    ongoing: float,
    target_ongoing: float,
    refused_per_s: float,
    wait_share: float,
    threshold: float = WAIT_SHARE,
) -> tuple[float, bool]:
    """``(desired, pressured)`` before the load delay: the default's ``ongoing /
    target_ongoing`` (``running`` with no target); under pressure at least one more than are
    running, or the current target while a replica it asked for is still starting."""
    base = ongoing / target_ongoing if target_ongoing > 0 else float(running)
    pressured = refused_per_s > 0 or wait_share >= threshold
    if not pressured:
        return base, False
    floor = target if running < target else running + 1
    return max(base, float(floor)), True


class PressurePolicy:
    """The policy Serve calls every control-loop period (``AutoscalingContext`` in, desired
    replicas and the policy state out); Serve builds it once with the config's
    ``policy_kwargs``."""

    def __init__(
        self, wait_share: float = WAIT_SHARE, load_upscale_delay_s: float = LOAD_UPSCALE_DELAY_S
    ) -> None:
        if not 0 < wait_share <= 1:
            raise ValueError(f"wait_share must be in (0, 1], got {wait_share!r}")
        if load_upscale_delay_s < 0:
            raise ValueError(f"load_upscale_delay_s must be >= 0, got {load_upscale_delay_s!r}")
        self.wait_share = float(wait_share)
        self.load_upscale_delay_s = float(load_upscale_delay_s)

    def __call__(self, ctx: Any) -> tuple[float, dict[str, Any]]:
        state = dict(ctx.policy_state)
        running, target = ctx.current_num_replicas, ctx.target_num_replicas
        if running == 0:
            state.pop(LOAD_SINCE, None)
            return target, state
        refused = sum(_reported(ctx, REFUSED))
        wait = max(_reported(ctx, WAIT_SHARE_METRIC), default=0.0)
        desired, pressured = desired_replicas(
            running,
            target,
            ctx.total_num_requests,
            ctx.config.get_target_ongoing_requests(),
            refused,
            wait,
            self.wait_share,
        )
        now = ctx.current_time if ctx.current_time is not None else time.time()
        if pressured or desired <= target:
            state.pop(LOAD_SINCE, None)
        else:  # load growth without refusals: Serve's usual upscale delay, kept here
            since = state.setdefault(LOAD_SINCE, now)
            if now - since < self.load_upscale_delay_s:
                desired = float(target)
        state.update(acare_pressured=pressured, acare_refused_per_s=refused, acare_wait_share=wait)
        return desired, state


def load_upscale_delay_s(scaling: Mapping[str, Any]) -> float:
    """How long load growth without refusals waits before a replica is added under the
    ``autoscaling_config`` ``scaling``: the pressure policy's own delay plus Serve's (which a
    config using it sets to 0), or Serve's ``upscale_delay_s`` alone for any other policy."""
    serve_delay = float(scaling.get("upscale_delay_s", LOAD_UPSCALE_DELAY_S))
    policy = scaling.get("policy") or {}
    if str(policy.get("policy_function", "")).endswith(f":{PressurePolicy.__name__}"):
        kwargs = policy.get("policy_kwargs") or {}
        return serve_delay + float(kwargs.get("load_upscale_delay_s", LOAD_UPSCALE_DELAY_S))
    return serve_delay
