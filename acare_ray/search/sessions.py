"""Session memory: which documents ``/v1/search`` has returned to each session, bounded.

A session is (client, session id): the client is the API key the request came with (or its
address on an open app), so two keys never see each other's sessions even with the same id.
Bounds: a session unused for ``ttl_s`` is forgotten; a client keeps at most
``max_sessions_per_client`` sessions (the least recently used goes first); at most
``max_clients`` clients are kept (likewise); a session remembers at most ``max_seen`` ids (the
oldest go first). Pure Python and single-threaded; in Serve one
:class:`acare_ray.online.session_store.SessionStore` replica holds it for every replica of the app
(docs/agents.md says why).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class SessionLimits:
    ttl_s: float = 3600.0
    max_sessions_per_client: int = 1000
    max_clients: int = 1000
    max_seen: int = 10_000

    def __post_init__(self) -> None:
        for name in ("ttl_s", "max_sessions_per_client", "max_clients", "max_seen"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")


class _Session:
    __slots__ = ("ids", "touched")

    def __init__(self, now: float) -> None:
        self.ids: OrderedDict[str, None] = OrderedDict()
        self.touched = now


class SessionMemory:
    """See the module docstring; ``clock`` is for tests."""

    def __init__(
        self, limits: SessionLimits | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.limits = limits or SessionLimits()
        self.clock = clock
        self._clients: OrderedDict[str, OrderedDict[str, _Session]] = OrderedDict()

    def _expire(self, now: float) -> None:
        cutoff = now - self.limits.ttl_s
        for client in list(self._clients):
            sessions = self._clients[client]
            while sessions:
                key = next(iter(sessions))
                if sessions[key].touched > cutoff:
                    break
                del sessions[key]
            if not sessions:
                del self._clients[client]

    def _get(self, client: str, session_id: str, create: bool) -> _Session | None:
        now = self.clock()
        self._expire(now)
        sessions = self._clients.get(client)
        if sessions is None:
            if not create:
                return None
            sessions = self._clients[client] = OrderedDict()
            while len(self._clients) > self.limits.max_clients:
                self._clients.popitem(last=False)
        self._clients.move_to_end(client)
        session = sessions.get(session_id)
        if session is None:
            if not create:
                return None
            session = sessions[session_id] = _Session(now)
            while len(sessions) > self.limits.max_sessions_per_client:
                sessions.popitem(last=False)
        sessions.move_to_end(session_id)
        session.touched = now
        return session

    def seen(self, client: str, session_id: str) -> list[str]:
        """The ids returned to the session so far, oldest first (empty for an unknown one)."""
        session = self._get(client, session_id, create=False)
        return list(session.ids) if session else []

    def remember(self, client: str, session_id: str, doc_ids: Iterable[str]) -> None:
        session = self._get(client, session_id, create=True)
        for doc_id in doc_ids:
            session.ids[doc_id] = None
            session.ids.move_to_end(doc_id)
        while len(session.ids) > self.limits.max_seen:
            session.ids.popitem(last=False)

    def forget(self, client: str, session_id: str) -> bool:
        """Drop the session; whether it existed."""
        self._expire(self.clock())
        sessions = self._clients.get(client)
        if not sessions or session_id not in sessions:
            return False
        del sessions[session_id]
        if not sessions:
            del self._clients[client]
        return True

    def counts(self) -> dict[str, int]:
        self._expire(self.clock())
        return {
            "clients": len(self._clients),
            "sessions": sum(len(s) for s in self._clients.values()),
        }


class LocalSessions:
    """A :class:`SessionMemory` in this process (one replica, or tests)."""

    def __init__(self, memory: SessionMemory | None = None) -> None:
        self.memory = memory or SessionMemory()

    async def seen(self, client: str, session_id: str) -> list[str]:
        return self.memory.seen(client, session_id)

    async def remember(self, client: str, session_id: str, doc_ids: list[str]) -> None:
        self.memory.remember(client, session_id, doc_ids)

    async def forget(self, client: str, session_id: str) -> bool:
        return self.memory.forget(client, session_id)
