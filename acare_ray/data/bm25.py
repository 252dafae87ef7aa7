"""First-stage BM25 (``bm25s``) over an in-memory list of texts."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import bm25s
import numpy as np


def _tokens(texts: Sequence[str]) -> list[list[str]]:
    # Token strings, not ids: ids from two tokenize() calls come from two separate vocabularies.
    return bm25s.tokenize(list(texts), stopwords="en", return_ids=False, show_progress=False)


class BM25Index:
    """Lucene-variant BM25 (k1=1.5, b=0.75), lowercase word tokens, English stopwords removed."""

    def __init__(self, texts: Sequence[str]) -> None:
        if not texts:
            raise ValueError("cannot index an empty corpus")
        self.size = len(texts)
        self._retriever = bm25s.BM25()
        self._retriever.index(_tokens(texts), show_progress=False)

    def save(self, folder: str | Path) -> None:
        """Write the index (bm25s' own files) into ``folder``; :meth:`load` reads it back."""
        self._retriever.save(str(folder), show_progress=False)

    @classmethod
    def load(cls, folder: str | Path, size: int) -> BM25Index:
        """An index written by :meth:`save` over ``size`` texts (memory-mapped)."""
        index = cls.__new__(cls)
        index.size = size
        index._retriever = bm25s.BM25.load(str(folder), mmap=True, show_progress=False)
        return index

    def search(self, queries: Sequence[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-``k`` per query: (doc positions int [n, k], scores float [n, k]), best first.

        ``k`` is capped at the corpus size. A query with no known term gets arbitrary documents
        with score 0.
        """
        k = min(k, self.size)
        docs, scores = self._retriever.retrieve(_tokens(queries), k=k, show_progress=False)
        return np.asarray(docs), np.asarray(scores, dtype=np.float64)

    def scores(self, query: str, positions: Sequence[int]) -> np.ndarray:
        """BM25 scores of ``query`` for the documents at ``positions`` (float [len(positions)]);
        0 for a query with no known term."""
        terms = _tokens([query])[0]
        known = [t for t in terms if t in self._retriever.vocab_dict]
        if not known:
            return np.zeros(len(positions), dtype=np.float64)
        every = self._retriever.get_scores(known)
        return np.asarray(every, dtype=np.float64)[np.asarray(positions, dtype=np.int64)]
