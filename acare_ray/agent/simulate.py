"""The scripted agent (no LLM) and closed-loop concurrent sessions.

One session per task. At step ``k`` (0-based) the agent searches with attempt ``a`` = 1, 2, ...
up to ``budget``:

1. the step's keyword sub-query: ``resolve_step(step, answers so far)`` (``X >> rel`` -> ``X rel``);
2. the step's natural-language question with the earlier answers filled in (``X >> rel`` ->
   ``What is the rel of X?``; a step that already is a question is sent as it is, so this
   attempt returns the next unseen documents for it);
3. the sub-query plus the original question's most specific terms (its 3 rarest BM25 terms in the
   corpus that the sub-query lacks);

and attempts past 3 cycle through 1, 2, 3 again. Each search sends the original question and a
synthetic reasoning trace (:func:`acare_ray.data.musique.synthetic_reasoning` with the answers
found so far, plus one sentence per failed attempt of this step); sentences that contain the
current step's answer are left out, so the trace never reveals it.

A search is BM25 top-``first_stage_k`` over the corpus, minus the documents this session already
returned (in BM25 order, with their BM25 scores for fused rerankers), then the reranker, then its
top ``depth``: no document is returned twice in a session.
(Dropping seen candidates before reranking gives a pointwise reranker the same ranking as
dropping them after, and spares it the work.) After a search the step is solved when its
supporting paragraph has been returned in the session (by this search or an earlier one: the
agent keeps what it read); it then "reads" the step's answer and moves on. A step that uses up its
budget fails the task. Every step sends at least one search.

With a server-side system (:mod:`acare_ray.agent.searchers`: ``/v1/search`` or the MCP tool)
each search is one call carrying the session id, the query, the question and the reasoning; the
server runs the first stage, the reranker and the unseen filter (its session memory), and the
agent keeps the hits the server marks unseen (:func:`server_search` checks them against what the
session was shown).

The outcome of a task depends only on its own searches, so it does not depend on how many
sessions run at once (``agents``) or on their scheduling.
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass, replace
from functools import partial
from typing import Any

from acare_ray.agent.rerankers import AgentReranker, RerankRequest, check_order, rerank_counted
from acare_ray.agent.tasks import Corpus, Task
from acare_ray.data.musique import resolve_step, synthetic_reasoning

SPECIFIC_TERMS = 3
_REF = re.compile(r"#(\d+)")  # a reference to an earlier step's answer, as in musique.py
REFORMULATIONS = ("sub_query", "question", "specific_terms")
# SearchRecord fields that are measurements, not outcomes (rankings decide the rest).
TIMINGS = ("rerank_s", "latency_s", "tokens", "first_stage_s", "session_s")


@dataclass(frozen=True)
class SearchRecord:
    step: int  # 0-based
    attempt: int  # 1-based
    reformulation: str
    query: str
    returned: tuple[str, ...]
    solved: bool
    rerank_s: float
    latency_s: float  # first stage + rerank (+ session store), as the agent waits for it
    tokens: int = 0  # prompt tokens the reranker scored (0 for BM25 order and the oracle)
    # Client side: BM25 and the unseen filter; server side (/v1/search, MCP): the server's
    # first stage and session store (read + write), as its usage reports them.
    first_stage_s: float | None = None
    session_s: float | None = None


@dataclass(frozen=True)
class TaskResult:
    task_id: str
    n_steps: int
    steps_solved: int
    searches_per_step: tuple[int, ...]  # one entry per step attempted
    session_recall: float
    searches: tuple[SearchRecord, ...]

    @property
    def solved(self) -> bool:
        return self.steps_solved == self.n_steps

    @property
    def n_searches(self) -> int:
        return len(self.searches)

    @property
    def rerank_s(self) -> float:
        return sum(s.rerank_s for s in self.searches)

    @property
    def tokens(self) -> int:
        return sum(s.tokens for s in self.searches)

    def outcome(self) -> dict[str, Any]:
        """Everything but the timings: equal for equal rankings, whatever the scheduling."""
        return {
            "task_id": self.task_id,
            "solved": self.solved,
            "steps_solved": self.steps_solved,
            "searches_per_step": list(self.searches_per_step),
            "session_recall": self.session_recall,
            "searches": [
                {k: v for k, v in asdict(s).items() if k not in TIMINGS} for s in self.searches
            ],
        }


def natural_question(text: str, answers: Sequence[str]) -> str:
    """A step as a natural-language question with the earlier answers filled in."""
    filled = " ".join(_REF.sub(lambda m: answers[int(m.group(1)) - 1], text).split())
    if ">>" in filled:
        entity, _, relation = filled.partition(">>")
        return f"What is the {relation.strip()} of {entity.strip()}?"
    return filled


def reformulate(task: Task, k: int, answers: Sequence[str], attempt: int, corpus: Corpus) -> str:
    """The query of ``attempt`` (1-based) at step ``k``; see the module docstring."""
    step = task.steps[k]["question"]
    kind = REFORMULATIONS[(attempt - 1) % len(REFORMULATIONS)]
    sub_query = resolve_step(step, list(answers))
    if kind == "sub_query":
        return sub_query
    if kind == "question":
        return natural_question(step, answers)
    have = set(corpus.specific_terms(sub_query))
    extra = [t for t in task.terms if t not in have][:SPECIFIC_TERMS]
    return " ".join([sub_query, *extra])


def agent_reasoning(task: Task, k: int, answers: Sequence[str], failed: Sequence[str]) -> str:
    """The synthetic trace before a search: what was found so far, and this step's failed queries.

    Never contains the current step's answer (case-insensitive)."""
    base = synthetic_reasoning(list(task.steps), k, list(answers))
    current = task.steps[k]["answer"].strip().lower()
    notes = [
        f"The search '{q}' did not give me this; I will rephrase."
        for q in failed
        if current not in q.lower()
    ]
    return " ".join([base, *notes])


@dataclass(frozen=True)
class SearchSetting:
    """What every search of a run shares: the ``corpus``, the results an answer keeps
    (``depth``) and the first-stage candidates reranked (``first_stage_k``)."""

    corpus: Corpus
    depth: int
    first_stage_k: int


@dataclass(frozen=True)
class AgentSearch:
    """One search the agent sends: ``task``'s 0-based ``step``, the 1-based ``attempt`` at it,
    the reformulated ``query`` and the agent's ``reasoning`` before it."""

    task: Task
    step: int
    attempt: int
    query: str
    reasoning: str

    def record(self, returned: tuple[str, ...], **timings: Any) -> SearchRecord:
        """This search's :class:`SearchRecord` (``solved`` left False; ``timings``: its
        :data:`TIMINGS` fields)."""
        return SearchRecord(
            step=self.step,
            attempt=self.attempt,
            reformulation=REFORMULATIONS[(self.attempt - 1) % len(REFORMULATIONS)],
            query=self.query,
            returned=returned,
            solved=False,
            **timings,
        )


# A way to run one search: the search and the documents its session was shown so far.
Searcher = Callable[[AgentSearch, set[str]], SearchRecord]


def client_search(
    reranker: AgentReranker, setting: SearchSetting, search: AgentSearch, seen: set[str]
) -> SearchRecord:
    """One search with the first stage and the unseen filter here (``solved`` left False)."""
    corpus, depth = setting.corpus, setting.depth
    start = time.perf_counter()
    hits = [
        (p, s)
        for p, s in zip(*corpus.search(search.query, setting.first_stage_k))
        if corpus.ids[p] not in seen
    ]
    positions = [p for p, _ in hits]
    request = RerankRequest(
        query=search.query,
        question=search.task.question,
        reasoning=search.reasoning,
        documents=tuple(corpus.texts[p] for p in positions),
        doc_ids=tuple(corpus.ids[p] for p in positions),
        first_stage_scores=tuple(s for _, s in hits),
        task_id=search.task.task_id,
        step=search.step,
    )
    ranked = time.perf_counter()
    order, tokens = rerank_counted(reranker, request, depth) if positions else ([], 0)
    order = check_order(order, len(positions), depth, f"reranker {reranker.name}")
    end = time.perf_counter()
    return search.record(
        tuple(request.doc_ids[i] for i in order),
        rerank_s=end - ranked,
        latency_s=end - start,
        tokens=tokens,
        first_stage_s=ranked - start,
    )


def server_search(
    server: Any, session_id: str, setting: SearchSetting, search: AgentSearch, seen: set[str]
) -> SearchRecord:
    """One search sent whole to the server (a :class:`~acare_ray.agent.searchers.
    SessionSearcher`); the agent keeps the hits the server marks unseen.

    The server's answer is checked against the bench's own record of the session: every hit is
    a document of this run's corpus with the same text, marked seen exactly when the session was
    shown it before, and the first stage reranked ``min(first_stage_k, corpus size)``
    candidates; anything else is a ValueError naming the task, the search and the document (a
    served index that is not this run's corpus, or a session memory that lost or mixed up
    sessions)."""
    from acare_ray.agent.searchers import ServerSearch

    corpus, depth, first_stage_k = setting.corpus, setting.depth, setting.first_stage_k
    where = (
        f"task {search.task.task_id} step {search.step} attempt {search.attempt} ({server.name})"
    )
    start = time.perf_counter()
    answer = server.search(
        ServerSearch(
            session_id, search.query, search.task.question, search.reasoning, depth, first_stage_k
        )
    )
    end = time.perf_counter()
    expected = min(first_stage_k, len(corpus))
    if answer.candidates is not None and answer.candidates != expected:
        raise ValueError(
            f"{where}: the server reranked {answer.candidates} candidates, not {expected} "
            "(its first_stage_k or its index differs from this run's)"
        )
    if len(answer.hits) > depth:
        raise ValueError(f"{where}: {len(answer.hits)} results, more than top_k={depth}")
    for hit in answer.hits:
        position = corpus.position.get(hit.doc_id)
        if position is None or corpus.texts[position] != hit.text:
            raise ValueError(
                f"{where}: document {hit.doc_id!r} is not this run's corpus document "
                "(index the corpus written by --export-corpus with the same task flags)"
            )
        if hit.seen != (hit.doc_id in seen):
            raise ValueError(
                f"{where}: document {hit.doc_id!r} marked seen={hit.seen}, but the session "
                f"was {'' if hit.doc_id in seen else 'not '}shown it before"
            )
    returned = tuple(h.doc_id for h in answer.hits if not h.seen)
    if len(set(returned)) != len(returned):
        raise ValueError(f"{where}: a document is returned twice in one answer")
    return search.record(
        returned,
        rerank_s=answer.rerank_s if answer.rerank_s is not None else end - start,
        latency_s=end - start,
        tokens=answer.tokens,
        first_stage_s=answer.first_stage_s,
        session_s=answer.session_s,
    )


def run_task(
    task: Task,
    corpus: Corpus,
    reranker: AgentReranker,
    budget: int = 3,
    depth: int = 10,
    first_stage_k: int = 100,
) -> TaskResult:
    """One closed-loop session: each search depends on what the previous ones returned."""
    setting = SearchSetting(corpus, depth, first_stage_k)
    if not getattr(reranker, "server_sessions", False):
        return _run_task(task, corpus, budget, partial(client_search, reranker, setting))
    server: Any = reranker
    session_id = server.session_id(task.task_id)
    try:
        return _run_task(task, corpus, budget, partial(server_search, server, session_id, setting))
    finally:
        server.end_session(session_id)


def _run_task(task: Task, corpus: Corpus, budget: int, searcher: Searcher) -> TaskResult:
    seen: set[str] = set()
    answers: list[str] = []
    records: list[SearchRecord] = []
    per_step: list[int] = []
    for k, step in enumerate(task.steps):
        failed: list[str] = []
        solved = False
        for attempt in range(1, budget + 1):
            query = reformulate(task, k, answers, attempt, corpus)
            reasoning = agent_reasoning(task, k, answers, failed)
            record = searcher(AgentSearch(task, k, attempt, query, reasoning), seen)
            seen.update(record.returned)
            solved = task.gold_steps[k] in seen
            record = replace(record, solved=solved)
            records.append(record)
            if solved:
                break
            failed.append(query)
        per_step.append(attempt)
        if not solved:
            break
        answers.append(step["answer"])
    return TaskResult(
        task_id=task.task_id,
        n_steps=len(task.steps),
        steps_solved=len(answers),
        searches_per_step=tuple(per_step),
        session_recall=len(task.gold & seen) / len(task.gold),
        searches=tuple(records),
    )


def progress_printer(name: str, total: int, every: int) -> Callable[[int, int, int, float], None]:
    """A callback printing one line to stderr every ``every`` finished tasks (and at the end)."""

    def report(done: int, solved: int, searches: int, elapsed: float) -> None:
        if every > 0 and (done % every == 0 or done == total):
            print(
                f"agent-bench {name}: {done}/{total} tasks, {solved} solved, "
                f"{searches / done:.2f} searches/task, {elapsed:.1f} s",
                file=sys.stderr,
                flush=True,
            )

    return report


def run_sessions(
    tasks: Sequence[Task],
    corpus: Corpus,
    reranker: AgentReranker,
    *,
    agents: int = 1,
    budget: int = 3,
    depth: int = 10,
    first_stage_k: int = 100,
    progress: Callable[[int, int, int, float], None] | None = None,
    ramp_s: float = 0.0,
) -> tuple[list[TaskResult], float]:
    """All tasks with ``agents`` sessions in flight at once (threads); results in task order,
    and the wall time in seconds. ``ramp_s`` > 0 staggers the first ``agents`` sessions evenly
    over that many seconds (the ``i``-th starts ``i * ramp_s / agents`` after the first), a load
    that grows instead of stepping; the sessions after them start as slots free."""
    if agents < 1:
        raise ValueError(f"agents must be >= 1, got {agents}")
    if not ramp_s >= 0:
        raise ValueError(f"ramp_s must be >= 0, got {ramp_s}")
    if budget < 1:
        raise ValueError(f"budget must be >= 1, got {budget}")
    results: list[TaskResult | None] = [None] * len(tasks)
    start = time.perf_counter()
    done = solved = searches = 0

    def session(i: int, task: Task) -> TaskResult:
        if ramp_s > 0 and i < agents:
            time.sleep(max(0.0, start + i * ramp_s / agents - time.perf_counter()))
        return run_task(task, corpus, reranker, budget, depth, first_stage_k)

    with ThreadPoolExecutor(max_workers=agents) as pool:
        futures = {pool.submit(session, i, task): i for i, task in enumerate(tasks)}
        for future in as_completed(futures):
            result = future.result()
            results[futures[future]] = result
            done, solved, searches = done + 1, solved + result.solved, searches + result.n_searches
            if progress is not None:
                progress(done, solved, searches, time.perf_counter() - start)
    return [r for r in results if r is not None], time.perf_counter() - start
