"""The error policy of every scoring caller: score all, else each alone.

The offline jobs, the online service and training validation score through
:func:`score_isolated`, so one bad search (or one that runs the device out of memory) fails
alone and the others are scored as if it had not been there.
"""

from __future__ import annotations

import gc
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch

from acare_ray.scoring.backend import CancelFn, Cancelled
from acare_ray.scoring.context import AUTO, AgentContext, Mode

if TYPE_CHECKING:
    from acare_ray.scoring.scorer import Scorer


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
    items = list(items)
    if not items:
        return []
    return _isolate(scorer, items, mode, cancel)


def _score_call(
    scorer: Scorer, items: list, mode: str | Mode, cancel: CancelFn | None
) -> list[np.ndarray]:
    if cancel is None:
        return list(scorer.score_many(items, mode))
    return list(scorer.score_many(items, mode, cancel=cancel))


def _isolate(
    scorer: Scorer, items: list, mode: str | Mode, cancel: CancelFn | None
) -> list[np.ndarray | Exception]:
    try:
        return _score_call(scorer, items, mode, cancel)
    except Cancelled:
        raise
    except Exception as err:
        if is_out_of_memory(err):
            _free_device_memory()
        if len(items) == 1:
            return [err]
        if is_out_of_memory(err):
            half = (len(items) + 1) // 2
            return _isolate(scorer, items[:half], mode, cancel) + _isolate(
                scorer, items[half:], mode, cancel
            )
    out: list[np.ndarray | Exception] = []
    for item in items:
        try:
            out.extend(_score_call(scorer, [item], mode, cancel))
        except Cancelled:
            raise
        except Exception as err:
            if is_out_of_memory(err):
                _free_device_memory()
            out.append(err)
    return out
