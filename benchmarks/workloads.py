"""Benchmark workloads: agent searches of 100 candidates each, as (AgentContext, documents).

- :func:`musique_workload`: real MuSiQue searches (sub-query, original question) with their
  BM25 top-100 paragraphs from the pooled corpus as candidates (``musique_searches("open")``).
  The reasoning is **synthetic**: notes quoting paragraphs of other questions, then the
  converter's synthetic trace, long enough that the 512-token reasoning cap applies. Sentences
  containing the current step's answer are left out (as in :mod:`acare_ray.data.musique`).
- :func:`fixed_workload`: prompts of exact token lengths (a shared prefix of ``prefix_tokens``
  in mode M3, documents of ``doc_tokens``), built from words that are one Qwen3 token each, for
  model-FLOPs utilisation figures where every length must be known.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from acare_ray.scoring import AgentContext, Mode
from acare_ray.scoring.prompt import PromptEncoder

REASONING_SOURCE = "synthetic: notes quoting MuSiQue paragraphs of other questions + step trace"


@dataclass(frozen=True)
class Search:
    context: AgentContext
    documents: list[str]


def _notes(answer: str, pool: list[str], rng: random.Random, words: int) -> str:
    """Sentences from ``pool`` paragraphs, none mentioning ``answer``, about ``words`` words."""
    kept: list[str] = []
    while sum(len(s.split()) for s in kept) < words:
        for sentence in rng.choice(pool).split(". "):
            if answer.lower() not in sentence.lower():
                kept.append(sentence.strip().rstrip(".") + ".")
    return "Notes from what I read so far: " + " ".join(kept)


def musique_workload(
    searches: int, candidates: int = 100, seed: int = 0, reasoning_words: int = 600
) -> list[Search]:
    """``searches`` MuSiQue searches (seeded pick) with ``candidates`` BM25 candidates each."""
    from acare_ray.data.musique import musique_searches

    table = musique_searches("open", k=candidates).to_pylist()
    rng = random.Random(seed)
    picked = rng.sample(range(len(table)), searches)
    out = []
    for index in picked:
        row = table[index]
        others = [
            c["text"]
            for r in rng.sample(table, 8)
            if r["session_id"] != row["session_id"]
            for c in r["candidates"][:5]
        ]
        reasoning = f"{_notes(row['answer'], others, rng, reasoning_words)} {row['reasoning']}"
        context = AgentContext(row["sub_query"], question=row["question"], reasoning=reasoning)
        out.append(Search(context, [c["text"] for c in row["candidates"]]))
    return out


def single_token_words(tokenizer, count: int = 2000) -> list[str]:
    """Lower-case words ``w`` such that ``" " + w`` is exactly one token."""
    words = []
    for token in tokenizer.get_vocab():
        word = token[1:]
        if token.startswith("\u0120") and word.isascii() and word.isalpha() and word.islower():
            words.append(word)
    words.sort()
    return words[:: max(1, len(words) // count)][:count]


def _text(words: list[str], rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(words) for _ in range(n))


def fixed_workload(
    encoder: PromptEncoder,
    searches: int,
    candidates: int,
    prefix_tokens: int,
    doc_tokens: int,
    seed: int = 0,
) -> list[Search]:
    """Mode-M3 searches whose prefix is exactly ``prefix_tokens`` and documents ``doc_tokens``.

    Question and reasoning share what the template leaves, the reasoning up to its cap. Raises ValueError when the
    template alone is longer than ``prefix_tokens``.
    """
    rng = random.Random(seed)
    words = single_token_words(encoder.tokenizer)
    caps = encoder.config.caps
    out = []
    for _ in range(searches):
        sub_query = _text(words, rng, 8)
        one_word = AgentContext(sub_query, question=words[0], reasoning=words[0])
        free = prefix_tokens - (len(encoder.prefix_ids(one_word, Mode.M3)) - 2)
        reasoning_n = min(caps.reasoning, free // 2)
        question_n = free - reasoning_n
        if reasoning_n < 1 or question_n > caps.question:
            raise ValueError(
                f"prefix_tokens={prefix_tokens} cannot be reached: the template takes "
                f"{prefix_tokens - free} tokens, the question cap is {caps.question}"
            )
        context = AgentContext(
            sub_query,
            question=_text(words, rng, question_n),
            reasoning=_text(words, rng, reasoning_n),
        )
        got = len(encoder.prefix_ids(context, Mode.M3))
        if got != prefix_tokens:
            raise ValueError(f"built a prefix of {got} tokens, wanted {prefix_tokens}")
        out.append(Search(context, [_text(words, rng, doc_tokens) for _ in range(candidates)]))
    return out
