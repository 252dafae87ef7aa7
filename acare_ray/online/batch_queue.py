"""What the replica's batch queue holds and how a batch is sized: a :class:`Pending` job per
request, ``batch_slots`` for ``@serve.batch``'s ``batch_size_fn``, and :class:`BatchStats`."""

import math
import threading
import time
from dataclasses import dataclass, field

from acare_ray.online.replica_models import ModelSlot
from acare_ray.online.service import ScoringJob


@dataclass
class Pending:
    """A job waiting in the batch queue, with the token size of one batch slot at enqueue time.

    ``cancelled`` is set once nobody waits for the answer; ``started`` once a batch took the
    job; ``release`` (idempotent) returns its admission share and its hold on ``model``."""

    job: ScoringJob
    tokens_per_slot: float
    client: str = "anonymous"
    cancelled: threading.Event = field(default_factory=threading.Event)
    started: bool = False
    released: bool = False
    enqueued: float = field(default_factory=time.monotonic)
    model: ModelSlot | None = None


def batch_slots(items: list[Pending]) -> int:
    """Effective batch size in request slots: ``batch_size_fn`` for ``@serve.batch``.

    A slot is ``max_batch_tokens / max_batch_size`` tokens, so the batch closes when it holds
    ``max_batch_size`` requests or ``max_batch_tokens`` tokens, whichever comes first. Keeping
    the unit "requests" (not raw tokens) keeps ``max_ongoing_requests >= max_batch_size``
    meaningful. A request alone always fits; the scorer splits it by its own token budget.
    """
    if len(items) == 1:
        return 1
    tokens = sum(item.job.tokens for item in items)
    return max(len(items), math.ceil(tokens / items[0].tokens_per_slot))


@dataclass
class BatchStats:
    batches: int = 0
    requests: int = 0
    largest: int = 0
    cancelled: int = 0

    def record(self, size: int) -> None:
        self.batches += 1
        self.requests += size
        self.largest = max(self.largest, size)
