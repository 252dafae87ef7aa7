"""HTTP request and response models: Cohere rerank v1/v2, TEI ``/rerank``, and the ACARe fields.

Score definition: the model's score is raw log-odds ``s`` (see :mod:`acare_ray.scoring.scorer`).
Cohere ``relevance_score`` and TEI ``score`` are ``sigmoid(s)`` in 0..1; TEI with
``raw_scores=true`` returns ``s`` itself. Results are ordered by ``s``, best first, equal
scores in input order.

All three shapes accept the ACARe extension fields ``original_question``, ``reasoning`` and
``mode``, and the first-stage fields ``first_stage_scores``, ``first_stage_order`` and
``fusion`` (:mod:`acare_ray.online.fusion_fields`: with a first stage the results follow the
fused order; without one the response carries the raw-score order and nothing fused). Unknown fields are refused (422) so
a misspelt context field never goes unnoticed; Cohere fields this server does not act on
(``max_chunks_per_doc``, ``priority``) are accepted so unmodified clients keep working.
``model`` picks among a deployment's models (:mod:`acare_ray.online.models`); a deployment of
one model accepts and ignores it.

Usage: a Cohere response's ``meta.billed_units.search_units`` is 1 per request and
``meta.tokens.input_tokens`` the tokens the model scored for it (the prompt prefix counted once
per request on the causal backend, once per document on the cross-encoder). The TEI shape is a
bare list, so its usage travels in the ``x-acare-tokens`` header (which the Cohere shapes send
too).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictStr,
    model_validator,
)
from pydantic_core import PydanticCustomError

from acare_ray.online.fusion_fields import FirstStageFields, FusedScores
from acare_ray.online.service import RerankInput, ScoringJob
from acare_ray.scoring import rank_order

COHERE_V2_DEFAULT_MAX_TOKENS_PER_DOC = 4096


def _document_item(value: Any) -> Any:
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        text = value.get("text")
        if text is not None and not isinstance(text, str):
            raise PydanticCustomError(
                "document_text", "text must be a string, got {kind}", {"kind": type(text).__name__}
            )
        return value
    raise PydanticCustomError(
        "document_type",
        "must be a string or an object with a string 'text', got {kind}",
        {"kind": type(value).__name__},
    )


class CohereDocument(BaseModel):
    """A document given as an object; other fields are kept and returned with the result."""

    model_config = ConfigDict(extra="allow")
    text: str | None = None


DocumentItem = Annotated[str | CohereDocument, BeforeValidator(_document_item)]


class AgentFields(BaseModel):
    """The ACARe extension: what the agent knows beyond the sub-query in ``query``."""

    model_config = ConfigDict(extra="forbid")

    original_question: str | None = Field(
        None, description="The agent's original (global) question for the session."
    )
    reasoning: str | None = Field(
        None, description="The agent's reasoning just before this search (its end matters most)."
    )
    mode: str = Field(
        "auto",
        description=(
            "Which fields the reranker reads: M0 (query only, the official prompt), M1 (+reasoning),"
            " M2 (+original_question), M3 (both); aliases base/reasoning/question/full; auto = the"
            " richest mode the given fields allow."
        ),
    )
    instruction: str | None = Field(
        None,
        description="Replaces the prompt's <Instruct> line for this request (causal models); "
        "absent: the mode's default.",
    )

    def agent_search(self, query: str, documents: Sequence[str], **options: Any) -> RerankInput:
        """A :class:`RerankInput` of ``query`` over ``documents`` with these fields (``options``:
        the other :class:`RerankInput` settings of the endpoint's shape)."""
        return RerankInput(
            query=query,
            documents=documents,
            original_question=self.original_question,
            reasoning=self.reasoning,
            mode=self.mode,
            instruction=self.instruction,
            **options,
        )


class CohereRerankRequest(AgentFields, FirstStageFields):
    """Cohere rerank body (v1 and v2 share it; v2 defaults ``max_tokens_per_doc`` to 4096)."""

    model: str | None = Field(
        None,
        description="Which of the deployment's models answers (GET /v1/models); absent: the "
        "default. A deployment of one model accepts any value and answers with it.",
    )
    query: str = Field(description="The search query the agent sent (the sub-query).")
    documents: list[DocumentItem] = Field(description="Strings, or objects with a string `text`.")
    top_n: int | None = Field(None, ge=1, description="Return only the best `top_n` results.")
    return_documents: bool | None = Field(False, description="Include each document in its result.")
    max_tokens_per_doc: int | None = Field(
        None, ge=1, description="Cut each document to this many tokens before scoring."
    )
    rank_fields: list[str] | None = Field(
        None,
        description="For object documents: score the text 'field: value' of these fields, in order.",
    )
    max_chunks_per_doc: int | None = Field(
        None, description="Accepted for compatibility; documents are truncated, not chunked."
    )
    priority: int | None = Field(None, description="Accepted for compatibility; no effect.")

    @model_validator(mode="after")
    def _texts_resolve(self) -> CohereRerankRequest:
        self.texts()
        if self.return_documents:
            # Echoed fields must encode as UTF-8 (JSON can carry lone surrogates): refuse now,
            # not with a 500 once the work is done.
            for i, doc in enumerate(self.documents):
                if isinstance(doc, CohereDocument):
                    try:
                        json.dumps(doc.model_dump(), ensure_ascii=False).encode("utf-8")
                    except UnicodeEncodeError as err:
                        raise ValueError(
                            f"documents[{i}] is not valid Unicode ({err.reason})"
                        ) from None
        return self

    def texts(self) -> list[str]:
        """The text scored for each document."""
        out = []
        for i, doc in enumerate(self.documents):
            if isinstance(doc, str):
                out.append(doc)
            elif self.rank_fields:
                fields = doc.model_dump()
                parts = []
                for name in self.rank_fields:
                    value = fields.get(name)
                    if value is None:
                        continue
                    if not isinstance(value, str):
                        raise ValueError(f"documents[{i}].{name} must be a string")
                    parts.append(f"{name}: {value}")
                if not parts:
                    raise ValueError(f"documents[{i}] has none of the rank_fields")
                out.append("\n".join(parts))
            elif doc.text is None:
                raise ValueError(f"documents[{i}].text is missing (or give rank_fields)")
            else:
                out.append(doc.text)
        return out

    def search(self, default_max_tokens_per_doc: int | None = None) -> RerankInput:
        limit = self.max_tokens_per_doc or default_max_tokens_per_doc
        return self.agent_search(self.query, self.texts(), max_tokens_per_doc=limit)

    def document_payload(self, index: int) -> dict[str, Any]:
        doc = self.documents[index]
        if isinstance(doc, str):
            return {"text": doc}
        return doc.model_dump(exclude_none=True)


def refuse_prompt_truncation(value: int | None, instead: str) -> None:
    """vLLM's ``truncate_prompt_tokens`` cuts the whole prompt, which here holds the agent's
    question and reasoning: refused, saying what to do ``instead``."""
    if value is not None:
        raise ValueError(
            "truncate_prompt_tokens is not supported: it would cut the query and the agent's "
            f"context; {instead}"
        )


class V1RerankRequest(CohereRerankRequest):
    """``/v1/rerank``: Cohere v1, and the shape vLLM's and Jina's rerank clients send there.
    ``top_n`` 0 means all (vLLM's and Jina's default); ``use_activation`` false returns the raw
    log-odds as ``relevance_score`` (vLLM); ``truncate_prompt_tokens`` is refused with what to
    use instead (cutting the whole prompt would cut the agent's context, not the document)."""

    top_n: int | None = Field(
        None, ge=0, description="Return only the best `top_n` results; 0 or absent: all."
    )
    use_activation: StrictBool | None = Field(
        None, description="false: `relevance_score` is the raw log-odds (vLLM); else sigmoid."
    )
    truncate_prompt_tokens: int | None = Field(
        None, description="vLLM's prompt truncation: refused; use max_tokens_per_doc."
    )

    @model_validator(mode="after")
    def _vllm_fields(self) -> V1RerankRequest:
        refuse_prompt_truncation(
            self.truncate_prompt_tokens, "cut documents with max_tokens_per_doc instead"
        )
        if self.top_n == 0:
            self.top_n = None
        return self


def _texts(value: Any, name: str) -> list[str]:
    texts = [value] if isinstance(value, str) else value
    if not texts:
        raise ValueError(f"{name} is empty")
    for i, text in enumerate(texts):
        if not text.strip():
            raise ValueError(f"{name}[{i}] is empty")
    return list(texts)


SCORE_FIELDS = (("text_1", "text_2"), ("queries", "documents"), ("data_1", "data_2"))


class ScoreRequest(AgentFields):
    """vLLM's score body (``/score``, ``/v1/score``): one query against several texts, or
    pairs, under any of vLLM's three field names (``text_1``/``text_2``, ``queries``/
    ``documents``, ``data_1``/``data_2``), plus the ACARe fields. ``model``, ``user``,
    ``request_id`` and ``priority`` are accepted as vLLM accepts them (``model`` picks among a
    deployment's models as on the other routes)."""

    model: str | None = None
    text_1: StrictStr | list[StrictStr] | None = None
    text_2: StrictStr | list[StrictStr] | None = None
    queries: StrictStr | list[StrictStr] | None = None
    documents: StrictStr | list[StrictStr] | None = None
    data_1: StrictStr | list[StrictStr] | None = None
    data_2: StrictStr | list[StrictStr] | None = None
    use_activation: StrictBool | None = Field(
        None, description="false: raw log-odds; true or absent: sigmoid(log-odds), vLLM's default."
    )
    truncate_prompt_tokens: int | None = Field(
        None, description="Refused, as on /v1/rerank: the whole prompt holds the agent's context."
    )
    user: str | None = None
    request_id: str | None = None
    priority: int | None = None

    @model_validator(mode="after")
    def _one_pair_of_fields(self) -> ScoreRequest:
        refuse_prompt_truncation(
            self.truncate_prompt_tokens, "documents that do not fit are cut to the room left"
        )
        given = [p for p in SCORE_FIELDS if any(getattr(self, f) is not None for f in p)]
        if len(given) != 1 or any(getattr(self, f) is None for f in given[0]):
            raise ValueError(
                "give one pair of fields: text_1 and text_2, queries and documents, or data_1 "
                "and data_2"
            )
        self.pairs()
        return self

    def pairs(self) -> tuple[str, str, list[str], list[str]]:
        """The field names and the (query, text) pairs, one query broadcast to every text."""
        first, second = next(p for p in SCORE_FIELDS if getattr(self, p[0]) is not None)
        queries = _texts(getattr(self, first), first)
        texts = _texts(getattr(self, second), second)
        if len(queries) == 1:
            queries = queries * len(texts)
        elif len(queries) != len(texts):
            raise ValueError(
                f"{first} has {len(queries)} items and {second} {len(texts)}: give one "
                f"{first} or as many as {second}"
            )
        return first, second, queries, texts


class ScoreData(BaseModel):
    index: int
    object: str = "score"
    score: float


class ScoreUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int
    completion_tokens: int = 0


class ScoreResponse(BaseModel):
    """vLLM's ``ScoreResponse``: scores in input order."""

    id: str
    object: str = "list"
    created: int
    model: str
    data: list[ScoreData]
    usage: ScoreUsage


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


class ApiVersion(BaseModel):
    version: str


class BilledUnits(BaseModel):
    search_units: int = Field(1, description="One per request.")


class Tokens(BaseModel):
    input_tokens: int = Field(description="Tokens the model scored for this request.")
    output_tokens: int = Field(0, description="Always 0: a reranker generates nothing.")


class RerankMeta(BaseModel):
    api_version: ApiVersion
    billed_units: BilledUnits = Field(default_factory=BilledUnits)
    tokens: Tokens = Field(description="Usage: the prompt tokens scored (shared prefix once).")
    model: str = Field(description="The served model.")
    mode: str = Field(description="The mode the model read (M0..M3).")
    warnings: list[str] | None = None
    fusion: str | None = Field(
        None, description="The fusion setting used (only when the request gave a first stage)."
    )
    relevance: str = Field(
        "sigmoid",
        description="How relevance_score was made: `calibrated` (the checkpoint's calibration "
        "for this mode: a probability), `sigmoid` (sigmoid(log-odds), no calibration) or `raw`.",
    )


class RerankResult(BaseModel):
    index: int = Field(description="Position of the document in the request.")
    relevance_score: float = Field(
        description="The calibrated probability of relevance where the checkpoint has a "
        "calibration for the mode (meta.relevance), else sigmoid(log-odds); 0..1."
    )
    fused_score: float | None = Field(
        None, description="The fused value the order follows (only when fused)."
    )
    first_stage_rank: int | None = Field(
        None, description="1-based first-stage rank (only when the request gave a first stage)."
    )
    document: dict[str, Any] | None = None


class RerankUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class RerankResponse(BaseModel):
    id: str
    results: list[RerankResult] = Field(description="Best first.")
    meta: RerankMeta
    model: str | None = Field(None, description="/v1/rerank: the served model (vLLM, Jina).")
    usage: RerankUsage | None = Field(
        None, description="/v1/rerank: the tokens scored, as vLLM and Jina report them."
    )


class TeiRank(BaseModel):
    index: int
    score: float = Field(description="sigmoid(log-odds), or log-odds with raw_scores.")
    fused_score: float | None = None
    first_stage_rank: int | None = None
    text: str | None = None


def truncation_warnings(job: ScoringJob, field: str) -> list[str] | None:
    """Say which documents and which context fields were cut, so truncation is never silent."""
    warnings = [f"{name} cut to its cap of {cap} tokens" for name, cap in job.cut_fields]
    if job.truncated:
        listed = ", ".join(f"{field}[{i}]" for i in job.truncated[:20])
        more = f" and {len(job.truncated) - 20} more" if len(job.truncated) > 20 else ""
        warnings.append(f"truncated to {job.limit} tokens: {listed}{more}")
    return warnings or None


def cohere_response(
    request: CohereRerankRequest,
    job: ScoringJob,
    scores: np.ndarray,
    *,
    request_id: str,
    version: str,
    model: str,
    tokens: int = 0,
    fused: FusedScores | None = None,
    relevance: tuple[np.ndarray, str],
) -> RerankResponse:
    """``fused``: the request's fusion (:func:`~acare_ray.online.fusion_fields.fuse_request`);
    None answers by log-odds alone, as without the first-stage fields. ``relevance``: the
    value each document answers and how it was made (``calibrated``, ``sigmoid``, ``raw``), by
    the one rule of every route (:func:`acare_ray.online.http.relevance_of`)."""
    order = rank_order(scores, request.top_n) if fused is None else fused.top(request.top_n)
    probabilities, made = relevance
    results = [
        RerankResult(
            index=int(i),
            relevance_score=float(probabilities[i]),
            fused_score=fused.fused_score(int(i)) if fused else None,
            first_stage_rank=fused.first_stage_rank(int(i)) if fused else None,
            document=request.document_payload(int(i)) if request.return_documents else None,
        )
        for i in order
    ]
    return RerankResponse(
        id=request_id,
        results=results,
        meta=RerankMeta(
            api_version=ApiVersion(version=version),
            tokens=Tokens(input_tokens=tokens),
            model=model,
            mode=job.mode.value,
            warnings=truncation_warnings(job, "documents"),
            fusion=fused.config.label if fused else None,
            relevance=made,
        ),
        model=model if version == "1" else None,
        usage=RerankUsage(prompt_tokens=tokens, total_tokens=tokens) if version == "1" else None,
    )


def tei_response(
    request: TeiRerankRequest,
    scores: np.ndarray,
    values: np.ndarray,
    fused: FusedScores | None = None,
) -> list[TeiRank]:
    """TEI's answer, best first by log-odds (or the fusion); ``values``: what each text answers
    (:func:`acare_ray.online.http.relevance_of`)."""
    return [
        TeiRank(
            index=int(i),
            score=float(values[i]),
            fused_score=fused.fused_score(int(i)) if fused else None,
            first_stage_rank=fused.first_stage_rank(int(i)) if fused else None,
            text=request.texts[i] if request.return_text else None,
        )
        for i in (rank_order(scores) if fused is None else fused.top())
    ]
