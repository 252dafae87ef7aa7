"""Cohere rerank v1 and v2 (``/v1/rerank``, ``/v2/rerank``) plus the ACARe fields.

Both versions share the body (:class:`CohereRerankRequest`; v2 defaults ``max_tokens_per_doc``
to 4096) and the response (:class:`RerankResponse`; v1 also carries ``model`` and ``usage`` as
vLLM and Jina report them). Documents are strings or objects with a string ``text`` (or the
``rank_fields`` to score); an object's other fields come back with its result. ``model`` picks
among a deployment's models (:mod:`acare_ray.online.models`); a deployment of one model accepts
and ignores it. Fields Cohere clients send that this server does not act on
(``max_chunks_per_doc``, ``priority``) are accepted so unmodified clients keep working.

Usage: ``meta.billed_units.search_units`` is 1 per request and ``meta.tokens.input_tokens`` the
tokens the model scored for it (the prompt prefix counted once per request on the causal
backend, once per document on the cross-encoder), also in the ``x-acare-tokens`` header.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

from acare_ray.online.fusion_fields import FirstStageFields
from acare_ray.online.protocols.common import AgentFields
from acare_ray.online.service import RerankInput
from acare_ray.online.serving import RerankOutcome

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


def cohere_response(
    request: CohereRerankRequest, result: RerankOutcome, *, request_id: str, version: str
) -> RerankResponse:
    """The answer to ``request`` (API ``version`` "1" or "2"): ``result``'s order cut to
    ``top_n``, each document's value as the serving object made it."""
    fused = result.fused
    results = [
        RerankResult(
            index=int(i),
            relevance_score=float(result.values[i]),
            fused_score=fused.fused_score(int(i)) if fused else None,
            first_stage_rank=fused.first_stage_rank(int(i)) if fused else None,
            document=request.document_payload(int(i)) if request.return_documents else None,
        )
        for i in result.order(request.top_n)
    ]
    tokens = result.tokens
    return RerankResponse(
        id=request_id,
        results=results,
        meta=RerankMeta(
            api_version=ApiVersion(version=version),
            tokens=Tokens(input_tokens=tokens),
            model=result.model,
            mode=result.mode.value,
            warnings=result.truncation_warnings("documents"),
            fusion=fused.config.label if fused else None,
            relevance=result.relevance,
        ),
        model=result.model if version == "1" else None,
        usage=RerankUsage(prompt_tokens=tokens, total_tokens=tokens) if version == "1" else None,
    )
