"""The Serve apps the ``test_serve_*`` modules deploy (tests/online/conftest.py deploys the ones
a module names in ``SERVE_APPS``), from ``serve_configs/local.yaml`` through the same config path
``serve run <config>`` and ``serve deploy`` take:

- ``main`` at ``/``: the tiny Qwen3 saved as a trainer checkpoint (with ``acare.json`` and a
  fitted fusion, which requests without first-stage fields must not notice), no auth, small
  body and document limits;
- ``guarded`` at ``/guarded``: bearer key from an environment variable, and a tiny Serve queue
  (``max_ongoing_requests=2``, ``max_queued_requests=1``) whose batches wait 1.5 s for requests
  that can never arrive (2 < ``max_batch_size``), so a burst deterministically overflows
  Serve's backstop;
- ``burst`` at ``/burst``: one replica with a 2 s admission deadline and room in Serve's queue
  for the whole burst, so only admission by expected wait refuses work;
- ``fair`` at ``/fair``: two API keys (two clients), a 3 s admission deadline, each client
  holding at most half of it (``client_share``), small requests (``max_documents`` and
  ``max_request_tokens``), for the load test of fair shares;
- ``cancel`` at ``/cancel``: keyed, with a small forward batch (``scorer.max_batch_tokens``), so
  a large request takes many forward passes and a disconnect can stop it midway.
"""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
from online_support import local_serve_config
from scoring_support import CAPITAL_DOCUMENTS, CONTEXT

from acare_ray.ranking.fusion import FusionConfig
from acare_ray.scoring import AgentContext, Scorer

REPO = Path(__file__).resolve().parents[2]
API_KEY_ENV = "ACARE_TEST_API_KEY"
API_KEY = "s3cret-test-key"
MAX_DOCUMENTS = 40
MAX_BODY_BYTES = 200_000
GUARDED_WAIT_S = 1.5
BURST_DEADLINE_S = 2.0
BURST_REQUESTS = 40
BURST_DOCUMENTS = 100
FAIR_KEYS_ENV = "ACARE_TEST_FAIR_KEYS"
KEY_A, KEY_B = "key-a-floods", "key-b-behaves"
FAIR_DEADLINE_S = 3.0
FAIR_SHARE = 0.5
FAIR_DOCUMENTS = 16
FAIR_MAX_TOKENS = 8000
FAIR_FLOODERS = 48
FAIR_B_REQUESTS = 16
CANCEL_FORWARD_TOKENS = 128
CANCEL_DOCUMENTS = 100
CANCEL_DOCUMENT_BYTES = 800

DOCUMENTS = [
    *CAPITAL_DOCUMENTS,
    "Population statistics for capitals in Europe vary widely.",
    "Velmoria is a small country.",
]
FULL = CONTEXT
FITTED = FusionConfig("linear", alpha=0.3)
APPS = ("main", "guarded", "burst", "fair", "cancel")


def make_config(checkpoint: Path, port: int, apps: tuple[str, ...] = APPS) -> dict:
    """serve_configs/local.yaml with the test model, port and limits, and the ``apps`` of the
    module docstring (``main`` always)."""
    config, main = local_serve_config(checkpoint, port, "main")
    main["args"].update(max_documents=MAX_DOCUMENTS, max_body_bytes=MAX_BODY_BYTES)
    guarded = copy.deepcopy(main)
    guarded.update(
        name="guarded",
        route_prefix="/guarded",
        runtime_env={"env_vars": {API_KEY_ENV: API_KEY}},
    )
    guarded["args"].update(api_key_env=API_KEY_ENV, allow_unauthenticated=False)
    guarded["deployments"][0].update(
        max_ongoing_requests=2,
        max_queued_requests=1,
        user_config={"max_batch_size": 4, "batch_wait_timeout_s": GUARDED_WAIT_S},
    )
    burst = copy.deepcopy(main)
    burst.update(name="burst", route_prefix="/burst")
    burst["args"].update(max_documents=BURST_DOCUMENTS, max_body_bytes=1_000_000)
    burst["deployments"][0].update(
        max_ongoing_requests=2 * BURST_REQUESTS,
        max_queued_requests=2 * BURST_REQUESTS,
        user_config={
            "max_batch_size": 4,
            "batch_wait_timeout_s": 0.005,
            "max_batch_tokens": 65536,
            "admission_deadline_s": BURST_DEADLINE_S,
            "admission_prior_tokens_per_s": 5000,
            # One client sends the whole burst: this app tests the deadline, not fair shares.
            "client_share": 1.0,
        },
    )
    fair = copy.deepcopy(guarded)
    fair.update(
        name="fair",
        route_prefix="/fair",
        runtime_env={"env_vars": {FAIR_KEYS_ENV: f"{KEY_A},{KEY_B}"}},
    )
    fair["args"].update(
        api_key_env=FAIR_KEYS_ENV,
        max_documents=FAIR_DOCUMENTS,
        max_body_bytes=1_000_000,
        max_request_tokens=FAIR_MAX_TOKENS,
    )
    fair["deployments"][0].update(
        max_ongoing_requests=64,
        max_queued_requests=64,
        user_config={
            "max_batch_size": 4,
            "batch_wait_timeout_s": 0.005,
            "max_batch_tokens": 65536,
            "admission_deadline_s": FAIR_DEADLINE_S,
            "admission_prior_tokens_per_s": 2000,
            "client_share": FAIR_SHARE,
            # The hard stop is twice the admission deadline, so a late answer is seen as late
            # (its latency measured) instead of being cut into a 504 at the deadline itself.
            "request_deadline_s": 2 * FAIR_DEADLINE_S,
        },
    )
    cancel = copy.deepcopy(fair)
    cancel.update(name="cancel", route_prefix="/cancel")
    cancel["args"].update(
        max_documents=BURST_DOCUMENTS,
        max_request_tokens=1_000_000,
        scorer={**cancel["args"].get("scorer", {}), "max_batch_tokens": CANCEL_FORWARD_TOKENS},
    )
    cancel["deployments"][0]["user_config"] = {
        "max_batch_size": 4,
        "batch_wait_timeout_s": 0.005,
        "admission_deadline_s": 60,
        "request_deadline_s": 110,
    }
    every = {"main": main, "guarded": guarded, "burst": burst, "fair": fair, "cancel": cancel}
    config["applications"] = [main] + [every[name] for name in apps if name != "main"]
    return config


def expected(scorer: Scorer, context: AgentContext, documents, mode="auto") -> np.ndarray:
    return scorer.score(context, documents, mode).astype(np.float64)


def tokens_scored(scorer: Scorer, context: AgentContext, documents, mode="auto") -> int:
    """How many tokens the scorer really scores for this search (its ``stats.real_tokens``)."""
    before = scorer.stats.real_tokens
    scorer.score(context, documents, mode)
    return scorer.stats.real_tokens - before


def assert_ranked_like(indices: list[int], scores: np.ndarray, top_n: int | None = None):
    """``indices`` are the best ``top_n`` of ``scores``, best first (ties within 1e-5)."""
    assert len(indices) == (len(scores) if top_n is None else min(top_n, len(scores)))
    assert len(set(indices)) == len(indices)
    ranked = scores[indices]
    assert np.all(np.diff(ranked) <= 1e-5), ranked
    left_out = np.delete(scores, indices)
    if left_out.size:
        assert ranked.min() >= left_out.max() - 1e-5
