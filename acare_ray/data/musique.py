"""MuSiQue (CC BY 4.0; ``<data_dir>/musique``, see its SOURCE.md) -> agent searches.

One search per decomposition step. Conventions of this converter:

- ``sub_query``: the step with ``#k`` replaced by the gold answer of step k; a Wikidata-relation
  step ``X >> relation`` becomes the keyword query ``X relation``.
- ``reasoning``: **synthetic** (``reasoning_source = "synthetic"``): built from the earlier steps
  and their gold answers; step 1 states the plan without answers. It never contains the current
  step's answer (case-insensitive): a sentence that would is left out.
- candidate ``doc_id = f"{question_id}:{idx}"``, ``text = title + "\\n" + paragraph_text``.
- ``relevance`` 1 for the step's supporting paragraph, else 0; ``supporting_docs`` = all the
  question's supporting paragraphs; ``answer`` = the step's gold answer; ``split`` = dev/train.

Settings: ``"distractor"`` (the question's own ~20 paragraphs) and ``"open"`` (BM25 top-k over
the pooled, deduplicated paragraphs of all questions; the gold paragraph may be missing).
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
from acare_ray.data.io import write_parquet
from acare_ray.data.schema import SEARCHES

log = logging.getLogger(__name__)

# (path under <data_dir>/musique, JSON lines?, split)
FILES = (
    ("AdelWang_MIGRES/musique.json", True, "dev"),
    ("zirconiumnmlee_TCA/musique_dev_200.json", False, "dev"),
    ("zirconiumnmlee_TCA/musique_test_200.json", False, "dev"),
    ("OSU-NLP-Group_HippoRAG/musique_train.json", False, "train"),
)
MUSIQUE_SEARCHES = (
    SEARCHES.append(pa.field("split", pa.string()))
    .append(pa.field("step", pa.int32()))
    .append(pa.field("reasoning_source", pa.string()))
)
RECALL_KEY = b"acare.bm25_recall"
_REF = re.compile(r"#(\d+)")


def load_musique(data_dir: str | os.PathLike | None = None) -> list[dict[str, Any]]:
    """The unique MuSiQue records with paragraphs (649 here), each with an added ``split``.

    Read from ``<data_dir>/musique`` (default: :func:`acare_ray.data.io.data_dir`).

    Records are deduplicated by ``id``; two different records with one id raise ValueError.
    """
    root = (Path(data_dir) if data_dir is not None else default_data_dir()) / "musique"
    records: dict[str, dict[str, Any]] = {}
    for name, jsonl, split in FILES:
        path = root / name
        with open(path, encoding="utf-8") as f:
            items = [json.loads(line) for line in f if line.strip()] if jsonl else json.load(f)
        for record in items:
            record = {**record, "split": split}
            seen = records.setdefault(record["id"], record)
            if seen != record:
                raise ValueError(f"{path}: id={record['id']} differs from an earlier copy")
    return list(records.values())


def resolve_step(text: str, answers: list[str]) -> str:
    """The query an agent would send for a step: ``#k`` -> answer k; ``X >> rel`` -> ``X rel``."""

    def answer(match: re.Match) -> str:
        k = int(match.group(1))
        if not 1 <= k <= len(answers):
            raise ValueError(
                f"step {text!r} refers to #{k}, but only {len(answers)} earlier answers"
            )
        return answers[k - 1]

    resolved = _REF.sub(answer, text)
    if ">>" in resolved:
        resolved = " ".join(part.strip() for part in resolved.split(">>"))
    return " ".join(resolved.split())


def _plan_item(text: str) -> str:
    text = _REF.sub(lambda m: f"the answer to ({m.group(1)})", text)
    if ">>" in text:
        entity, _, relation = text.partition(">>")
        return f"look up '{relation.strip()}' for {entity.strip()}"
    return " ".join(text.split())


def synthetic_reasoning(steps: list[dict[str, Any]], k: int, answers: list[str]) -> str:
    """A synthetic agent trace before step ``k`` (0-based): the plan at step 0, else what the
    earlier steps found and what comes next. Sentences containing ``steps[k]["answer"]`` are
    dropped, so the trace never reveals the answer being searched for."""
    current = steps[k]["answer"].strip().lower()

    def clean(parts: list[str]) -> list[str]:
        return [part for part in parts if current not in part.lower()]

    if k == 0:
        items = clean([f"({j + 1}) {_plan_item(s['question'])}" for j, s in enumerate(steps)])
        sentences = [f"I will break the question into {len(steps)} lookups: {'; '.join(items)}."]
        sentences.append("I will start with (1) and use each answer in the later lookups.")
    else:
        sentences = [
            f"Searching for '{resolve_step(s['question'], answers[:j])}' told me: {s['answer']}."
            for j, s in enumerate(steps[:k])
        ]
        query = resolve_step(steps[k]["question"], answers)
        stop = "" if query.endswith(("?", ".")) else "."
        sentences.append(f"Next I need to find out: {query}{stop}")
    kept = clean(sentences)
    return " ".join(kept) if kept else "I will look up the next piece of information."


def _candidates(record: dict[str, Any]) -> list[dict[str, Any]]:
    paragraphs = record["paragraphs"]
    for position, p in enumerate(paragraphs):
        if p["idx"] != position:
            raise ValueError(f"id={record['id']}: paragraphs[{position}].idx is {p['idx']}")
    return [
        {"doc_id": f"{record['id']}:{p['idx']}", "text": f"{p['title']}\n{p['paragraph_text']}"}
        for p in paragraphs
    ]


def _distractor_rows(record: dict[str, Any]) -> list[dict[str, Any]]:
    qid, steps = record["id"], record["question_decomposition"]
    docs = _candidates(record)
    supporting = [
        d["doc_id"] for d, p in zip(docs, record["paragraphs"], strict=True) if p["is_supporting"]
    ]
    answers = [s["answer"] for s in steps]
    rows = []
    for k, step in enumerate(steps):
        gold = step["paragraph_support_idx"]
        if not 0 <= gold < len(docs):
            raise ValueError(f"id={qid}: question_decomposition[{k}].paragraph_support_idx={gold}")
        rows.append(
            {
                "search_id": f"{qid}:s{k + 1}",
                "session_id": qid,
                "sub_query": resolve_step(step["question"], answers[:k]),
                "question": record["question"],
                "reasoning": synthetic_reasoning(steps, k, answers[:k]),
                "candidates": [
                    {**d, "first_stage_score": None, "relevance": int(i == gold)}
                    for i, d in enumerate(docs)
                ],
                "answer": step["answer"],
                "supporting_docs": supporting,
                "judge_ok": None,
                "split": record["split"],
                "step": k + 1,
                "reasoning_source": "synthetic",
            }
        )
    return rows


def _open_rows(rows: list[dict[str, Any]], k: int) -> tuple[list[dict[str, Any]], float]:
    """Replace each row's candidates by BM25 top-``k`` over the pooled, deduplicated paragraphs."""
    canonical: dict[str, str] = {}  # text -> first doc_id with that text
    alias: dict[str, str] = {}  # any doc_id -> canonical doc_id
    for row in rows:
        for c in row["candidates"]:
            alias[c["doc_id"]] = canonical.setdefault(c["text"], c["doc_id"])
    corpus_ids, corpus_texts = list(canonical.values()), list(canonical.keys())
    positions, scores = BM25Index(corpus_texts).search([r["sub_query"] for r in rows], k)
    found = 0
    for row, pos, score in zip(rows, positions, scores, strict=True):
        gold = alias[next(c["doc_id"] for c in row["candidates"] if c["relevance"] == 1)]
        row["candidates"] = [
            {
                "doc_id": corpus_ids[p],
                "text": corpus_texts[p],
                "first_stage_score": float(s),
                "relevance": int(corpus_ids[p] == gold),
            }
            for p, s in zip(pos, score, strict=True)
        ]
        row["supporting_docs"] = list(dict.fromkeys(alias[d] for d in row["supporting_docs"]))
        found += any(c["relevance"] for c in row["candidates"])
    return rows, found / len(rows)


def musique_searches(
    setting: str = "distractor",
    data_dir: str | os.PathLike | None = None,
    *,
    k: int = 100,
    records: list[dict[str, Any]] | None = None,
) -> pa.Table:
    """MuSiQue as a ``MUSIQUE_SEARCHES`` table (``SEARCHES`` + split, step, reasoning_source).

    ``setting="open"`` retrieves BM25 top-``k``; the share of searches whose gold paragraph is
    among them is logged and stored in the schema metadata under ``acare.bm25_recall``.
    """
    if setting not in ("distractor", "open"):
        raise ValueError(f"setting must be 'distractor' or 'open', got {setting!r}")
    records = load_musique(data_dir) if records is None else records
    rows = [row for record in records for row in _distractor_rows(record)]
    schema = MUSIQUE_SEARCHES
    if setting == "open":
        rows, recall = _open_rows(rows, k)
        log.info("MuSiQue open setting: BM25 recall@%d of the gold paragraph = %.3f", k, recall)
        schema = schema.with_metadata({RECALL_KEY: json.dumps({"k": k, "recall": recall}).encode()})
    return pa.Table.from_pylist(rows, schema=schema)


def write_musique(
    path: str | os.PathLike,
    setting: str = "distractor",
    data_dir: str | os.PathLike | None = None,
) -> Path:
    """Convert and write one Parquet file; returns its path."""
    return write_parquet(musique_searches(setting, data_dir), path)
