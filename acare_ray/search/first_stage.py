"""First stages for ``/v1/search``: the built-in BM25 index, or an upstream HTTP search API.

A first stage takes the agent's sub-query and ``k`` and returns at most ``k``
:class:`FirstStageHit` s, best first. Both kinds read the sub-query only: the agent's question and
reasoning go to the reranker.

**Upstream HTTP adapter** (:class:`HttpFirstStage`): ``POST <url>`` with the JSON body
``{"query": "<sub-query>", "top_k": <k>}`` (and ``Authorization: Bearer <key>`` when a key is
configured) must answer 200 with ``{"results": [{"doc_id": "...", "text": "...", "title":
"..." (optional), "score": 1.0 (optional)}, ...]}``, best first. Wrap any search engine in a
few lines to that shape. A failing or malformed upstream answer is a 502 naming what is wrong.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from acare_ray.search.index import document_text, load_index


class UpstreamError(RuntimeError):
    """The upstream search API failed or answered something unusable (the message says which).

    The Serve app answers it as HTTP 502 naming the ``first_stage`` field."""


@dataclass(frozen=True)
class FirstStageHit:
    """One first-stage hit; ``rank`` is 1-based in the first stage's order."""

    doc_id: str
    text: str
    title: str | None
    rank: int
    score: float | None = None

    @property
    def rerank_text(self) -> str:
        return document_text(self.title, self.text)


class FirstStage(Protocol):
    name: str

    def search(self, query: str, k: int) -> list[FirstStageHit]: ...


class BM25FirstStage:
    """The index folder ``acare index`` wrote, loaded once per replica."""

    name = "bm25"

    def __init__(self, folder: str) -> None:
        self.index = load_index(folder)

    def search(self, query: str, k: int) -> list[FirstStageHit]:
        positions, scores = self.index.bm25.search([query], k)
        out = []
        for rank, (i, score) in enumerate(zip(positions[0], scores[0]), start=1):
            i = int(i)
            out.append(
                FirstStageHit(
                    self.index.doc_ids[i],
                    self.index.texts[i],
                    self.index.titles[i],
                    rank,
                    float(score),
                )
            )
        return out


class HttpFirstStage:
    """An upstream search API (module docstring); ``transport`` is for tests."""

    name = "http"

    def __init__(
        self, url: str, api_key: str | None = None, timeout_s: float = 10.0, transport: Any = None
    ) -> None:
        import httpx

        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.url = url
        self.http = httpx.Client(timeout=timeout_s, headers=headers, transport=transport)
        self._httpx = httpx

    def search(self, query: str, k: int) -> list[FirstStageHit]:
        try:
            response = self.http.post(self.url, json={"query": query, "top_k": k})
        except self._httpx.HTTPError as err:
            raise UpstreamError(f"upstream search failed: {err}") from None
        if response.status_code != 200:
            raise UpstreamError(f"upstream search answered HTTP {response.status_code}")
        try:
            results = response.json()["results"]
            out = []
            for rank, hit in enumerate(results[:k], start=1):
                doc_id, text, title = hit["doc_id"], hit["text"], hit.get("title")
                if not isinstance(text, str) or not text.strip():
                    raise ValueError(f"results[{rank - 1}].text is missing or empty")
                if title is not None and not isinstance(title, str):
                    raise ValueError(f"results[{rank - 1}].title is not a string")
                score = hit.get("score")
                out.append(
                    FirstStageHit(
                        str(doc_id), text, title, rank, None if score is None else float(score)
                    )
                )
        except (ValueError, KeyError, TypeError) as err:
            raise UpstreamError(f"upstream search answer is malformed: {err!r}") from None
        return out
