"""Seeded synthetic agent searches in which the agent's context decides relevance.

Each session is a multi-hop question about a fictional world of 16 countries, each with a
capital, currency, language and one *anchor* (a river, mountain range or trade league) shared
with 2-4 other countries. Step 1 finds which country the anchor singles out ("where the X River
rises"); step 2 asks a fact of that country; an optional step 3 asks a fact of its capital.

Sub-queries of steps 2 and 3 are bare keywords ("capital city", "city population"), as an agent
writes them when it relies on its context, and every country's document for that fact contains
them, so the sub-query alone (M0) cannot tell ~16 candidates apart. The question names the
anchor, which only the 3-5 documents of its countries mention (M2 narrows). The reasoning names
the intermediate entity found so far, never the answer, which pins the document (M1/M3).
Reasoning is synthetic (``reasoning_source = "synthetic"``). ``first_stage_score`` is the share
of sub-query words in the document (a stand-in first-stage retriever). Sessions are generated
independently from ``(seed, index)``, so the first n sessions do not depend on ``n_sessions``.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from acare_ray.data import synthetic_text as T
from acare_ray.data.groups import searches_to_groups
from acare_ray.data.schema import SEARCHES

SYNTHETIC_SEARCHES = SEARCHES.append(pa.field("step", pa.int32())).append(
    pa.field("reasoning_source", pa.string())
)
N_COUNTRIES = 16
_WORD = re.compile(r"\w+")


def words(text: str) -> set[str]:
    """Lowercase word tokens, the unit of keyword matching here."""
    return set(_WORD.findall(text.lower()))


class _World:
    def __init__(self, rng: random.Random) -> None:
        self.rng, self.names = rng, []
        self.kind = rng.choice(sorted(T.ANCHORS))
        spec = T.ANCHORS[self.kind]
        sizes = rng.choice([[3, 4, 4, 5], [4, 4, 4, 4], [3, 3, 5, 5], [3, 4, 5, 4]])
        self.anchors = [spec["name"].format(self.name("anchor")) for _ in sizes]
        self.peaks = [self.name("anchor") for _ in sizes]
        owner = [a for a, size in enumerate(sizes) for _ in range(size)]
        rng.shuffle(owner)
        self.countries = [
            {
                "name": self.name("country"),
                "anchor": a,
                "capital": self.name("city"),
                "currency": f"{self.name('thing')} {rng.choice(['crown', 'mark', 'florin', 'thaler'])}",
                "language": self.name("thing") + rng.choice(["ic", "ish", "ese", "an"]),
                "population": f"{rng.randint(40, 2400) * 1000:,}",
                "founded": str(rng.randint(900, 1850)),
                "mayor": f"{self.name('person')} {self.name('person')}",
            }
            for a in owner
        ]
        self.seat = {  # anchor -> the one country it singles out
            a: rng.choice([i for i, c in enumerate(self.countries) if c["anchor"] == a])
            for a in range(len(sizes))
        }
        self.docs: dict[tuple, str] = {}

    def name(self, kind: str) -> str:
        while True:
            name = T.make_name(self.rng, kind)
            low = name.lower()
            if len(name) >= 5 and not any(low in n or n in low for n in self.names):
                self.names.append(low)
                return name

    def _finish(self, text: str) -> str:
        fillers = self.rng.sample(T.FILLERS, self.rng.randint(1, 3))
        pick = self.rng.sample(T.WARES, 2)
        fill = {"w": pick[0], "w2": pick[1], "t": self.rng.choice(T.TERRAIN)}
        extra = [f.format(**fill, f=self.rng.choice(T.FOODS)) for f in fillers]
        return " ".join([text, *extra])

    def doc(self, key: tuple) -> str:
        """The text of one fact, written once per session (same fact, same document)."""
        if key not in self.docs:
            self.docs[key] = self._finish(self._write(*key))
        return self.docs[key]

    def _write(self, kind: str, i: int, fact: str = "") -> str:
        rng, spec = self.rng, T.ANCHORS[self.kind]
        if kind == "anchor_other":
            return spec["other"][int(fact)].format(a=self.anchors[i], n=rng.randint(80, 900))
        c = self.countries[i]
        fill = {"a": self.anchors[c["anchor"]], "c": c["name"], "x": self.peaks[c["anchor"]]}
        if kind == "anchor":
            role = "gold" if self.seat[c["anchor"]] == i else "near"
            return rng.choice(spec[role]).format(**fill)
        if kind == "country":
            k = rng.choice(spec["country_clause"]).format(**fill)
            return rng.choice(T.COUNTRY_FACTS[fact]["templates"]).format(
                c=c["name"], k=k, v=c[fact]
            )
        k = rng.choice(spec["city_clause"]).format(**fill)
        template = rng.choice(T.CITY_FACTS[fact]["templates"])
        return template.format(y=c["capital"], c=c["name"], k=k, v=c[fact])


@dataclass(frozen=True)
class _Step:
    sub_query: str
    answer: str
    reasoning: str
    pool: list[tuple]  # fact keys of the candidates
    gold: tuple


def _story(world: _World, rng: random.Random) -> tuple[str, list[_Step]]:
    """The question and its 2-3 steps: anchor -> country, country fact, optional capital fact."""
    spec = T.ANCHORS[world.kind]
    target = rng.randrange(len(world.anchors))
    g = world.seat[target]
    country = world.countries[g]
    chain = rng.choice(sorted(T.QUESTIONS))
    fill = {"a": world.anchors[target], "c": country["name"], "x": world.peaks[target]}
    question = T.QUESTIONS[chain].format(q=rng.choice(spec["question"]).format(**fill))
    ask = T.COUNTRY_FACTS[chain[0]]["ask"]
    plan = f"To answer this, I will first {spec['plan'].format(**fill)}, then look up {ask} that country"
    if len(chain) == 2:
        plan += f", and finally {T.CITY_FACTS[chain[1]]['ask']} its capital"
    found = rng.choice(spec["found"]).format(**fill)
    other_anchors = [a for a in range(len(world.anchors)) if a != target]
    steps = [
        _Step(
            spec["sub_query"].format(**fill),
            country["name"],
            plan + ".",
            [("anchor", i) for i in range(N_COUNTRIES)]
            + [("anchor_other", target, "0"), ("anchor_other", target, "1")]
            + [("anchor_other", a, "0") for a in rng.sample(other_anchors, 2)],
            ("anchor", g),
        )
    ]
    reasoning = f"{found} Now I need {ask} {country['name']}."
    steps.append(_fact_step("country", T.COUNTRY_FACTS, chain[0], country, reasoning, g, rng))
    if len(chain) == 2:
        capital, city_ask = country["capital"], T.CITY_FACTS[chain[1]]["ask"]
        reasoning = f"{found} Its capital is {capital}. Finally I need {city_ask} {capital}."
        steps.append(_fact_step("city", T.CITY_FACTS, chain[1], country, reasoning, g, rng))
    return question, steps


def _fact_step(
    kind: str, facts: dict, fact: str, country: dict, reasoning: str, g: int, rng: random.Random
) -> _Step:
    """The step that looks up ``fact`` (a key of ``facts``) of country ``g``: its candidates are
    that fact of every country, the other facts of ``g`` and a random fact of two others."""
    rest = [f for f in facts if f != fact]
    others = [i for i in range(N_COUNTRIES) if i != g]
    return _Step(
        facts[fact]["sub_query"],
        country[fact],
        reasoning,
        [(kind, i, fact) for i in range(N_COUNTRIES)]
        + [(kind, g, f) for f in rest]
        + [(kind, i, rng.choice(rest)) for i in rng.sample(others, 2)],
        (kind, g, fact),
    )


def _session(seed: int, index: int, salt: int) -> list[dict[str, Any]]:
    rng = random.Random(f"acare-synthetic|{seed}|{index}|{salt}")
    world = _World(rng)
    question, steps = _story(world, rng)
    session_id = f"syn{seed}-{index:05d}"
    ids: dict[str, str] = {}  # text -> doc id, so a fact shared by two steps keeps one id
    rows = []
    for k, step in enumerate(steps, start=1):
        keys = list(dict.fromkeys(step.pool))
        rng.shuffle(keys)
        candidates = []
        for key in keys:
            text = world.doc(key)
            overlap = len(words(step.sub_query) & words(text)) / len(words(step.sub_query))
            candidates.append(
                {
                    "doc_id": ids.setdefault(text, f"{session_id}:d{len(ids)}"),
                    "text": text,
                    "first_stage_score": overlap,
                    "relevance": int(key == step.gold),
                }
            )
        rows.append(
            {
                "search_id": f"{session_id}:s{k}",
                "session_id": session_id,
                "sub_query": step.sub_query,
                "question": question,
                "reasoning": step.reasoning,
                "candidates": candidates,
                "answer": step.answer,
                "judge_ok": True,
                "step": k,
                "reasoning_source": "synthetic",
            }
        )
    support = [ids[world.doc(step.gold)] for step in steps]
    return [{**row, "supporting_docs": support} for row in rows]


def _valid(rows: list[dict[str, Any]]) -> bool:
    for row in rows:
        keys = words(row["sub_query"])
        full = [c for c in row["candidates"] if keys <= words(c["text"])]
        gold = [c for c in row["candidates"] if c["relevance"] == 1]
        if len(gold) != 1 or gold[0] not in full or len(full) < 2:
            return False
        if row["answer"].lower() in row["reasoning"].lower():
            return False
    return True


def synthetic_searches(n_sessions: int, seed: int = 0) -> pa.Table:
    """``n_sessions`` sessions (2-3 searches each, 20 candidates per search, one relevant) as a
    ``SYNTHETIC_SEARCHES`` table (``SEARCHES`` + step, reasoning_source)."""
    if n_sessions < 1:
        raise ValueError(f"n_sessions must be >= 1, got {n_sessions}")
    rows = []
    for index in range(n_sessions):
        for salt in range(100):  # a rare name clash breaks an invariant; draw that session again
            session = _session(seed, index, salt)
            if _valid(session):
                break
        else:
            raise RuntimeError(f"seed={seed} session {index}: no valid draw in 100 tries")
        rows.extend(session)
    return pa.Table.from_pylist(rows, schema=SYNTHETIC_SEARCHES)


def synthetic_groups(n_sessions: int, seed: int = 0, negatives: int = 7) -> pa.Table:
    """Training groups from :func:`synthetic_searches` (hardest negatives by keyword overlap)."""
    return searches_to_groups(synthetic_searches(n_sessions, seed), negatives=negatives, seed=seed)
