"""The base class every scoring backend derives from, and the registry that names them.

Two backends exist: :class:`acare_ray.scoring.causal.backend.CausalLMBackend` (a
Qwen3-Reranker-style causal LM, the prompt prefix shared by a search's documents) and
:class:`acare_ray.scoring.cross_encoder.CrossEncoderBackend` (a sequence-classification encoder
over (context block, document) pairs). Everything built on a
:class:`~acare_ray.scoring.scorer.Scorer` talks to ``scorer.backend`` through this class and never
asks which backend it is:

- loading: :meth:`Backend.load` builds one from a :class:`LoadRequest`; :meth:`Backend.accepts`
  says whether a model's architecture is this backend's (``backend="auto"``);
- inference (the Scorer, the offline actors, the online service): :meth:`Backend.score_searches`
  (scores and the tokens computed, per search: usage is read from the one tokenization) and
  :meth:`Backend.render`, with ``stats`` counting real and computed tokens;
- training (:mod:`acare_ray.training`): :meth:`Backend.trainable_module` is the differentiable
  scoring function inference uses, :meth:`Backend.collate_groups` makes its inputs for LCE groups;
- checkpoints: :attr:`Backend.hf_model` and :attr:`Backend.tokenizer` are what is saved,
  :meth:`Backend.checkpoint_fields` what ``acare.json`` records beside the prompt settings;
- online token accounting (:class:`acare_ray.scoring.tokens.TokenLayout`): how many tokens the
  context takes, how many document tokens fit beside it and what a request costs.

A new backend is one module with one subclass, and one line in :data:`BACKENDS`.
``name`` is recorded in ``acare.json`` so a checkpoint loads back into the same backend; it is a
label, never something to branch on: what differs between backends is a method or a class
attribute here (``document_lead``, ``instruction_line``, ``default_prompt``).
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from acare_ray.scoring.batching import BatchPlan
from acare_ray.scoring.config import BACKENDS, PromptConfig, ScorerConfig
from acare_ray.scoring.context import AgentContext, Mode
from acare_ray.scoring.untrusted import Document, InertTokenizer

CancelFn = Callable[[], bool]
Search = tuple[AgentContext, Mode, list[Document]]
"""One search as a backend scores it: the context cut to its mode, the mode, the documents."""


@dataclass(frozen=True)
class ScoredSearch:
    """One search scored: float32 log-odds (documents in input order) and the tokens the model
    computed for it (:meth:`Backend.request_cost` of what was really scored: the shared prefix
    once on the causal backend, every pair whole on a cross-encoder). ``batch``: how many
    searches the call that scored it held (a serving replica counts its whole batch)."""

    scores: np.ndarray
    tokens: int
    batch: int = 1


class Cancelled(Exception):
    """Scoring stopped between forward passes because its ``cancel`` callable said so."""


def check_cancelled(cancel: CancelFn | None) -> None:
    """Raise :class:`Cancelled` if ``cancel`` (e.g. ``threading.Event().is_set``) says so; a
    backend calls it before every forward pass."""
    if cancel is not None and cancel():
        raise Cancelled("scoring cancelled")


@dataclass
class BackendStats:
    """Counters a backend accumulates: tokens really present vs computed, tokenizing time."""

    real_tokens: int = 0
    computed_tokens: int = 0
    tokenize_s: float = 0.0

    def add(self, real: int, computed: int) -> None:
        self.real_tokens += real
        self.computed_tokens += computed

    @property
    def padding_efficiency(self) -> float:
        return self.real_tokens / self.computed_tokens if self.computed_tokens else 1.0


@dataclass(frozen=True)
class LoadRequest:
    """What :meth:`Backend.load` builds a backend from.

    ``path``: a local folder or Hub id (``revision`` pins the Hub commit); ``config``: the
    scorer's settings; ``prompt``: the resolved prompt settings (:meth:`ScorerConfig.prompt`);
    ``saved``: the checkpoint's ``acare.json`` (empty without one); ``plan``: the token-budget
    batch planner bound to the config's budget.
    """

    path: str
    tokenizer: Any
    config: ScorerConfig
    prompt: PromptConfig
    plan: BatchPlan
    device: torch.device
    dtype: torch.dtype
    saved: dict[str, Any]
    revision: str | None = None


class Backend(ABC):
    """A model that scores (context, document) pairs; see the module docstring."""

    name: ClassVar[str]
    """The label ``acare.json`` records (a key of :data:`BACKENDS`)."""
    document_lead: ClassVar[str]
    """What precedes a document's text when it is tokenized."""
    instruction_line: ClassVar[bool]
    """Whether the prompt has an instruction line a search may replace."""
    default_prompt: ClassVar[PromptConfig]
    """Prompt settings when neither the options nor the checkpoint give them."""
    has_reference: ClassVar[bool] = False
    """Whether an official plain Hugging Face recipe exists to check the scores against
    (:func:`acare_ray.scoring.golden.reference_mismatches`)."""

    def __init__(self, prompt: PromptConfig, plan: BatchPlan, device: torch.device) -> None:
        self.prompt = prompt
        self.plan = plan
        self.device = device
        self.stats = BackendStats()

    # loading
    @classmethod
    def accepts(cls, architectures: Sequence[str]) -> bool:
        """Whether a model of these Hugging Face architectures is this backend's."""
        return True

    @classmethod
    @abstractmethod
    def load(cls, request: LoadRequest) -> Backend:
        """The backend for the model at ``request.path`` (no ``trust_remote_code``)."""

    # inference
    @abstractmethod
    def score_searches(
        self, searches: list[Search], cancel: CancelFn | None = None
    ) -> list[ScoredSearch]:
        """Per search its float32 log-odds (documents in input order) and the tokens computed;
        :func:`check_cancelled` runs before every forward pass."""

    @abstractmethod
    def render(self, context: AgentContext, document: str, mode: Mode) -> str:
        """The exact text the model reads for one pair."""

    # checkpoints
    @property
    @abstractmethod
    def hf_model(self) -> nn.Module:
        """The Hugging Face ``PreTrainedModel`` whose weights a checkpoint saves."""

    @property
    @abstractmethod
    def tokenizer(self) -> Any:
        """The Hugging Face tokenizer the prompts are encoded with."""

    @property
    @abstractmethod
    def inert(self) -> InertTokenizer:
        """The tokenizer every user text is tokenized with (:mod:`acare_ray.scoring.untrusted`)."""

    @property
    def max_length(self) -> int:
        """Prompt token limit (context and document together)."""
        return self.prompt.max_length

    def checkpoint_fields(self) -> dict[str, Any]:
        """Backend-specific ``acare.json`` fields (e.g. the yes/no token ids)."""
        return {}

    # training
    @abstractmethod
    def trainable_module(self) -> nn.Module:
        """The differentiable scoring module: ``module(*batch.inputs())`` -> logits ``[N]``."""

    @abstractmethod
    def collate_groups(
        self, prompts: Sequence[tuple[AgentContext, Mode]], documents: Sequence[Sequence[str]]
    ) -> Any:
        """A training batch (``.inputs()``, ``.to(device)``, ``.modes``) of LCE groups: one
        prompt and its documents (the positive first) per group."""

    # online token accounting
    @abstractmethod
    def context_tokens(self, context: AgentContext, mode: Mode) -> int:
        """Tokens of everything but the document (caps applied); raises if nothing fits."""

    @abstractmethod
    def document_room(self, context_tokens: int) -> int:
        """Document tokens that fit beside a context of ``context_tokens``."""

    @abstractmethod
    def request_cost(self, context_tokens: int, document_tokens: Sequence[int]) -> int:
        """Tokens the model computes for one request's documents (0 for none)."""


def backend_class(name: str) -> type[Backend]:
    """The registered backend called ``name`` (a ValueError naming the choices otherwise)."""
    if name not in BACKENDS:
        choices = ", ".join([*BACKENDS, "auto"])
        raise ValueError(f"backend must be one of {choices}, got {name!r}")
    module, _, attribute = BACKENDS[name].partition(":")
    return getattr(importlib.import_module(module), attribute)


def detect_backend(path: str, saved: dict[str, Any], revision: str | None = None) -> str:
    """The backend a model folder asks for: its ``acare.json``, else its architecture."""
    if saved.get("backend"):
        return saved["backend"]
    from transformers import AutoConfig

    architectures = AutoConfig.from_pretrained(path, revision=revision).architectures or []
    return next(name for name in BACKENDS if backend_class(name).accepts(architectures))
