"""text-embeddings-inference ``/rerank`` plus the ACARe fields, and TEI's error body.

The answer is a bare list (:class:`TeiRank`), best first, so the usage travels in headers:
``x-acare-tokens`` and TEI's ``x-compute-tokens``. As in TEI, ``model`` and ``top_n`` are
accepted and ignored, booleans are strict, and empty ``texts`` is a 400 (:class:`EmptyTexts`).
Errors on a TEI route carry TEI's ``{error, error_type}`` beside our ``message``
(:func:`tei_error_fields`): TEI clients read ``error``.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, Field, StrictBool, StrictStr

from acare_ray.online.errors import ClientError
from acare_ray.online.fusion_fields import FirstStageFields
from acare_ray.online.protocols.common import AgentFields
from acare_ray.online.service import RerankInput
from acare_ray.online.serving import RerankOutcome

TEI_PATHS = frozenset({"/rerank"})
# text-embeddings-inference's error types (its ErrorResponse), by our status on its routes.
_TEI_ERROR_TYPE = {400: "empty", 429: "overloaded", 503: "overloaded", 504: "backend"}


def tei_error_fields(
    path: str, status: int, message: str, kind: str | None = None
) -> dict[str, str]:
    """On a TEI route, TEI's ``{error, error_type}`` beside our ``message``: TEI clients read
    ``error``. Other routes: nothing."""
    if path not in TEI_PATHS:
        return {}
    return {"error": message, "error_type": kind or _TEI_ERROR_TYPE.get(status, "validation")}


class EmptyTexts(ClientError):
    """TEI's answer to a rerank without texts: 400, ``error_type: empty``."""

    def __init__(self) -> None:
        super().__init__(400, "texts", "cannot be empty")


class TeiRerankRequest(AgentFields, FirstStageFields):
    """text-embeddings-inference ``/rerank`` body. Booleans are strict, as TEI's are (``"yes"``
    is a 422, not true). ``model`` and ``top_n``, which TEI clients such as ``rerankers`` send,
    are accepted and ignored as TEI ignores them; other unknown fields stay refused, so a
    misspelt context field is never dropped silently."""

    documents_field = "texts"

    query: str = Field(description="The search query the agent sent (the sub-query).")
    texts: list[StrictStr] = Field(description="The documents (empty: 400, as in TEI).")
    raw_scores: StrictBool = Field(
        False, description="Return log-odds instead of sigmoid(log-odds)."
    )
    return_text: StrictBool = Field(False, description="Include each text in its result.")
    model: str | None = Field(None, description="Accepted and ignored, as TEI does.")
    top_n: int | None = Field(None, description="Accepted and ignored, as TEI does.")
    truncate: StrictBool | None = Field(
        None,
        description="Cut texts that do not fit; false refuses them (413); null: server default.",
    )
    truncation_direction: Annotated[
        Literal["left", "right"],
        BeforeValidator(lambda v: v.lower() if isinstance(v, str) else v),
    ] = Field("right", description="right keeps the start of a text, left keeps its end.")

    def search(self) -> RerankInput:
        return self.agent_search(
            self.query,
            self.texts,
            truncate=self.truncate,
            keep_end=self.truncation_direction == "left",
            documents_field=self.documents_field,
        )

    def characters(self) -> int:
        """What TEI's ``x-compute-characters`` counts: the query's and the texts' characters."""
        return len(self.query) + sum(len(t) for t in self.texts)


class TeiRank(BaseModel):
    index: int
    score: float = Field(description="sigmoid(log-odds), or log-odds with raw_scores.")
    fused_score: float | None = None
    first_stage_rank: int | None = None
    text: str | None = None


def tei_response(request: TeiRerankRequest, result: RerankOutcome) -> list[TeiRank]:
    """TEI's answer: every text, best first, each with the value the serving object made."""
    fused = result.fused
    return [
        TeiRank(
            index=int(i),
            score=float(result.values[i]),
            fused_score=fused.fused_score(int(i)) if fused else None,
            first_stage_rank=fused.first_stage_rank(int(i)) if fused else None,
            text=request.texts[i] if request.return_text else None,
        )
        for i in result.order()
    ]
