"""vLLM's score API (``/score``, ``/v1/score``) and its rerank fields on ``/v1/rerank``.

``/v1/rerank`` is Cohere v1 (:mod:`acare_ray.online.protocols.cohere`) with what vLLM's and
Jina's rerank clients add there (:class:`V1RerankRequest`): ``top_n`` 0 means all,
``use_activation: false`` answers the raw log-odds. ``/score`` takes one query against several
texts, or pairs, under any of vLLM's three pairs of field names, and answers scores in input
order (:class:`ScoreResponse`). vLLM's ``truncate_prompt_tokens`` is refused on both, saying
what to use instead: it cuts the whole prompt, which here holds the agent's question and
reasoning, not just the document.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from pydantic import BaseModel, Field, StrictBool, StrictStr, model_validator

from acare_ray.online.protocols.cohere import CohereRerankRequest
from acare_ray.online.protocols.common import AgentFields
from acare_ray.online.service import RerankInput
from acare_ray.online.serving import RerankOutcome


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

    def searches(self) -> tuple[list[RerankInput], list[list[int]]]:
        """The pairs as searches, one per distinct query (a run of pairs with the same query is
        scored as one search, its prompt prefix shared), and each search's input positions."""
        _, second, queries, texts = self.pairs()
        groups: dict[str, list[int]] = {}
        for i, query in enumerate(queries):
            groups.setdefault(query, []).append(i)
        searches = [
            self.agent_search(query, [texts[i] for i in rows], documents_field=second)
            for query, rows in groups.items()
        ]
        return searches, list(groups.values())


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


def score_response(result: RerankOutcome) -> ScoreResponse:
    """vLLM's answer: each text's value in input order, and the tokens scored."""
    tokens = result.tokens
    return ScoreResponse(
        id=f"score-{uuid.uuid4()}",
        created=int(time.time()),
        model=result.model,
        data=[ScoreData(index=i, score=float(v)) for i, v in enumerate(result.values)],
        usage=ScoreUsage(prompt_tokens=tokens, total_tokens=tokens),
    )
