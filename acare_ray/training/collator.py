"""Training groups -> model inputs: context dropout and tokens.

Reading the groups, the session split and the epoch order are in
:mod:`acare_ray.training.groups`. A group is one prompt (sub-query + optional question and
reasoning) and ``group_size`` documents, the positive first. Context dropout
(:class:`acare_ray.scoring.context.FieldDropout`) is drawn once per group, so all documents of a
group share one prompt, and the mode rendered is the richest mode the surviving fields allow
(its instruction comes with it). Tokens come from the scoring core itself
(``backend.collate_groups``: the causal backend's
:class:`~acare_ray.scoring.prompt.PromptEncoder`, the cross-encoder's pair layout), so training
sees exactly the inputs that inference scores.
"""

from __future__ import annotations

from collections.abc import Sequence

from acare_ray.data.schema import Group, RowError
from acare_ray.scoring import AgentContext, Backend, FieldDropout, Mode
from acare_ray.scoring.causal.backend import CausalBatch
from acare_ray.scoring.cross_encoder import PairBatch

# The backends' training inputs; a backend's ``collate_groups`` makes them.
Batch = CausalBatch | PairBatch


class GroupCollator:
    """Groups of one epoch -> a :class:`CausalBatch` or :class:`PairBatch` (positive first).

    ``backend`` is a scorer backend (``Scorer.backend``); its tokenizer, field caps and length
    limits are the ones inference uses.
    """

    def __init__(self, backend: Backend, group_size: int, dropout: FieldDropout) -> None:
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
        return self.backend.collate_groups(prompts, docs)
