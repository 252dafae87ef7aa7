"""The one interface a scoring backend implements (no Ray imports).

Two backends exist: :class:`acare_ray.causal_lm.CausalLMBackend` (a Qwen3-Reranker-style causal
LM, the prompt prefix shared by a search's documents) and
:class:`acare_ray.cross_encoder.CrossEncoderBackend` (a sequence-classification encoder over
(context block, document) pairs). Everything built on a :class:`~acare_ray.scorer.Scorer` talks
to ``scorer.backend`` through this protocol and never asks which backend it is:

- inference (the Scorer, the offline actors, the online service): :meth:`Backend.score_searches`
  and :meth:`Backend.render`, with ``stats`` counting real and computed tokens;
- training (:mod:`acare_ray.training`): :meth:`Backend.trainable_module` is the differentiable
  scoring function inference uses, :meth:`Backend.collate_groups` makes its inputs for LCE groups;
- checkpoints: :attr:`Backend.hf_model` and :attr:`Backend.tokenizer` are what is saved,
  :meth:`Backend.checkpoint_fields` what ``acare.json`` records beside the prompt settings;
- online token accounting (:class:`acare_ray.online.tokens.TokenLayout`): how many tokens the
  context takes, how many document tokens fit beside it and what a request costs.

``name`` is recorded in ``acare.json`` (``"causal_lm"`` or ``"cross_encoder"``) so a checkpoint
loads back into the same backend; it is a label, not something to branch on.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch
from torch import nn

from acare_ray.context import AgentContext, Mode

CancelFn = Callable[[], bool]


class Cancelled(Exception):
    """Scoring stopped between forward passes because its ``cancel`` callable said so."""


def check_cancelled(cancel: CancelFn | None) -> None:
    """Raise :class:`Cancelled` if ``cancel`` (e.g. ``threading.Event().is_set``) says so; a
    backend calls it before every forward pass."""
    if cancel is not None and cancel():
        raise Cancelled("scoring cancelled")


@runtime_checkable
class Backend(Protocol):
    name: str
    device: torch.device
    stats: Any  # acare_ray.causal_lm.BackendStats
    document_lead: str  # what precedes a document's text when it is tokenized

    # inference
    def score_searches(
        self, searches: list[tuple[AgentContext, Mode, list[str]]], cancel: CancelFn | None = None
    ) -> list[np.ndarray]:
        """Float32 log-odds per search, documents in input order; :func:`check_cancelled` runs
        before every forward pass."""
        ...

    def render(self, context: AgentContext, document: str, mode: Mode) -> str:
        """The exact text the model reads for one pair."""
        ...

    # checkpoints
    @property
    def hf_model(self) -> nn.Module:
        """The Hugging Face ``PreTrainedModel`` whose weights a checkpoint saves."""
        ...

    @property
    def tokenizer(self) -> Any:
        """The Hugging Face tokenizer the prompts are encoded with."""
        ...

    @property
    def inert(self) -> Any:
        """The :class:`~acare_ray.untrusted.InertTokenizer` every user text is tokenized with."""
        ...

    @property
    def max_length(self) -> int:
        """Prompt token limit (context and document together)."""
        ...

    def checkpoint_fields(self) -> dict[str, Any]:
        """Backend-specific ``acare.json`` fields (e.g. the yes/no token ids)."""
        ...

    # training
    def trainable_module(self) -> nn.Module:
        """The differentiable scoring module: ``module(*batch.inputs())`` -> logits ``[N]``."""
        ...

    def collate_groups(
        self, prompts: Sequence[tuple[AgentContext, Mode]], documents: Sequence[Sequence[str]]
    ) -> Any:
        """A training batch (``.inputs()``, ``.to(device)``, ``.modes``) of LCE groups: one
        prompt and its documents (the positive first) per group."""
        ...

    # online token accounting
    def context_tokens(self, context: AgentContext, mode: Mode) -> int:
        """Tokens of everything but the document (caps applied); raises if nothing fits."""
        ...

    def document_room(self, context_tokens: int) -> int:
        """Document tokens that fit beside a context of ``context_tokens``."""
        ...

    def request_cost(self, context_tokens: int, document_tokens: Sequence[int]) -> int:
        """Tokens the model computes for one request's documents."""
        ...
