"""The error policy of every scoring caller: score all, else each alone.

The offline jobs, the online service and training validation score through
:func:`score_isolated`, so one bad search (or one that runs the device out of memory) fails
alone and the others are scored as if it had not been there.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, TypeVar

import numpy as np
import torch

from acare_ray.scoring.backend import CancelFn, Cancelled, ScoredSearch
from acare_ray.scoring.context import AUTO, AgentContext, Mode
from acare_ray.scoring.untrusted import Document

if TYPE_CHECKING:
    from acare_ray.scoring.scorer import Scorer

T = TypeVar("T")
R = TypeVar("R")


def is_out_of_memory(err: BaseException) -> bool:
    """Whether ``err`` says the device (or the host) ran out of memory."""
    kinds = tuple(
        kind
        for kind in (getattr(torch, "OutOfMemoryError", None), torch.cuda.OutOfMemoryError)
        if isinstance(kind, type)
    )
    if isinstance(err, (MemoryError, *kinds)):
        return True
    return isinstance(err, RuntimeError) and "out of memory" in str(err).lower()


def _free_device_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def score_isolated(
    scorer: Scorer,
    items: Sequence[tuple[AgentContext, Sequence[str]]],
    mode: str | Mode = AUTO,
    cancel: CancelFn | None = None,
) -> list[np.ndarray | Exception]:
    """``score_many`` over all items in one call, failing only the items at fault.

    The one error-isolation policy of the offline jobs, the online service and training
    validation: any ``Exception`` is isolated per item (its exception takes its place in the
    result). A call that ran out of memory (:func:`is_out_of_memory`) is retried as two halves,
    each halved again while it still runs out, down to single items; any other error has each
    item scored alone. :class:`~acare_ray.scoring.backend.Cancelled` (``cancel`` said stop) is never
    isolated: it propagates, and no item is retried.
    """
    stop = {} if cancel is None else {"cancel": cancel}
    return _isolate(lambda part: scorer.score_many(part, mode, **stop), list(items))


def score_resolved_isolated(
    scorer: Scorer,
    searches: Sequence[tuple[AgentContext, Mode, Sequence[Document]]],
    cancel: CancelFn | None = None,
) -> list[ScoredSearch | Exception]:
    """:meth:`Scorer.score_resolved` under the same policy as :func:`score_isolated` (the
    online service: modes chosen when the request was checked, usage read from the result)."""
    stop = {} if cancel is None else {"cancel": cancel}
    return _isolate(lambda part: scorer.score_resolved(part, **stop), list(searches))


def _isolate(call: Callable[[list[T]], Sequence[R]], items: list[T]) -> list[R | Exception]:
    if not items:
        return []
    try:
        return list(call(items))
    except Cancelled:
        raise
    except Exception as err:
        if is_out_of_memory(err):
            _free_device_memory()
        if len(items) == 1:
            return [err]
        if is_out_of_memory(err):
            half = (len(items) + 1) // 2
            return _isolate(call, items[:half]) + _isolate(call, items[half:])
    out: list[R | Exception] = []
    for item in items:
        try:
            out.extend(call([item]))
        except Cancelled:
            raise
        except Exception as err:
            if is_out_of_memory(err):
                _free_device_memory()
            out.append(err)
    return out
