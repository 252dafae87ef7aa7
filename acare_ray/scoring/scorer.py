"""The one scoring core: ``Scorer.score`` / ``score_many`` / ``rank`` / ``render``.

Score contract (docs/architecture.md, section 2), stated once and referred to everywhere else:
a score is the raw log-odds of relevance, ``logit("yes") - logit("no")`` for causal-LM rerankers
and the single logit for sequence-classification cross-encoders, float32. Sigmoid is applied
only where an API promises a 0..1 ``relevance_score``; a temperature appears only inside the
loss.

Backends (:mod:`acare_ray.scoring.backend`): :mod:`acare_ray.scoring.causal` (shared-prefix KV
reuse, last-token two-row head) and :mod:`acare_ray.scoring.cross_encoder`. Both batch candidates
by a token budget (:func:`acare_ray.scoring.batching.plan_batches`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from functools import partial
from typing import Any

import numpy as np
import torch

from acare_ray.scoring.backend import (
    Backend,
    BackendStats,
    CancelFn,
    LoadRequest,
    ScoredSearch,
    backend_class,
    detect_backend,
)
from acare_ray.scoring.batching import plan_batches
from acare_ray.scoring.config import (
    TEMPLATE_NAME,
    ScorerConfig,
    ScorerSettings,
    default_device,
    default_dtype,
    load_tokenizer,
    read_acare_config,
    resolve_model_path,
)
from acare_ray.scoring.context import (
    AUTO,
    AgentContext,
    FieldError,
    Mode,
    parse_mode,
)
from acare_ray.scoring.untrusted import Document, TokenizedDocument


@dataclass(frozen=True)
class Ranking:
    """Candidate indices best first (stable on ties) and their scores in that order."""

    indices: np.ndarray
    scores: np.ndarray


def rank_order(scores: np.ndarray, top_k: int | None = None) -> np.ndarray:
    """Indices of ``scores`` best first; equal scores keep input order."""
    return np.argsort(-np.asarray(scores), kind="stable")[:top_k]


def check_documents(documents: Sequence[Document]) -> list[Document]:
    """The documents as a list; each a non-empty string (or a :class:`TokenizedDocument` of
    one, which a server passes on so it is not tokenized twice)."""
    if isinstance(documents, str) or not isinstance(documents, Sequence):
        raise FieldError("documents", f"must be a list of strings, got {type(documents).__name__}")
    for i, doc in enumerate(documents):
        if doc is None:
            raise FieldError("documents", "is None", i)
        text = doc.text if isinstance(doc, TokenizedDocument) else doc
        if not isinstance(text, str):
            raise FieldError("documents", f"must be a string, got {type(doc).__name__}", i)
        if not text.strip():
            raise FieldError("documents", "is empty", i)
    return list(documents)


class Scorer:
    """Scores (agent context, document) pairs; one instance serves offline, online and training."""

    def __init__(self, backend: Backend, config: ScorerConfig, source: str = "") -> None:
        self.backend = backend
        self.config = config
        self.source = source

    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str,
        device: str | torch.device | None = None,
        dtype: str | torch.dtype | None = None,
        backend: str = "auto",
        revision: str | None = None,
        config: ScorerConfig | None = None,
        **options: Any,
    ) -> Scorer:
        """Load a Hugging Face id or local path (no ``trust_remote_code``).

        ``backend``: a name in :data:`~acare_ray.scoring.backend.BACKENDS` (``"causal_lm"``,
        ``"cross_encoder"``) or ``"auto"`` (an ``acare.json`` in the checkpoint, else the
        architecture). ``config`` (default :class:`ScorerConfig`) and ``options`` (its fields
        by name, which override it) set batching, prompt and backend settings; the causal
        backend's ``scorer.backend.path`` and ``scorer.backend.path_reasons`` say which of its
        paths runs and why. ``scorer.config`` is the config with the prompt settings resolved.
        CPU runs float32, CUDA bfloat16 unless ``dtype`` says otherwise.
        ``revision``: the Hub commit (or tag/branch) the config, tokenizer and weights are all
        loaded at; pin a commit hash so a re-pushed model cannot change what runs. None: the
        default branch. A local folder has no revisions (transformers ignores it there).
        """
        config = ScorerConfig.from_options(options, base=config)
        path = resolve_model_path(name_or_path)
        saved = read_acare_config(path)
        if backend == "auto":
            backend = detect_backend(path, saved, revision)
        kind = backend_class(backend)
        device = default_device(device)
        request = LoadRequest(
            path=path,
            tokenizer=load_tokenizer(path, revision),
            config=config,
            prompt=config.prompt(saved, kind.default_prompt),
            plan=partial(
                plan_batches,
                max_tokens=config.max_batch_tokens,
                max_rows=config.max_batch_size,
                overhead_tokens=config.batch_overhead_tokens,
            ),
            device=device,
            dtype=default_dtype(device, dtype),
            saved=saved,
            revision=revision,
        )
        impl = kind.load(request)
        prompt = impl.prompt
        resolved = replace(
            config, caps=prompt.caps, max_length=prompt.max_length, instruction=prompt.instruction
        )
        return cls(impl, resolved, source=name_or_path)

    @classmethod
    def from_settings(
        cls,
        name_or_path: str,
        settings: ScorerSettings,
        revision: str | None = None,
        **override: Any,
    ) -> Scorer:
        """:meth:`from_pretrained` with a :class:`~acare_ray.scoring.config.ScorerSettings`
        section (the offline jobs', the Serve app's, the trainer's); ``override``: ``device``
        or ``dtype`` chosen by the caller (a training worker's, an offline actor's)."""
        load = {"device": settings.device, "dtype": settings.dtype, "backend": settings.backend}
        return cls.from_pretrained(
            name_or_path, revision=revision, config=settings.config(), **(load | override)
        )

    @property
    def stats(self) -> BackendStats:
        return self.backend.stats

    def score(
        self,
        context: AgentContext,
        documents: Sequence[str],
        mode: str | Mode = AUTO,
        cancel: CancelFn | None = None,
    ) -> np.ndarray:
        """Float32 log-odds, one per document, in input order. Empty list -> empty array.

        ``cancel`` (optional, e.g. ``threading.Event().is_set``) is checked before every
        forward pass; when it returns true, :class:`~acare_ray.scoring.backend.Cancelled` is raised."""
        return self.score_many([(context, documents)], mode, cancel=cancel)[0]

    def score_many(
        self,
        items: Sequence[tuple[AgentContext, Sequence[str]]],
        mode: str | Mode = AUTO,
        cancel: CancelFn | None = None,
    ) -> list[np.ndarray]:
        """``score`` for several searches at once (tokenized in one call, batched together)."""
        parse_mode(mode)
        searches = []
        for context, documents in items:
            resolved = context.resolve_mode(mode)  # checks the fields a forced mode reads
            searches.append((context.for_mode(resolved), resolved, check_documents(documents)))
        return [scored.scores for scored in self._score(searches, cancel)]

    def score_resolved(
        self,
        searches: Sequence[tuple[AgentContext, Mode, Sequence[Document]]],
        cancel: CancelFn | None = None,
    ) -> list[ScoredSearch]:
        """``score_many`` for searches whose mode a caller has chosen already (a concrete
        :class:`Mode`, never ``auto``; the context must hold the fields it reads), each
        returned with the tokens the model computed for it: a server's usage, read from the
        one tokenization the scoring did. A document may carry the ids its caller made
        (:class:`~acare_ray.scoring.untrusted.TokenizedDocument`): they are used, not made
        again."""
        ready = []
        for context, mode, documents in searches:
            if not isinstance(mode, Mode):  # chosen already: a Mode, not a name to resolve
                raise FieldError("mode", f"must be a concrete mode (a Mode) here, got {mode!r}")
            # A field the mode reads but the context lacks is refused where the prompt is
            # built (missing_field_error), the one place that reads the fields.
            ready.append((context.for_mode(mode), mode, check_documents(documents)))
        return self._score(ready, cancel)

    def _score(self, searches: list, cancel: CancelFn | None) -> list[ScoredSearch]:
        if cancel is None:
            return self.backend.score_searches(searches)
        return self.backend.score_searches(searches, cancel=cancel)

    def rank(
        self,
        context: AgentContext,
        documents: Sequence[str],
        mode: str | Mode = AUTO,
        top_k: int | None = None,
    ) -> Ranking:
        """Candidates best first; equal scores keep input order."""
        scores = self.score(context, documents, mode)
        order = rank_order(scores, top_k)
        return Ranking(indices=order, scores=scores[order])

    def render(self, context: AgentContext, document: str, mode: str | Mode = AUTO) -> str:
        """The exact text the model reads for this pair (fields capped, document untruncated)."""
        resolved = context.resolve_mode(mode)
        return self.backend.render(context.for_mode(resolved), document, resolved)

    def acare_config(self) -> dict[str, Any]:
        """What a checkpoint's ``acare.json`` records so it loads back identically."""
        config = {
            "backend": self.backend.name,
            "template": TEMPLATE_NAME,
            "caps": asdict(self.backend.prompt.caps),
            "max_length": self.backend.prompt.max_length,
            "instruction": self.backend.prompt.instruction,
        }
        return config | self.backend.checkpoint_fields()
