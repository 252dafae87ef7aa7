"""Failure isolation and cancellation in the scoring core (issue 21.4 and 21.3).

``score_isolated`` is the one error policy of the online service, the offline jobs and training
validation; ``cancel`` is the hook the online deployment uses to stop a batch nobody waits for.
"""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest
import torch

from acare_ray.scoring import AgentContext, Cancelled, is_out_of_memory, score_isolated
from acare_ray.scoring.batching import plan_batches

DOCS = ["Paris is the capital of France.", "Berlin is in Germany.", "A river runs through it."]


class _Recording:
    """A scorer double: fails any call holding more than ``fits`` items with ``error``, and any
    call holding a search whose documents include ``"bad"`` with a RuntimeError."""

    def __init__(self, fits: int = 10**9, error: Exception | None = None) -> None:
        self.fits = fits
        self.error = error
        self.calls: list[int] = []

    def score_many(self, items, mode, cancel=None):
        self.calls.append(len(items))
        if len(items) > self.fits:
            raise self.error
        for _, docs in items:
            if "bad" in docs:
                raise RuntimeError("kernel failed")
        return [np.full(len(docs), float(len(docs)), dtype=np.float32) for _, docs in items]


def searches(n: int, bad: tuple[int, ...] = ()) -> list:
    return [(AgentContext(f"q{i}"), ["bad"] if i in bad else ["a"] * (i + 1)) for i in range(n)]


@pytest.mark.parametrize(
    "error",
    [
        torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
        MemoryError(),
        RuntimeError("MPS backend out of memory"),
    ],
)
def test_out_of_memory_is_retried_at_a_smaller_batch_not_one_by_one(error):
    """Pins issue 21.4: an out-of-memory error used to fail the whole batch (only ValueError was
    isolated). Now the call is halved until it fits; every search gets its scores."""
    assert is_out_of_memory(error)
    scorer = _Recording(fits=2, error=error)
    out = score_isolated(scorer, searches(8), "M0")
    assert all(isinstance(r, np.ndarray) for r in out), out
    assert [float(r[0]) for r in out] == [float(i + 1) for i in range(8)]
    assert scorer.calls == [8, 4, 2, 2, 4, 2, 2]


def test_any_exception_fails_only_its_own_search():
    """Pins issue 21.4: a RuntimeError in one search used to fail every request of its batch."""
    scorer = _Recording()
    out = score_isolated(scorer, searches(4, bad=(2,)), "M0")
    assert [type(r) for r in out] == [np.ndarray, np.ndarray, RuntimeError, np.ndarray]
    assert scorer.calls == [4, 1, 1, 1, 1]


def test_a_search_that_runs_out_of_memory_alone_fails_alone():
    scorer = _Recording(fits=0, error=MemoryError("host"))
    out = score_isolated(scorer, searches(3), "M0")
    assert all(isinstance(r, MemoryError) for r in out)


def test_cancelled_is_never_isolated():
    class Stopping(_Recording):
        def score_many(self, items, mode, cancel=None):
            raise Cancelled("scoring cancelled")

    with pytest.raises(Cancelled):
        score_isolated(Stopping(), searches(3), "M0")


@pytest.mark.parametrize("backend", ["tiny_scorer", "minilm_scorer"])
def test_cancel_stops_scoring_between_forward_passes(request, monkeypatch, backend):
    """Pins issue 21.3 (a cancelled request kept the model thread working): ``cancel`` is asked
    before every forward pass, and the first true answer stops the call there."""
    scorer = request.getfixturevalue(backend)
    # Two candidates per forward pass, so the search takes nine.
    monkeypatch.setattr(scorer.backend, "plan", partial(plan_batches, max_tokens=10**6, max_rows=2))
    docs = [f"{doc} {i}" for i in range(6) for doc in DOCS]
    context = AgentContext("capital of France")
    asked = []

    def cancel() -> bool:
        asked.append(scorer.stats.computed_tokens)
        return len(asked) > 1

    before = scorer.stats.computed_tokens
    with pytest.raises(Cancelled):
        scorer.score(context, docs, "M0", cancel=cancel)
    assert len(asked) == 2
    # Only the work before the second check ran: at most one forward pass (plus a prefix).
    assert asked[1] > before
    assert scorer.stats.computed_tokens == asked[1]
    np.testing.assert_allclose(
        scorer.score(context, docs, "M0", cancel=lambda: False), scorer.score(context, docs, "M0")
    )


@pytest.mark.parametrize("backend", ["tiny_scorer", "minilm_scorer"])
def test_score_isolated_passes_cancel_through(request, backend):
    scorer = request.getfixturevalue(backend)
    with pytest.raises(Cancelled):
        score_isolated(scorer, [(AgentContext("q"), DOCS)], "M0", cancel=lambda: True)
