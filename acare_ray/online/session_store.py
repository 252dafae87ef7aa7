"""The Serve deployment that holds an application's session memory (one replica).

Why here: every reranker replica of an app must see the same sessions, or an agent whose next
search lands on another replica gets its seen pages again. One small replica of this deployment
per application is that shared place: Serve names it per app, starts it with the app, restarts it
if it dies (the memory is lost then: sessions are soft state, and clients that must not lose it
send ``seen_ids``) and deletes it with the app, so nothing outlives the application (a detached
actor would). It costs one round trip per read or write, far below a rerank.
"""

from __future__ import annotations

from typing import Any

from ray import serve

from acare_ray.search.sessions import LocalSessions, SessionLimits, SessionMemory


@serve.deployment(num_replicas=1, max_ongoing_requests=1000, ray_actor_options={"num_cpus": 0})
class SessionStore(LocalSessions):
    """A :class:`SessionMemory` (its methods, those of :class:`LocalSessions`, run on the
    replica's event loop, one at a time)."""

    def __init__(self, limits: dict[str, Any]) -> None:
        super().__init__(SessionMemory(SessionLimits(**limits)))

    async def counts(self) -> dict[str, int]:
        return self.memory.counts()
