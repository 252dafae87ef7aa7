"""Cutting candidates into forward passes: the token-budget planner and right-padding."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import fields, replace
from typing import Any

import numpy as np
import torch

BatchPlan = Callable[[list[int]], list[np.ndarray]]
"""Sequence lengths in, batches of indices out (:func:`plan_batches` with its budget bound)."""


def plan_batches(
    lengths: Sequence[int], max_tokens: int, max_rows: int, overhead_tokens: int = 128
) -> list[np.ndarray]:
    """Cut candidates into batches of indices under a token budget, with little padding.

    Candidates are sorted longest first; each batch is a run of that order whose padded size
    (rows x longest) stays within ``max_tokens`` (a single candidate over the budget gets a batch
    of its own) and ``max_rows``. Among those cuts, dynamic programming picks the one that
    minimises padded tokens + ``overhead_tokens`` per forward call, so batches stay large when
    lengths are similar and split where padding would waste more than another call costs.
    Callers scatter results back by index, which restores input order.
    """
    order = np.argsort(-np.asarray(lengths, dtype=np.int64), kind="stable")
    widths = np.asarray(lengths, dtype=np.int64)[order]
    n = len(order)
    best = np.zeros(n + 1, dtype=np.float64)
    cut = np.zeros(n + 1, dtype=np.int64)
    for end in range(1, n + 1):
        starts = np.arange(max(0, end - max_rows), end)
        rows = end - starts
        cost = best[starts] + rows * widths[starts] + overhead_tokens
        cost[(rows * widths[starts] > max_tokens) & (rows > 1)] = np.inf
        pick = int(np.argmin(cost))
        best[end], cut[end] = cost[pick], starts[pick]
    batches, end = [], n
    while end > 0:
        batches.append(order[cut[end] : end])
        end = cut[end]
    return batches[::-1]


def pad_right(rows: list[list[int]], pad_id: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``[N, max_len]`` right-padded ids and ``[N]`` lengths."""
    lengths = np.fromiter((len(r) for r in rows), dtype=np.int64, count=len(rows))
    out = np.full((len(rows), int(lengths.max())), pad_id, dtype=np.int64)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return torch.from_numpy(out), torch.from_numpy(lengths)


def move_tensors(batch: Any, device: torch.device) -> Any:
    """A copy of dataclass ``batch`` with its tensor fields on ``device``."""
    moved = {
        f.name: getattr(batch, f.name).to(device)
        for f in fields(batch)
        if isinstance(getattr(batch, f.name), torch.Tensor)
    }
    return replace(batch, **moved)
