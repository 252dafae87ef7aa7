"""Real agent trajectories -> the searches table, with task-level (page) labels.

One search per agent query. ``sub_query`` is the query as the agent wrote it; ``reasoning`` is
the agent's text of the current turn just before it (after the previous documents block, or
from the start of the trajectory; absent when empty); ``question`` is the original question;
``session_id`` is the trajectory (``{agent}:{question_id}``) and ``step`` the 1-based position
of the search in it.

Two input formats:

- ``r1-searcher``: R1-Searcher's evaluation JSONL (``question``, ``answer``, ``gpt4o_output``,
  ``gen_text_store`` with ``<|begin_of_query|> ... <|end_of_query|>`` and
  ``<|begin_of_documents|> (k)... <|end_of_documents|>``). A passage is read in either layout
  these logs print: labelled, ``(k)Title: T Text: X``, or unlabelled, ``(k)T   X``: the title,
  a run of two or more spaces (or a tab or line break), then the text (kept as printed, which
  often repeats the title).
- ``generic``: one JSON object per trajectory, for any agent's logs::

    {"session_id": "s1", "question": "...", "answer": "..." | null, "judge_ok": true | null,
     "agent": "my-agent" | null, "question_id": "q1" | null,
     "supporting_titles": ["Page A", "Page B"] | null,
     "steps": [{"reasoning": "..." | null, "query": "...",
                "documents": [{"title": "...", "text": "..."}, ...]}, ...]}

  ``session_id``, ``question`` and ``steps`` are required, and each step's ``query``.

A bad line (not JSON, a required field missing) or a bad step is reported with its line number
and what is wrong (:class:`Problem`); the rest is imported. A search whose passages cannot be
parsed is imported without them and its problem says so (``lost_documents``, naming file:line
and the search index); ``acare import-traces`` then exits non-zero unless ``--keep-going``.

Candidates of a search: the passages the agent's own retriever returned for it (``origin``
``agent``, ``agent_rank`` 1..n) plus BM25 top-``k`` for the sub-query over the pooled,
deduplicated passages of every trajectory imported together and the gold file's context
paragraphs (``origin`` ``bm25``, or ``agent+bm25`` when both); ``first_stage_score`` is the BM25
score (null for an agent passage outside the BM25 top-``k``). A document is ``title + "\\n" +
text``; ``doc_id`` is a hash of that text.

Two first stages are recorded: BM25 is the first stage of the fusion and the ``first_stage``
system of ``acare eval`` (its order is ``first_stage_score`` descending, agent passages outside
the BM25 top-``k`` last, :func:`acare_ray.ranking.fusion.first_stage_ranks`); the agent's own order is
``agent_rank`` (kept by :func:`acare_ray.data.schema.parse_search`), the ``agent_order`` system.

Labels are **task-level, page-level**: a candidate is relevant (1) when its normalised page
title (:func:`page_key`) is one of the question's gold supporting titles, whatever sub-query the
search sent. Which of the gold pages a search was after is not known, so a search is judged by
whether it brought up evidence for the task, not for its own sub-query. Searches of a question
without gold have null labels.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from acare_ray.data.bm25 import BM25Index
from acare_ray.data.io import jsonl_lines
from acare_ray.data.schema import CANDIDATE, SEARCHES

log = logging.getLogger(__name__)

FORMATS = ("r1-searcher", "generic")

TRACE_CANDIDATE = pa.struct(
    [CANDIDATE.field(name) for name in ("doc_id", "text", "first_stage_score", "relevance")]
    + [("page", pa.string()), ("origin", pa.string()), ("agent_rank", pa.int32())]
)
TRACE_SEARCHES = (
    SEARCHES.set(
        SEARCHES.get_field_index("candidates"), pa.field("candidates", pa.list_(TRACE_CANDIDATE))
    )
    .append(pa.field("agent", pa.string()))
    .append(pa.field("question_id", pa.string()))
    .append(pa.field("step", pa.int32()))
    .append(pa.field("supporting_titles", pa.list_(pa.string())))
    .append(pa.field("supporting_pages", pa.list_(pa.string())))
    .append(pa.field("reasoning_source", pa.string()))
)
"""``SEARCHES`` plus: per candidate ``page`` (normalised title), ``origin`` and ``agent_rank``;
per search ``agent``, ``question_id`` (the split key shared by every agent's trajectory of one
question), ``step``, ``supporting_titles`` (the gold titles as given), ``supporting_pages``
(normalised) and ``reasoning_source``
(``agent``: the agent's own text)."""
IMPORT_KEY = b"acare.trace_import"

_QUERY = re.compile(r"<\|begin_of_query\|>(.*?)<\|end_of_query\|>", re.S)
_DOCS = re.compile(r"\s*<\|begin_of_documents\|>(.*?)<\|end_of_documents\|>", re.S)
_PASSAGE = re.compile(r"^\((\d+)\)(.*?)(?=^\(\d+\)|\Z)", re.S | re.M)
_TITLE_TEXT = re.compile(r"Title:\s*(.*?)\s+Text:\s*(.*)", re.S)
# Unlabelled layout: the title, then a run of two or more spaces (or a tab or line break), then
# the text (which often starts by repeating the title).
_TITLE_GAP_TEXT = re.compile(r"(\S.*?)(?: {2,}|\t|\n)\s*(\S.*)", re.S)


LOST_DOCUMENTS = "imported without its documents"


@dataclass(frozen=True)
class Problem:
    """A line or step that was not imported (or imported in part), and why."""

    source: str
    line: int
    message: str

    @property
    def lost_documents(self) -> bool:
        """A search was imported without the documents its agent saw."""
        return LOST_DOCUMENTS in self.message

    def __str__(self) -> str:
        return f"{self.source}:{self.line}: {self.message}"


@dataclass(frozen=True)
class Step:
    query: str
    reasoning: str | None
    documents: tuple[tuple[str, str], ...]  # (title, text) as the agent's retriever returned


@dataclass(frozen=True)
class Trajectory:
    session_id: str
    agent: str
    question: str
    steps: tuple[Step, ...]
    answer: str | None = None
    judge_ok: bool | None = None
    question_id: str | None = None
    supporting_titles: tuple[str, ...] | None = None
    line: int = 0


@dataclass
class ImportResult:
    """The searches table and what the import saw: counts and every problem."""

    table: pa.Table
    sessions: int
    searches: int
    problems: list[Problem] = field(default_factory=list)
    sessions_without_gold: int = 0
    corpus_size: int = 0
    searches_with_relevant: int = 0

    def describe(self) -> str:
        return (
            f"{self.sessions} sessions, {self.searches} searches "
            f"({self.searches_with_relevant} with a gold-page candidate), corpus "
            f"{self.corpus_size} passages, {self.sessions_without_gold} sessions without gold, "
            f"{len(self.problems)} problems"
        )


def normalise_question(text: str) -> str:
    """The join key of a question: NFC, whitespace collapsed."""
    return " ".join(unicodedata.normalize("NFC", text).split())


def page_key(title: str) -> str:
    """A page title as compared with gold titles: accents, case and punctuation removed."""
    decomposed = unicodedata.normalize("NFKD", title)
    plain = "".join(ch for ch in decomposed if not unicodedata.combining(ch)).lower()
    plain = "".join(ch if ch.isalnum() else " " for ch in plain)
    return " ".join(plain.split())


def _page_text(title: str, text: str) -> str:
    return f"{title}\n{text}"


def doc_id_of(text: str) -> str:
    return "d" + hashlib.sha1(text.encode("utf-8")).hexdigest()[:16]


def _clean(text: str | None) -> str | None:
    if text is None:
        return None
    text = text.strip()
    return text or None


def _passages(block: str) -> list[tuple[str, str]]:
    out = []
    for _, body in _PASSAGE.findall(block.strip()):
        body = body.strip()
        if len(body) >= 2 and body.startswith('"') and body.endswith('"'):
            body = body[1:-1].replace('""', '"')  # CSV-quoted passages
        match = _TITLE_TEXT.match(body) or _TITLE_GAP_TEXT.match(body)
        if match is None:
            raise ValueError(
                "a passage in neither layout ('Title: T Text: X', or the title, a run of "
                f"spaces, then the text): {body[:60]!r}"
            )
        title, text = match.group(1).strip(), " ".join(match.group(2).split())
        if not title or not text:
            raise ValueError(f"a passage with an empty title or text: {body[:60]!r}")
        out.append((title, text))
    return out


def parse_r1_steps(text: str) -> tuple[list[Step], list[str]]:
    """The searches of one R1-Searcher ``gen_text_store`` and the problems of its steps.

    A search's reasoning is the text between the previous documents block (or the start) and
    its ``<|begin_of_query|>``; a query without a documents block after it keeps no documents.
    """
    steps, problems, position = [], [], 0
    for k, match in enumerate(_QUERY.finditer(text), start=1):
        reasoning = _clean(text[position : match.start()])
        query = " ".join(match.group(1).split())
        docs_match = _DOCS.match(text, match.end())
        position = docs_match.end() if docs_match else match.end()
        if not query:
            problems.append(f"search {k}: the query is empty (skipped)")
            continue
        try:
            documents = _passages(docs_match.group(1)) if docs_match else []
        except ValueError as err:
            problems.append(f"search {k}: {err} ({LOST_DOCUMENTS})")
            documents = []
        steps.append(Step(query, reasoning, tuple(documents)))
    return steps, problems


def _json_lines(path: Path, problems: list[Problem]) -> Iterable[tuple[int, dict[str, Any]]]:
    for number, record in jsonl_lines(path):
        if isinstance(record, str):
            problems.append(Problem(str(path), number, f"{record}; skipped"))
        else:
            yield number, record


def _required_text(record: dict[str, Any], name: str) -> str:
    value = record.get(name)
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{name} is missing or not a non-empty string")
    return value


def _judge(value: Any) -> bool | None:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    return None


def _question_id(question: str) -> str:
    return "q" + hashlib.sha1(normalise_question(question).encode("utf-8")).hexdigest()[:12]


def read_r1_searcher(
    path: str | os.PathLike, agent: str | None = None, problems: list[Problem] | None = None
) -> list[Trajectory]:
    """Trajectories of an R1-Searcher eval file; ``agent`` defaults to the file name's last
    ``_`` part (``hotpotqa_qwen.jsonl`` -> ``qwen``)."""
    path = Path(path)
    problems = [] if problems is None else problems
    agent = agent or path.stem.split("_")[-1]
    out = []
    for number, record in _json_lines(path, problems):
        try:
            question = _required_text(record, "question")
            text = _required_text(record, "gen_text_store")
        except ValueError as err:
            problems.append(Problem(str(path), number, f"{err}; skipped"))
            continue
        steps, step_problems = parse_r1_steps(text)
        problems.extend(Problem(str(path), number, p) for p in step_problems)
        qid = _question_id(question)
        out.append(
            Trajectory(
                session_id=f"{agent}:{qid}",
                agent=agent,
                question=question,
                steps=tuple(steps),
                answer=_clean(record.get("answer"))
                if isinstance(record.get("answer"), str)
                else None,
                judge_ok=_judge(record.get("gpt4o_output")),
                question_id=qid,
                line=number,
            )
        )
    return out


def _generic_step(raw: Any, k: int) -> Step:
    if not isinstance(raw, dict):
        raise ValueError(f"steps[{k}] must be an object, got {type(raw).__name__}")
    query = raw.get("query")
    if not isinstance(query, str) or not query.strip():
        raise ValueError(f"steps[{k}].query is missing or empty")
    reasoning = raw.get("reasoning")
    if reasoning is not None and not isinstance(reasoning, str):
        raise ValueError(f"steps[{k}].reasoning must be a string or null")
    documents = []
    for j, doc in enumerate(raw.get("documents") or []):
        title = doc.get("title") if isinstance(doc, dict) else None
        text = doc.get("text") if isinstance(doc, dict) else None
        if not isinstance(title, str) or not isinstance(text, str) or not text.strip():
            raise ValueError(f"steps[{k}].documents[{j}] needs a string title and a non-empty text")
        documents.append((title.strip(), " ".join(text.split())))
    return Step(" ".join(query.split()), _clean(reasoning), tuple(documents))


def read_generic(
    path: str | os.PathLike, problems: list[Problem] | None = None
) -> list[Trajectory]:
    """Trajectories of a generic trajectory JSONL (see the module docstring)."""
    path = Path(path)
    problems = [] if problems is None else problems
    out = []
    for number, record in _json_lines(path, problems):
        try:
            session_id = _required_text(record, "session_id")
            question = _required_text(record, "question")
            raw_steps = record.get("steps")
            if not isinstance(raw_steps, list):
                raise ValueError("steps is missing or not a list")
        except ValueError as err:
            problems.append(Problem(str(path), number, f"{err}; skipped"))
            continue
        steps = []
        for k, raw in enumerate(raw_steps):
            try:
                steps.append(_generic_step(raw, k))
            except ValueError as err:
                problems.append(Problem(str(path), number, f"{err}; step skipped"))
        titles = record.get("supporting_titles")
        qid = record.get("question_id")
        out.append(
            Trajectory(
                session_id=session_id,
                agent=str(record.get("agent") or "agent"),
                question=question,
                steps=tuple(steps),
                answer=record.get("answer") if isinstance(record.get("answer"), str) else None,
                judge_ok=_judge(record.get("judge_ok")),
                question_id=str(qid) if qid is not None else _question_id(question),
                supporting_titles=tuple(titles) if isinstance(titles, list) else None,
                line=number,
            )
        )
    return out


def write_generic(trajectories: Sequence[Trajectory], path: str | os.PathLike) -> int:
    """Write trajectories in the generic format (gold titles included where known)."""
    from acare_ray.data.io import write_jsonl

    def record(t: Trajectory) -> dict[str, Any]:
        return {
            "session_id": t.session_id,
            "agent": t.agent,
            "question_id": t.question_id,
            "question": t.question,
            "answer": t.answer,
            "judge_ok": t.judge_ok,
            "supporting_titles": list(t.supporting_titles) if t.supporting_titles else None,
            "steps": [
                {
                    "reasoning": s.reasoning,
                    "query": s.query,
                    "documents": [{"title": a, "text": b} for a, b in s.documents],
                }
                for s in t.steps
            ],
        }

    return write_jsonl((record(t) for t in trajectories), path)


@dataclass(frozen=True)
class Gold:
    question_id: str
    supporting_titles: tuple[str, ...]
    answer: str | None
    context: tuple[tuple[str, str], ...]  # (title, paragraph) of the official record, if any


def read_gold(path: str | os.PathLike) -> dict[str, Gold]:
    """``{normalised question: Gold}`` of a HotpotQA-style gold file (``question``,
    ``supporting_titles``, optional ``source_id``, ``answer``, ``context``)."""
    out = {}
    for number, record in _json_lines(Path(path), problems := []):
        titles = record.get("supporting_titles")
        question = record.get("question")
        if not isinstance(question, str) or not isinstance(titles, list) or not titles:
            problems.append(Problem(str(path), number, "question or supporting_titles missing"))
            continue
        context = []
        for item in record.get("context") or []:
            if isinstance(item, list) and len(item) == 2 and isinstance(item[1], list):
                paragraph = " ".join("".join(item[1]).split())
                if paragraph:
                    context.append((str(item[0]), paragraph))
        out[normalise_question(question)] = Gold(
            question_id=str(record.get("source_id") or _question_id(question)),
            supporting_titles=tuple(str(t) for t in titles),
            answer=record.get("answer") if isinstance(record.get("answer"), str) else None,
            context=tuple(context),
        )
    for problem in problems:
        log.warning("gold file: %s", problem)
    return out


def attach_gold(trajectories: Sequence[Trajectory], gold: dict[str, Gold]) -> list[Trajectory]:
    """Trajectories with ``question_id``, ``supporting_titles`` (and ``answer`` where missing)
    from the gold file, joined by normalised question text; unmatched ones are kept as they are
    (a generic trajectory's own gold titles win)."""
    from dataclasses import replace

    out = []
    for t in trajectories:
        match = gold.get(normalise_question(t.question))
        if match is None:
            out.append(t)
            continue
        question_id = (
            match.question_id if t.question_id == _question_id(t.question) else t.question_id
        )
        derived = t.session_id == f"{t.agent}:{t.question_id}"
        out.append(
            replace(
                t,
                session_id=f"{t.agent}:{question_id}" if derived else t.session_id,
                question_id=question_id,
                supporting_titles=t.supporting_titles or match.supporting_titles,
                answer=t.answer or match.answer,
            )
        )
    return out


@dataclass(frozen=True)
class _PassagePool:
    """The BM25 corpus of an import: every passage once by text (``docs``: doc_id -> (title,
    document text), in first-seen order) and the doc_ids of each page (``by_page``)."""

    docs: dict[str, tuple[str, str]]
    by_page: dict[str, list[str]]

    @classmethod
    def of(cls, passages: Iterable[tuple[str, str]]) -> _PassagePool:
        docs: dict[str, tuple[str, str]] = {}
        for title, text in passages:
            doc = _page_text(title, text)
            docs.setdefault(doc_id_of(doc), (title, doc))
        by_page: dict[str, list[str]] = {}
        for doc_id, (title, _) in docs.items():
            by_page.setdefault(page_key(title), []).append(doc_id)
        return cls(docs, by_page)


def _candidates(
    step: Step, bm25: dict[str, float], pool: _PassagePool, gold: set[str] | None
) -> list[dict[str, Any]]:
    """A search's candidates: the agent's documents in its order (once each), then the BM25
    hits it did not return; ``relevance`` from the gold pages (None without gold)."""
    candidates: dict[str, dict[str, Any]] = {}
    for rank, (title, text) in enumerate(step.documents, start=1):
        doc = _page_text(title, text)
        doc_id = doc_id_of(doc)
        if doc_id in candidates:
            continue
        candidates[doc_id] = {
            "doc_id": doc_id,
            "text": doc,
            "first_stage_score": bm25.get(doc_id),
            "page": page_key(title),
            "origin": "agent+bm25" if doc_id in bm25 else "agent",
            "agent_rank": rank,
        }
    for doc_id, value in bm25.items():
        if doc_id not in candidates:
            title, doc = pool.docs[doc_id]
            candidates[doc_id] = {
                "doc_id": doc_id,
                "text": doc,
                "first_stage_score": value,
                "page": page_key(title),
                "origin": "bm25",
                "agent_rank": None,
            }
    for c in candidates.values():
        c["relevance"] = None if gold is None else int(c["page"] in gold)
    return list(candidates.values())


def _search_row(
    t: Trajectory, number: int, step: Step, bm25: dict[str, float], pool: _PassagePool
) -> dict[str, Any]:
    """The ``TRACE_SEARCHES`` row of search ``number`` (1-based) of trajectory ``t``."""
    gold = {page_key(x) for x in t.supporting_titles} if t.supporting_titles else None
    supporting = None
    if gold is not None:
        supporting = [i for page in sorted(gold) for i in pool.by_page.get(page, [])]
    return {
        "search_id": f"{t.session_id}:s{number}",
        "session_id": t.session_id,
        "sub_query": step.query,
        "question": t.question,
        "reasoning": step.reasoning,
        "candidates": _candidates(step, bm25, pool, gold),
        "answer": t.answer,
        "supporting_docs": supporting,
        "judge_ok": t.judge_ok,
        "agent": t.agent,
        "question_id": t.question_id,
        "step": number,
        "supporting_titles": list(t.supporting_titles) if t.supporting_titles else None,
        "supporting_pages": sorted(gold) if gold is not None else None,
        "reasoning_source": "agent",
    }


def build_searches(
    trajectories: Sequence[Trajectory],
    extra_passages: Iterable[tuple[str, str]] = (),
    k: int = 100,
) -> tuple[pa.Table, int]:
    """The ``TRACE_SEARCHES`` table of ``trajectories`` and the size of the BM25 corpus.

    The corpus pools every trajectory's returned passages and ``extra_passages`` (title, text),
    deduplicated by text.
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    pool = _PassagePool.of(
        [d for t in trajectories for s in t.steps for d in s.documents] + list(extra_passages)
    )
    ids = list(pool.docs)
    searches = [(t, step, s) for t in trajectories for step, s in enumerate(t.steps, start=1)]
    if not ids or not searches:
        return pa.Table.from_pylist([], schema=TRACE_SEARCHES), len(ids)
    positions, scores = BM25Index([pool.docs[i][1] for i in ids]).search(
        [s.query for _, _, s in searches], k
    )
    rows = [
        _search_row(t, step, s, {ids[p]: float(v) for p, v in zip(pos, score, strict=True)}, pool)
        for (t, step, s), pos, score in zip(searches, positions, scores, strict=True)
    ]
    return pa.Table.from_pylist(rows, schema=TRACE_SEARCHES), len(ids)


def import_traces(
    inputs: Sequence[str | os.PathLike],
    input_format: str = "r1-searcher",
    gold: str | os.PathLike | None = None,
    k: int = 100,
) -> ImportResult:
    """Read trajectory files (one agent each for ``r1-searcher``), join the gold file, build
    candidates and labels. Problems are collected, logged, and kept in the result."""
    if input_format not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS}, got {input_format!r}")
    if not inputs:
        raise ValueError("no trajectory files given")
    problems: list[Problem] = []
    trajectories: list[Trajectory] = []
    for path in inputs:
        if not Path(path).is_file():
            raise ValueError(f"{path}: no such trajectory file")
        reader = read_r1_searcher if input_format == "r1-searcher" else read_generic
        trajectories.extend(reader(path, problems=problems))
    extra: list[tuple[str, str]] = []
    if gold is not None:
        if not Path(gold).is_file():
            raise ValueError(f"{gold}: no such gold file")
        gold_records = read_gold(gold)
        trajectories = attach_gold(trajectories, gold_records)
        wanted = {normalise_question(t.question) for t in trajectories}
        extra = [p for q, g in gold_records.items() if q in wanted for p in g.context]
    seen: set[str] = set()
    for t in trajectories:
        if t.session_id in seen:
            raise ValueError(f"session_id {t.session_id!r} occurs twice (line {t.line})")
        seen.add(t.session_id)
    table, corpus_size = build_searches(trajectories, extra, k)
    for problem in problems:
        log.warning("%s", problem)
    with_relevant = sum(
        any(c["relevance"] for c in row) for row in table.column("candidates").to_pylist()
    )
    result = ImportResult(
        table=table,
        sessions=len(trajectories),
        searches=table.num_rows,
        problems=problems,
        sessions_without_gold=sum(not t.supporting_titles for t in trajectories),
        corpus_size=corpus_size,
        searches_with_relevant=with_relevant,
    )
    notes = {
        "format": input_format,
        "k": k,
        "sessions": result.sessions,
        "searches": result.searches,
        "corpus_size": corpus_size,
        "sessions_without_gold": result.sessions_without_gold,
        "searches_with_relevant": with_relevant,
        "problems": [str(p) for p in problems[:100]],
        "labels": "page-level, per question: a candidate is relevant when its page is a gold "
        "supporting page of the question",
    }
    result.table = table.replace_schema_metadata({IMPORT_KEY: json.dumps(notes).encode()})
    return result
