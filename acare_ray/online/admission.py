"""Admission by expected wait: refuse at once the work a replica cannot start in time.

A replica scores its batches one after another, so a new request waits for every request
admitted before it and not yet finished. :class:`Admission` keeps

- the *work ahead*: the token cost (:attr:`ScoringJob.tokens`) of every admitted, unfinished
  request, the running batch included;
- the replica's *throughput* in those same tokens per second: each finished batch is one sample
  (its tokens / its model time); the estimate is the ratio of exponentially decayed sums of
  tokens and seconds over recent batches (a long batch weighs more than a short one), and
  before the first batch a configured, conservative ``prior_tokens_per_s``.

A request's expected start is the work ahead, less what the running batch has probably done
already, divided by the throughput. If that is later than ``deadline_s`` the request is refused
(:class:`Overloaded`: HTTP 503 with ``Retry-After``) instead of queueing for a proxy timeout;
otherwise its tokens join the work ahead until it finishes. The request's own size does not
enter its start time, so a replica with nothing ahead admits any request (the per-request
token cap, :class:`~acare_ray.online.service.Limits`, bounds what that can be). ``Retry-After``
is the time until the work ahead should have shrunk to the deadline, at least 1 s.

Fairness: each client (an API key, or the client address when the app is open) may hold at
most ``client_share`` of the deadline's worth of work ahead. A client that already has work
queued and whose work with the new request would pass its share is refused with
:class:`RateLimited` (HTTP 429 with ``Retry-After``), so one client sending maximal requests
cannot fill the queue to the deadline and push everyone else out: another client's request
waits for at most that share, one request and its own work.

Pure Python, no Ray: the deployment calls :meth:`Admission.admit` / :meth:`Admission.done` per
request and :meth:`Admission.batch_started` / :meth:`Admission.batch_finished` per batch.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

DEFAULT_DECAY = 0.7


class Overloaded(Exception):
    """A request refused because the work ahead would start it after the admission deadline."""

    status = 503

    def __init__(self, expected_wait_s: float, deadline_s: float, retry_after_s: int) -> None:
        self.expected_wait_s = expected_wait_s
        self.deadline_s = deadline_s
        self.retry_after_s = retry_after_s
        self.message = (
            f"overloaded: the work queued ahead would start this request in about "
            f"{expected_wait_s:.1f} s, later than the admission deadline of {deadline_s:g} s; "
            f"retry after {retry_after_s} s"
        )
        super().__init__(self.message)


class RateLimited(Overloaded):
    """A request refused because its client's own work ahead would pass its fair share."""

    status = 429

    def __init__(self, expected_wait_s: float, share_s: float, retry_after_s: int) -> None:
        super().__init__(expected_wait_s, share_s, retry_after_s)
        self.message = (
            f"rate limited: this client's requests queued ahead and this one would take about "
            f"{expected_wait_s:.1f} s, over its share of {share_s:.1f} s of this replica's "
            f"queue; retry after {retry_after_s} s"
        )
        self.args = (self.message,)


@dataclass(frozen=True)
class Decision:
    """The verdict on one request: ``retry_after_s`` is 0 when it was admitted; ``share_s`` is
    set when the client's fair share refused it (:class:`RateLimited`)."""

    admitted: bool
    expected_wait_s: float
    retry_after_s: int = 0
    share_s: float | None = None

    def refusal(self, deadline_s: float) -> Overloaded:
        if self.share_s is not None:
            return RateLimited(self.expected_wait_s, self.share_s, self.retry_after_s)
        return Overloaded(self.expected_wait_s, deadline_s, self.retry_after_s)


class Admission:
    """Work ahead and throughput of one replica; see the module docstring.

    ``decay`` is the weight an older batch keeps each time a new one is measured (0: only the
    last batch counts). Times are ``time.monotonic()`` seconds unless ``now`` is given.
    """

    def __init__(
        self,
        deadline_s: float,
        prior_tokens_per_s: float,
        decay: float = DEFAULT_DECAY,
        client_share: float = 1.0,
    ) -> None:
        if not 0 <= decay < 1:
            raise ValueError(f"decay must be in [0, 1), got {decay}")
        self.decay = decay
        self.configure(deadline_s, prior_tokens_per_s, client_share)
        self.queued_tokens = 0
        self.queued_requests = 0
        self.admitted = 0
        self.refused = 0
        self.rate_limited = 0
        self._client_tokens: dict[str, int] = {}
        self._sample_tokens = 0.0
        self._sample_seconds = 0.0
        self._running_tokens = 0
        self._running_since: float | None = None

    def configure(
        self, deadline_s: float, prior_tokens_per_s: float, client_share: float = 1.0
    ) -> None:
        """New settings; the throughput measured so far and the work ahead are kept."""
        if deadline_s <= 0 or prior_tokens_per_s <= 0:
            raise ValueError("deadline_s and prior_tokens_per_s must be positive")
        if not 0 < client_share <= 1:
            raise ValueError(f"client_share must be in (0, 1], got {client_share}")
        self.deadline_s = float(deadline_s)
        self.prior_tokens_per_s = float(prior_tokens_per_s)
        self.client_share = float(client_share)

    @property
    def measured(self) -> bool:
        return self._sample_seconds > 0

    @property
    def tokens_per_s(self) -> float:
        """Recent throughput; the prior until a batch has been measured."""
        if not self.measured:
            return self.prior_tokens_per_s
        return self._sample_tokens / self._sample_seconds

    def expected_wait_s(self, now: float | None = None) -> float:
        """When a request arriving now would start: the work ahead over the throughput."""
        rate = self.tokens_per_s
        ahead = float(self.queued_tokens)
        if self._running_since is not None:
            now = time.monotonic() if now is None else now
            ahead -= min(self._running_tokens, max(0.0, now - self._running_since) * rate)
        return max(ahead, 0.0) / rate

    def refusal_wait_s(self, clients: int = 1) -> float:
        """The expected wait at which this replica starts refusing the requests of ``clients``
        clients sharing it evenly: the deadline, or the clients' shares of it together when
        those are less (one client alone is refused past its share)."""
        if clients < 1:
            raise ValueError(f"clients must be at least 1, got {clients}")
        return min(self.deadline_s, self.client_share * self.deadline_s * clients)

    def check(self, now: float | None = None) -> Decision:
        """The verdict for a request arriving now, changing nothing."""
        wait = self.expected_wait_s(now)
        if wait <= self.deadline_s:
            return Decision(True, wait)
        return Decision(False, wait, max(1, math.ceil(wait - self.deadline_s)))

    def screen(self, client: str | None = None, now: float | None = None) -> Decision:
        """:meth:`check` before a request is read, counting a refusal: a replica already over
        its deadline, or a ``client`` already holding its whole share, is refused without
        parsing or tokenizing the body (the final verdict is :meth:`admit`)."""
        decision = self.check(now)
        if decision.admitted and client is not None:
            decision = self._share(client, 0)
        if not decision.admitted:
            self.refused += 1
        return decision

    def _share(self, client: str, tokens: int) -> Decision:
        """Admitted unless ``client``'s queued work plus ``tokens`` passes its share of the
        deadline (a client with nothing queued always passes: any one request fits)."""
        own = self._client_tokens.get(client, 0)
        if self.client_share >= 1 or own <= 0:
            return Decision(True, 0.0)
        own_s = (own + tokens) / self.tokens_per_s
        share_s = self.client_share * self.deadline_s
        if tokens == 0 and own_s < share_s or tokens > 0 and own_s <= share_s:
            return Decision(True, 0.0)
        self.rate_limited += 1
        return Decision(False, own_s, max(1, math.ceil(own_s - share_s)), share_s)

    def admit(self, tokens: int, client: str | None = None, now: float | None = None) -> Decision:
        """Admit a request of ``tokens`` from ``client`` if it can start by the deadline and
        stays within the client's share; then call :meth:`done` with the same arguments."""
        decision = self.check(now)
        if decision.admitted and client is not None:
            decision = self._share(client, tokens)
        if decision.admitted:
            self.queued_tokens += tokens
            self.queued_requests += 1
            self.admitted += 1
            if client is not None:
                self._client_tokens[client] = self._client_tokens.get(client, 0) + tokens
        else:
            self.refused += 1
        return decision

    def done(self, tokens: int, client: str | None = None) -> None:
        """An admitted request finished: answered, failed or cancelled (and its work stopped)."""
        self.queued_tokens = max(0, self.queued_tokens - tokens)
        self.queued_requests = max(0, self.queued_requests - 1)
        if client is not None and client in self._client_tokens:
            left = self._client_tokens[client] - tokens
            if left > 0:
                self._client_tokens[client] = left
            else:
                del self._client_tokens[client]

    def batch_started(self, tokens: int, now: float | None = None) -> None:
        self._running_tokens = tokens
        self._running_since = time.monotonic() if now is None else now

    def batch_finished(self, tokens: int, seconds: float) -> None:
        """A batch of ``tokens`` took ``seconds`` of model time: one throughput sample."""
        self._running_tokens = 0
        self._running_since = None
        if tokens <= 0 or seconds <= 0:
            return
        self._sample_tokens = self.decay * self._sample_tokens + tokens
        self._sample_seconds = self.decay * self._sample_seconds + seconds

    def snapshot(self, now: float | None = None) -> dict[str, Any]:
        """What ``/v1/status`` reports."""
        return {
            "deadline_s": self.deadline_s,
            "tokens_per_s": round(self.tokens_per_s, 1),
            "measured": self.measured,
            "queued_requests": self.queued_requests,
            "queued_tokens": self.queued_tokens,
            "expected_wait_s": round(self.expected_wait_s(now), 3),
            "admitted": self.admitted,
            "refused": self.refused,
            "rate_limited": self.rate_limited,
            "client_share": self.client_share,
            "clients_queued": len(self._client_tokens),
        }
