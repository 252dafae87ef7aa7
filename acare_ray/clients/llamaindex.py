"""A LlamaIndex ``BaseNodePostprocessor`` for acare_ray (see :mod:`acare_ray.clients`).

LlamaIndex's ``QueryBundle`` has no place for the agent's reasoning, so ``question`` and
``reasoning`` are fields of the postprocessor (replace them per step with
:meth:`AcareNodePostprocessor.with_context`). The query is the bundle's ``query_str``. Kept nodes carry the
0..1 relevance score as ``NodeWithScore.score``, best first.
"""

from __future__ import annotations

from typing import Any

from llama_index.core.bridge.pydantic import Field, PrivateAttr
from llama_index.core.postprocessor.types import BaseNodePostprocessor
from llama_index.core.schema import MetadataMode, NodeWithScore, QueryBundle

from acare_ray.clients.http_client import AcareClient, Reranked


class AcareNodePostprocessor(BaseNodePostprocessor):
    endpoint: str = Field(description="Base URL of acare serve.")
    api_key: str | None = Field(default=None, repr=False)
    question: str | None = Field(default=None, description="The user's original question.")
    reasoning: str | None = Field(default=None, description="The agent's current reasoning.")
    top_n: int | None = Field(default=3, description="Nodes kept (None: all).")
    mode: str | None = None
    instruction: str | None = None
    timeout_s: float = 120.0
    _client: Any = PrivateAttr(default=None)

    @classmethod
    def class_name(cls) -> str:
        return "AcareNodePostprocessor"

    def with_context(
        self, question: str | None = None, reasoning: str | None = None
    ) -> AcareNodePostprocessor:
        """A copy with this step's ``question`` and ``reasoning``."""
        return self.model_copy(update={"question": question, "reasoning": reasoning})

    def _postprocess_nodes(
        self, nodes: list[NodeWithScore], query_bundle: QueryBundle | None = None
    ) -> list[NodeWithScore]:
        if query_bundle is None:
            raise ValueError("query_bundle: AcareNodePostprocessor needs the query")
        if not nodes:
            return []
        if self._client is None:
            self._client = AcareClient(self.endpoint, self.api_key, timeout_s=self.timeout_s)
        texts = [n.node.get_content(metadata_mode=MetadataMode.EMBED) for n in nodes]
        answer: Reranked = self._client.rerank(
            query_bundle.query_str,
            texts,
            original_question=self.question,
            reasoning=self.reasoning,
            top_n=self.top_n,
            mode=self.mode,
            instruction=self.instruction,
        )
        return [
            NodeWithScore(node=nodes[h.index].node, score=h.relevance_score) for h in answer.hits
        ]
