"""A LangChain ``BaseDocumentCompressor`` for acare_ray (see :mod:`acare_ray.clients`).

``question`` and ``reasoning`` are fields (set once, or replaced per step with
:meth:`AcareDocumentCompressor.with_context`) or keyword arguments of ``compress_documents``. Each kept
document is a copy whose ``metadata["relevance_score"]`` is the 0..1 score, best first, as
LangChain's own rerankers do.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain_core.callbacks import Callbacks
from langchain_core.documents import BaseDocumentCompressor, Document
from pydantic import ConfigDict, Field, PrivateAttr

from acare_ray.clients.http_client import AcareClient, AsyncAcareClient, Reranked


class AcareDocumentCompressor(BaseDocumentCompressor):
    model_config = ConfigDict(arbitrary_types_allowed=True)

    endpoint: str = Field(description="Base URL of acare serve.")
    api_key: str | None = Field(None, repr=False)
    question: str | None = Field(None, description="The user's original question.")
    reasoning: str | None = Field(None, description="The agent's current reasoning.")
    top_n: int | None = Field(3, description="Documents kept (None: all).")
    mode: str | None = None
    instruction: str | None = None
    timeout_s: float = 120.0
    _client: AcareClient | None = PrivateAttr(None)
    _aclient: AsyncAcareClient | None = PrivateAttr(None)

    def with_context(
        self, question: str | None = None, reasoning: str | None = None
    ) -> AcareDocumentCompressor:
        """A copy with this step's ``question`` and ``reasoning``."""
        return self.model_copy(update={"question": question, "reasoning": reasoning})

    def _request(
        self,
        documents: Sequence[Document],
        query: str,
        question: str | None,
        reasoning: str | None,
    ) -> tuple[tuple[str, list[str]], dict[str, Any]]:
        """The client's ``rerank`` arguments: (query, texts) and the context fields, this
        call's ``question``/``reasoning`` over the compressor's own."""
        fields = {
            "original_question": question if question is not None else self.question,
            "reasoning": reasoning if reasoning is not None else self.reasoning,
            "top_n": self.top_n,
            "mode": self.mode,
            "instruction": self.instruction,
        }
        return (query, [d.page_content for d in documents]), fields

    @staticmethod
    def _kept(documents: Sequence[Document], answer: Reranked) -> list[Document]:
        out = []
        for hit in answer.hits:
            doc = documents[hit.index]
            metadata = {**doc.metadata, "relevance_score": hit.relevance_score}
            out.append(Document(page_content=doc.page_content, metadata=metadata, id=doc.id))
        return out

    def compress_documents(
        self,
        documents: Sequence[Document],
        query: str,
        callbacks: Callbacks | None = None,
        *,
        question: str | None = None,
        reasoning: str | None = None,
    ) -> Sequence[Document]:
        if not documents:
            return []
        if self._client is None:
            self._client = AcareClient(self.endpoint, self.api_key, timeout_s=self.timeout_s)
        args, fields = self._request(documents, query, question, reasoning)
        return self._kept(documents, self._client.rerank(*args, **fields))

    async def acompress_documents(
        self,
        documents: Sequence[Document],
        query: str,
        callbacks: Callbacks | None = None,
        *,
        question: str | None = None,
        reasoning: str | None = None,
    ) -> Sequence[Document]:
        if not documents:
            return []
        if self._aclient is None:
            self._aclient = AsyncAcareClient(self.endpoint, self.api_key, timeout_s=self.timeout_s)
        args, fields = self._request(documents, query, question, reasoning)
        return self._kept(documents, await self._aclient.rerank(*args, **fields))
