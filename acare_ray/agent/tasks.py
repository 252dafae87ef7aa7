"""MuSiQue questions -> agent tasks, and the pooled corpus they search.

The corpus is the pooled, deduplicated paragraphs of all the selected tasks' questions (doc text
``title + "\\n" + paragraph_text`` as in :mod:`acare_ray.data.musique`; the first doc id with a
text is canonical and every copy is aliased to it), indexed with :class:`BM25Index`.
"""

from __future__ import annotations

import json
import random
import threading
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import bm25s
import numpy as np

from acare_ray.data.bm25 import BM25Index

SPLITS = ("dev", "train", "all")


@dataclass(frozen=True)
class Task:
    """One MuSiQue question as an agent task.

    ``steps``: the decomposition (each ``question``, ``answer``, ``paragraph_support_idx``);
    ``gold_steps[k]``: the canonical doc id of step k's supporting paragraph; ``gold``: all the
    question's supporting paragraphs (the steps' and ``is_supporting``), canonical;
    ``terms``: the question's BM25 terms, most specific (lowest document frequency) first.
    """

    task_id: str
    question: str
    steps: tuple[dict[str, Any], ...]
    gold_steps: tuple[str, ...]
    gold: frozenset[str]
    terms: tuple[str, ...]


def select_records(
    records: Sequence[dict[str, Any]], n: int, seed: int, split: str = "dev"
) -> list[dict[str, Any]]:
    """``n`` records of ``split`` (``dev``, ``train`` or ``all``), drawn by ``seed``.

    The draw shuffles the records sorted by id, so it does not depend on file order.
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
    pool = sorted(
        (r for r in records if split == "all" or r["split"] == split), key=lambda r: str(r["id"])
    )
    if not 1 <= n <= len(pool):
        raise ValueError(f"--tasks must be in 1..{len(pool)} for split {split!r}, got {n}")
    random.Random(seed).shuffle(pool)
    return pool[:n]


def records_by_id(records: Sequence[dict[str, Any]], ids: Sequence[str]) -> list[dict[str, Any]]:
    """The records with ``ids``, in that order (a fixed task list, e.g. a training run's held-out
    questions). An unknown or repeated id raises ValueError naming it and its position."""
    index = {str(r["id"]): r for r in records}
    out, seen = [], set()
    for position, task_id in enumerate(ids, start=1):
        if task_id in seen:
            raise ValueError(f"task id {task_id!r} (entry {position}) is listed twice")
        if task_id not in index:
            raise ValueError(f"task id {task_id!r} (entry {position}) is not a MuSiQue record id")
        seen.add(task_id)
        out.append(index[task_id])
    if not out:
        raise ValueError("the task id list is empty")
    return out


def read_task_ids(path: str) -> tuple[str, ...]:
    """Task ids from a text file: one id per line; blank lines and ``#`` comments ignored."""
    with open(path, encoding="utf-8") as f:
        lines = (line.split("#", 1)[0].strip() for line in f)
        return tuple(line for line in lines if line)


def _tokens(texts: Sequence[str]) -> list[list[str]]:
    # The same tokenization as acare_ray.data.bm25 (lowercase words, English stopwords removed).
    return bm25s.tokenize(list(texts), stopwords="en", return_ids=False, show_progress=False)


class Corpus:
    """The pooled paragraphs and their BM25 index; :meth:`search` is cached and thread-safe."""

    def __init__(self, ids: Sequence[str], texts: Sequence[str]) -> None:
        self.ids = list(ids)
        self.texts = list(texts)
        self.position = {doc_id: i for i, doc_id in enumerate(self.ids)}
        self.index = BM25Index(self.texts)
        self.document_frequency = Counter(t for doc in _tokens(self.texts) for t in set(doc))
        self._lock = threading.Lock()
        self._cache: dict[tuple[str, int], tuple[tuple[int, ...], tuple[float, ...]]] = {}

    def __len__(self) -> int:
        return len(self.ids)

    def search(self, query: str, k: int) -> tuple[tuple[int, ...], tuple[float, ...]]:
        """``(positions, scores)`` of the BM25 top-``k`` for ``query``, best first (same answer
        every call): the first stage's order and its scores, which fused rerankers use."""
        with self._lock:
            key = (query, k)
            if key not in self._cache:
                positions, scores = self.index.search([query], k)
                self._cache[key] = (
                    tuple(int(p) for p in np.asarray(positions)[0]),
                    tuple(float(s) for s in np.asarray(scores)[0]),
                )
            return self._cache[key]

    def specific_terms(self, text: str) -> tuple[str, ...]:
        """``text``'s distinct terms that occur in the corpus, rarest first (ties: text order)."""
        terms = list(dict.fromkeys(_tokens([text])[0]))
        known = [t for t in terms if self.document_frequency.get(t, 0) > 0]
        return tuple(sorted(known, key=lambda t: self.document_frequency[t]))


def write_corpus(corpus: Corpus, path: str | Path) -> int:
    """The corpus as ``acare index`` input (JSONL rows ``doc_id``, ``text``; the title stays the
    first line of the text, so the index serves and scores the bench's own document text), in
    corpus order (which breaks BM25 ties the same way). Returns the rows written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as out:
        for doc_id, text in zip(corpus.ids, corpus.texts):
            out.write(json.dumps({"doc_id": doc_id, "text": text}, ensure_ascii=False) + "\n")
    return len(corpus)


def build_tasks(
    records: Sequence[dict[str, Any]], corpus_records: Sequence[dict[str, Any]] = ()
) -> tuple[list[Task], Corpus]:
    """Tasks (in ``records`` order) and the corpus of the pooled, deduplicated paragraphs of
    ``records`` and ``corpus_records`` (e.g. every MuSiQue question: the open setting)."""
    canonical: dict[str, str] = {}  # text -> first doc id with that text
    alias: dict[str, str] = {}
    pooled = {str(r["id"]): r for r in [*records, *corpus_records]}
    for record in pooled.values():
        for position, p in enumerate(record["paragraphs"]):
            if p["idx"] != position:
                raise ValueError(f"id={record['id']}: paragraphs[{position}].idx is {p['idx']}")
            doc_id = f"{record['id']}:{p['idx']}"
            alias[doc_id] = canonical.setdefault(f"{p['title']}\n{p['paragraph_text']}", doc_id)
    corpus = Corpus(list(canonical.values()), list(canonical.keys()))
    tasks = []
    for record in records:
        qid, steps = str(record["id"]), tuple(record["question_decomposition"])
        n = len(record["paragraphs"])
        gold_steps = []
        for k, step in enumerate(steps):
            idx = step["paragraph_support_idx"]
            if idx is None or not 0 <= idx < n:
                raise ValueError(
                    f"id={qid}: question_decomposition[{k}].paragraph_support_idx={idx}"
                )
            gold_steps.append(alias[f"{qid}:{idx}"])
        supporting = {
            alias[f"{qid}:{p['idx']}"] for p in record["paragraphs"] if p["is_supporting"]
        }
        tasks.append(
            Task(
                task_id=qid,
                question=record["question"],
                steps=steps,
                gold_steps=tuple(gold_steps),
                gold=frozenset(supporting | set(gold_steps)),
                terms=corpus.specific_terms(record["question"]),
            )
        )
    return tasks, corpus
