"""HotpotQA dev, distractor setting (CC BY-SA 4.0; ``<data_dir>/hotpotqa``, see its SOURCE.md)
-> agent searches with BM25 first-stage scores.

HotpotQA has questions, paragraphs and gold supporting facts, but no agent: the searches are
**synthetic** (``reasoning_source = "synthetic"``), built the way the R1-Searcher agents of
``agent_traces`` search (their first query is the question's keywords, later ones name the
entity they still need):

- search 1: ``sub_query`` = the question's content words (stopwords and punctuation dropped, at
  most :data:`QUERY_WORDS`); ``reasoning`` states the plan.
- search 2 (when the second gold page is in the pool; some copies' records carry only one of
  their two gold paragraphs): ``sub_query`` = the title of the second gold page (in supporting-fact order);
  ``reasoning`` quotes the first supporting sentence of the first gold page, as an agent that
  read it would. It never contains the answer (case-insensitive): then the sentence is left out.

Candidates: the question's own paragraphs (2 gold + 8 the HotpotQA authors retrieved with
bigram TF-IDF) plus BM25 top-``k`` over the pooled, deduplicated paragraphs of all questions,
each with its BM25 score for the search's sub-query over that pool (``first_stage_score``), so
:func:`acare_ray.data.groups.searches_to_groups` can take first-stage-hard negatives. Labels are
page-level, as for the traces: the gold pages present in the pool are relevant (1) in every
search of the question (added to the candidates when neither list has them), every other
candidate is 0. ``doc_id`` = the paragraph's title (pages are unique
by title in the pool; a title with two different texts keeps the first), ``text`` =
``title + "\\n" + sentences``.
"""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path
from typing import Any

import pyarrow as pa

from acare_ray.data.bm25 import BM25Index
from acare_ray.data.io import data_dir as default_data_dir
from acare_ray.data.musique import MUSIQUE_SEARCHES

log = logging.getLogger(__name__)

FILE = "hotpotqa/hotpotqa_dev_distractor_subset.jsonl"
QUERY_WORDS = 10
_STOP = frozenset(
    [
        "a",
        "an",
        "the",
        "of",
        "in",
        "on",
        "at",
        "to",
        "for",
        "from",
        "by",
        "with",
        "and",
        "or",
        "is",
        "are",
        "was",
        "were",
        "be",
        "been",
        "being",
        "which",
        "what",
        "who",
        "whom",
        "whose",
        "when",
        "where",
        "why",
        "how",
        "that",
        "this",
        "these",
        "those",
        "did",
        "do",
        "does",
        "has",
        "have",
        "had",
        "it",
        "its",
        "as",
        "than",
        "same",
        "both",
        "also",
        "other",
        "such",
        "into",
        "about",
    ]
)
_WORD = re.compile(r"[\w'-]+")


def load_hotpotqa(data_dir: str | os.PathLike | None = None) -> list[dict[str, Any]]:
    """The records of ``<data_dir>/hotpotqa``, one dict each, in file order."""
    path = Path(data_dir or default_data_dir()) / FILE
    if not path.exists():
        raise FileNotFoundError(f"HotpotQA data not found: {path} (set ACARE_DATA_DIR)")
    with path.open(encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def keyword_query(question: str) -> str:
    """The question's first :data:`QUERY_WORDS` content words, in order."""
    words = [w for w in _WORD.findall(question) if w.lower() not in _STOP]
    return " ".join(words[:QUERY_WORDS]) or question


def _gold_titles(record: dict[str, Any], pool: dict[str, str]) -> list[str]:
    """The gold pages in supporting-fact order (first mention) that the pool has."""
    return [t for t in dict.fromkeys(t for t, _ in record["supporting_facts"]) if t in pool]


def _first_fact(record: dict[str, Any], title: str) -> str:
    sentences = dict((t, s) for t, s in record["context"]).get(title, [])
    for fact_title, index in record["supporting_facts"]:
        if fact_title == title and 0 <= index < len(sentences):
            return sentences[index].strip()
    return ""


def _searches(record: dict[str, Any], pool: dict[str, str]) -> list[dict[str, Any]]:
    gold = _gold_titles(record, pool)
    if not gold:
        return []
    question, answer = record["question"], str(record["answer"])
    fact = _first_fact(record, gold[0])
    if answer.strip() and answer.lower() in fact.lower():
        fact = ""
    said = f" I found that {fact}" if fact else ""
    plans = [(keyword_query(question), "I need to find the pages this question is about.")]
    if len(gold) > 1:
        plans.append((gold[1], f"I looked up {gold[0]}.{said} Now I need to find {gold[1]}."))
    return [
        {
            "search_id": f"{record['id']}:s{k}",
            "session_id": record["id"],
            "sub_query": sub_query,
            "question": question,
            "reasoning": reasoning,
            "answer": answer,
            "gold": gold,
            "own": [title for title, _ in record["context"]],
            "step": k,
        }
        for k, (sub_query, reasoning) in enumerate(plans, start=1)
    ]


def hotpotqa_searches(
    data_dir: str | os.PathLike | None = None,
    *,
    k: int = 10,
    records: list[dict[str, Any]] | None = None,
) -> pa.Table:
    """HotpotQA as a ``MUSIQUE_SEARCHES``-shaped table (split ``"dev"``); records with fewer
    than two gold pages in their context are skipped (logged)."""
    records = load_hotpotqa(data_dir) if records is None else records
    texts: dict[str, str] = {}
    for record in records:
        for title, sentences in record["context"]:
            texts.setdefault(title, f"{title}\n{''.join(sentences).strip()}")
    titles = list(texts)
    position = {t: i for i, t in enumerate(titles)}
    index = BM25Index([texts[t] for t in titles])
    plans = [s for record in records for s in _searches(record, texts)]
    skipped = len(records) - len({p["session_id"] for p in plans})
    if skipped:
        log.warning(
            "HotpotQA: %d of %d records have no gold page in the pool", skipped, len(records)
        )
    top, _ = index.search([p["sub_query"] for p in plans], k) if plans else ([], [])
    rows = []
    for plan, found in zip(plans, top, strict=True):
        chosen = list(dict.fromkeys([*plan["own"], *plan["gold"], *(titles[i] for i in found)]))
        scores = index.scores(plan["sub_query"], [position[t] for t in chosen])
        rows.append(
            {
                "search_id": plan["search_id"],
                "session_id": plan["session_id"],
                "sub_query": plan["sub_query"],
                "question": plan["question"],
                "reasoning": plan["reasoning"],
                "candidates": [
                    {
                        "doc_id": t,
                        "text": texts[t],
                        "first_stage_score": float(s),
                        "relevance": int(t in plan["gold"]),
                    }
                    for t, s in zip(chosen, scores, strict=True)
                ],
                "answer": plan["answer"],
                "supporting_docs": plan["gold"],
                "judge_ok": None,
                "split": "dev",
                "step": plan["step"],
                "reasoning_source": "synthetic",
            }
        )
    return pa.Table.from_pylist(rows, schema=MUSIQUE_SEARCHES)
