"""The first stage in a rerank request, and fusion of the served scores with it.

Every rerank shape (Cohere v1/v2 ``documents``, TEI ``texts``) takes three optional fields
(:class:`FirstStageFields`):

- ``first_stage_scores``: the first stage's score of each document (aligned with the
  documents; ``null`` for a document it did not score, which counts as its lowest). Finite
  numbers only: NaN, inf, a string or a wrong length is a 422 naming the field and index.
- ``first_stage_order``: ``true`` when the documents come in first-stage order (best first).
  With scores as well, the scores decide and list order breaks their ties.
- ``fusion``: the text form of :class:`~acare_ray.ranking.fusion.FusionConfig` (``none``,
  ``rrf:k=60,weight=0.5``, ``linear:alpha=0.3``) or ``auto`` (the default): the setting fitted
  for the served checkpoint (read once when the replica starts), ``none`` if it has none.

A request with neither ``first_stage_scores`` nor ``first_stage_order`` has nothing to fuse
with: it is answered exactly as without these fields (and a ``fusion`` other than
``auto``/``none`` on it is a 422, since it could not be honoured), except on a checkpoint whose
fusion fit stored the first-stage order (the safety rule found no sure gain,
:mod:`acare_ray.ranking.fusion_fit`): there the documents' own order is the first stage and the answer
keeps it (``fusion: none`` asks for the reranker's order). A
request with one of them is fused (:func:`acare_ray.ranking.fusion.fuse`, the one tie rule): results
come in fused order, ``top_n`` cut from it, each carrying ``first_stage_rank`` and, when the
setting is not ``none``, ``fused_score``; ``relevance_score`` (TEI ``score``) keeps its meaning
(sigmoid of the document's own log-odds), so it need not decrease down the list. The setting
used is in the ``x-acare-fusion`` header and, on the Cohere shapes, ``meta.fusion``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, ClassVar

import numpy as np
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictFloat,
    model_validator,
)

from acare_ray.ranking.fusion import Fused, FusionConfig, fuse, resolve_fusion
from acare_ray.ranking.fusion_fit import is_pass_through

FiniteScore = Annotated[StrictFloat, Field(allow_inf_nan=False)]


def _fusion_parses(value: str | None) -> str | None:
    if value is not None and value.strip() != "auto":
        FusionConfig.parse(value)
    return value


FusionSetting = Annotated[str | None, AfterValidator(_fusion_parses)]
"""A request's ``fusion`` field: the text form of a setting, ``auto`` or None (checked here)."""


class FirstStageFields(BaseModel):
    """The first-stage extension of a rerank body; see the module docstring."""

    model_config = ConfigDict(extra="forbid")
    documents_field: ClassVar[str] = "documents"

    first_stage_scores: list[FiniteScore | None] | None = Field(
        None,
        description="The first stage's score of each document, aligned with the documents "
        "(null: not scored by it, counts as its lowest). Turns fusion on.",
    )
    first_stage_order: bool = Field(
        False,
        description="The documents come in first-stage order, best first. Turns fusion on.",
    )
    fusion: FusionSetting = Field(
        None,
        description="none | rrf[:k=60,weight=0.5] | linear[:alpha=0.5] | auto (default: the "
        "setting fitted for the served checkpoint, none if it has none). Used only with "
        "first_stage_scores or first_stage_order.",
    )

    @model_validator(mode="after")
    def _first_stage_fits(self) -> FirstStageFields:
        documents = getattr(self, self.documents_field)
        if self.first_stage_scores is not None and len(self.first_stage_scores) != len(documents):
            raise ValueError(
                f"first_stage_scores: has {len(self.first_stage_scores)} entries, expected "
                f"{len(documents)} (one per item of {self.documents_field})"
            )
        if not self.has_first_stage and resolve_fusion(self.fusion, None).enabled:
            raise ValueError(
                f"fusion: {self.fusion!r} needs the first stage: send first_stage_scores or "
                "first_stage_order: true"
            )
        return self

    @property
    def has_first_stage(self) -> bool:
        return self.first_stage_scores is not None or self.first_stage_order

    def fusion_setting(self, fitted: FusionConfig | None) -> FusionConfig | None:
        """The fusion this request gets (``fitted``: the served checkpoint's), or None when it
        carries no first stage (answered as without these fields). A checkpoint whose safety
        rule stored the first-stage order (:data:`~acare_ray.ranking.fusion_fit.PASS_THROUGH`) answers
        a request without a first stage in the order its documents came, unless the request
        asks for ``fusion: none`` (the reranker's own order)."""
        if not self.has_first_stage:
            passing = fitted is not None and is_pass_through(fitted)
            if passing and (self.fusion is None or self.fusion.strip() == "auto"):
                return fitted
            return None
        return resolve_fusion(self.fusion, fitted)

    def fused(self, scores: np.ndarray, fitted: FusionConfig | None) -> FusedScores | None:
        """Fuse the log-odds (input order) with this request's first stage; None without one
        (:class:`~acare_ray.online.serving.Fusable`)."""
        config = self.fusion_setting(fitted)
        if config is None:
            return None
        return FusedScores(config, fuse(scores, config, self.first_stage_scores))


@dataclass(frozen=True)
class FusedScores:
    """A request's fused answer: the setting used and :class:`~acare_ray.ranking.fusion.Fused`."""

    config: FusionConfig
    fused: Fused

    def top(self, top_n: int | None = None) -> np.ndarray:
        return self.fused.order[:top_n]

    def fused_score(self, index: int) -> float | None:
        """The fused value reported with a result; None (left out) for ``none``."""
        return float(self.fused.values[index]) if self.config.enabled else None

    def first_stage_rank(self, index: int) -> int:
        return int(self.fused.first_stage_rank[index])


@dataclass(frozen=True)
class RankedFirstStage:
    """A first stage known by its own scores and ranks (``/v1/search``'s candidates, in
    candidate order) and the request's ``fusion`` (None or ``auto``: the answering checkpoint's
    fitted setting), as the serving object fuses it (:class:`~acare_ray.online.serving.Fusable`).
    Always fused: ``none`` is the reranker's order with ties by first-stage rank (the one tie
    rule of :func:`acare_ray.ranking.fusion.fuse`)."""

    scores: Sequence[float | None]
    ranks: Sequence[int]
    fusion: str | None = None

    def fused(self, scores: np.ndarray, fitted: FusionConfig | None) -> FusedScores:
        config = resolve_fusion(self.fusion, fitted)
        return FusedScores(
            config,
            fuse(scores, config, first_stage_scores=self.scores, first_stage_ranks_=self.ranks),
        )
