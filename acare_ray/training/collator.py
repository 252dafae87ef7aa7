"""Training groups -> model inputs: reading, the session split, epoch order, dropout, tokens.

A group is one prompt (sub-query + optional question and reasoning) and ``group_size``
documents, the positive first. Context dropout (:class:`acare_ray.context.FieldDropout`) is drawn
once per group, so all documents of a group share one prompt, and the mode rendered is the
richest mode the surviving fields allow (its instruction comes with it). Tokens come from the
scoring core itself: the causal backend's :class:`~acare_ray.prompt.PromptEncoder` (shared
prefix + ``" " + document`` + suffix, field caps, document budget) and the cross-encoder's
``encode``, so training sees exactly the inputs that inference scores.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from acare_ray.causal_lm import pad_right
from acare_ray.context import AgentContext, FieldDropout, Mode
from acare_ray.schema import TRAINING_GROUPS, Group, RowError, parse_group

NEMO_SUFFIXES = (".jsonl", ".json")

logger = logging.getLogger(__name__)


def read_groups(path: str | os.PathLike) -> pa.Table:
    """A ``TRAINING_GROUPS`` table from Parquet (file or folder) or NeMo JSONL (by suffix).

    A relabel job's output (Parquet with a ``status`` column, one row per search) is read as its
    ``status == "ok"`` rows; the other rows are searches that gave no group, and how many of each
    status were left out is logged.
    """
    text = os.fspath(path)
    local = "://" not in text
    if local and not Path(text).exists():
        raise FileNotFoundError(f"training data not found: {text}")
    if Path(text).suffix in NEMO_SUFFIXES:
        from acare_ray.data.nemo import read_nemo_jsonl

        return read_nemo_jsonl(text)
    from acare_ray.data.io import read_parquet

    table = read_parquet(text, TRAINING_GROUPS)
    if "status" not in table.column_names:
        return table
    from acare_ray.data.groups import ok_groups

    groups, left_out = ok_groups(table)
    if left_out:
        logger.info(
            "%s: relabel output, training on %d ok rows; left out %s",
            text,
            groups.num_rows,
            ", ".join(f"{n} {s}" for s, n in sorted(left_out.items(), key=str)),
        )
    return groups


def parse_groups(table: pa.Table, group_size: int) -> list[Group]:
    """Validated groups, each cut to its first ``group_size - 1`` negatives.

    Raises :class:`RowError` naming the group for a bad row, a group with too few negatives, or
    a repeated ``group_id`` (dropout draws are keyed by it).
    """
    groups, seen = [], set()
    for index, row in enumerate(table.to_pylist()):
        group = parse_group(row, index)
        if group.group_id in seen:
            raise RowError(f"group_id={group.group_id}: appears more than once")
        seen.add(group.group_id)
        needed = group_size - 1
        if len(group.negatives) < needed:
            raise RowError(
                f"group_id={group.group_id}: negatives has {len(group.negatives)} documents, "
                f"group_size={group_size} needs {needed}"
            )
        groups.append(replace(group, negatives=group.negatives[:needed]))
    if not groups:
        raise ValueError("no training groups in the data")
    return groups


def split_by_session(
    groups: Sequence[Group], val_fraction: float, seed: int = 0
) -> tuple[list[Group], list[Group]]:
    """(train, validation): a seeded ``val_fraction`` of the sessions, never split across sides."""
    if val_fraction == 0:
        return list(groups), []
    sessions = sorted({g.session_id for g in groups})
    if len(sessions) < 2:
        raise ValueError(f"cannot split {len(sessions)} session(s) into train and validation")
    count = min(len(sessions) - 1, max(1, math.ceil(val_fraction * len(sessions))))
    held = set(np.random.default_rng([seed, 1]).permutation(sessions)[:count].tolist())
    return [g for g in groups if g.session_id not in held], [
        g for g in groups if g.session_id in held
    ]


def epoch_order(n_groups: int, seed: int, epoch: int) -> np.ndarray:
    """The order groups are visited in during ``epoch``: a permutation fixed by (seed, epoch)."""
    return np.random.default_rng([seed, epoch, 0]).permutation(n_groups)


@dataclass
class CausalBatch:
    """Inputs of :class:`~acare_ray.causal_lm.PrefixSharedYesNo`: one prefix row per group."""

    prefix_ids: torch.Tensor  # [G, P] right-padded
    prefix_mask: torch.Tensor  # [G, P] bool
    doc_ids: torch.Tensor  # [G * group_size, D] document + suffix ids, right-padded
    doc_lengths: torch.Tensor  # [G * group_size]
    doc_group: torch.Tensor  # [G * group_size] prefix row of each document
    modes: list[Mode]

    def inputs(self) -> tuple[torch.Tensor, ...]:
        return self.prefix_ids, self.prefix_mask, self.doc_ids, self.doc_lengths, self.doc_group

    def to(self, device: torch.device) -> CausalBatch:
        return _to(self, device)


@dataclass
class PairBatch:
    """Inputs of a cross-encoder: (context block, document) pair ids, groups laid out in turn."""

    ids: torch.Tensor  # [G * group_size, L] right-padded
    lengths: torch.Tensor  # [G * group_size]
    modes: list[Mode]

    def inputs(self) -> tuple[torch.Tensor, ...]:
        return self.ids, self.lengths

    def to(self, device: torch.device) -> PairBatch:
        return _to(self, device)


Batch = CausalBatch | PairBatch


def _to(batch: Any, device: torch.device) -> Any:
    moved = {
        f.name: getattr(batch, f.name).to(device)
        for f in fields(batch)
        if isinstance(getattr(batch, f.name), torch.Tensor)
    }
    return replace(batch, **moved)


class GroupCollator:
    """Groups of one epoch -> a :class:`CausalBatch` or :class:`PairBatch` (positive first).

    ``backend`` is a scorer backend (``Scorer.backend``); its tokenizer, field caps and length
    limits are the ones inference uses.
    """

    def __init__(self, backend: Any, group_size: int, dropout: FieldDropout) -> None:
        if backend.name not in ("causal_lm", "cross_encoder"):
            raise ValueError(f"no collator for backend {backend.name!r}")
        self.backend = backend
        self.group_size = group_size
        self.dropout = dropout

    def prompt(self, group: Group, epoch: int) -> tuple[AgentContext, Mode]:
        """The group's context after dropout in ``epoch``, and the mode it renders in."""
        context = self.dropout.apply(group.context, group.group_id, epoch)
        return context, context.richest_mode

    def documents(self, group: Group) -> list[str]:
        docs = [group.positive, *group.negatives[: self.group_size - 1]]
        if len(docs) != self.group_size:
            raise RowError(
                f"group_id={group.group_id}: has {len(docs)} documents, "
                f"group_size={self.group_size}"
            )
        return [d.text for d in docs]

    def __call__(self, groups: Sequence[Group], epoch: int) -> Batch:
        if not groups:
            raise ValueError("cannot collate an empty list of groups")
        prompts = [self.prompt(g, epoch) for g in groups]
        docs = [self.documents(g) for g in groups]
        if self.backend.name == "causal_lm":
            return self._causal(prompts, docs)
        return self._pairs(prompts, docs)

    def _causal(
        self, prompts: list[tuple[AgentContext, Mode]], docs: list[list[str]]
    ) -> CausalBatch:
        encoder = self.backend.encoder
        prefixes = [encoder.prefix_ids(context, mode) for context, mode in prompts]
        budgets = [encoder.document_budget(len(p)) for p, d in zip(prefixes, docs) for _ in d]
        flat = [text for group_docs in docs for text in group_docs]
        seqs = [ids + encoder.suffix_ids for ids in encoder.document_ids(flat, budgets)]
        pad_id = encoder.tokenizer.pad_token_id or 0
        prefix_ids, prefix_lengths = pad_right(prefixes, pad_id)
        steps = torch.arange(prefix_ids.shape[1])
        doc_ids, doc_lengths = pad_right(seqs, pad_id)
        return CausalBatch(
            prefix_ids=prefix_ids,
            prefix_mask=steps[None, :] < prefix_lengths[:, None],
            doc_ids=doc_ids,
            doc_lengths=doc_lengths,
            doc_group=torch.arange(len(prefixes)).repeat_interleave(self.group_size),
            modes=[mode for _, mode in prompts],
        )

    def _pairs(self, prompts: list[tuple[AgentContext, Mode]], docs: list[list[str]]) -> PairBatch:
        searches = [(ctx, mode, group_docs) for (ctx, mode), group_docs in zip(prompts, docs)]
        encoded = self.backend.encode(searches)
        ids, lengths = pad_right(encoded, self.backend.tokenizer.pad_token_id or 0)
        return PairBatch(ids=ids, lengths=lengths, modes=[mode for _, mode in prompts])
