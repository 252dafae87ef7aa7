"""Token accounting for online requests, with the scorer's own tokenizer.

The server needs two numbers per request before the model runs: how many tokens each document
may keep (``max_tokens_per_doc`` and the model's room beside the prompt), and how many tokens
the request will cost (the batch scheduler packs requests by this, admission weighs the work
queued ahead with it). A :class:`TokenLayout` answers both for any backend (it asks the backend, see
:mod:`acare_ray.scoring.backend`):

- causal LM: the prompt prefix is shared by the request's documents (counted once), each
  document is tokenized as ``" " + doc`` and followed by the suffix;
- cross-encoder: the context block is paired with every document, plus the special tokens.

Truncation cuts the document *text* at a word boundary (from the tokenizer's offsets); the
scorer receives a cut document as its kept text and tokenizes that (at most ``limit`` tokens).

Only documents that might exceed the limit are tokenized here: a token covers at least one
UTF-8 byte (byte-level BPE) or one character (WordPiece), so a document of at most ``limit``
bytes cannot be over it. A document tokenized here goes on to the scorer with its ids
(:class:`~acare_ray.scoring.untrusted.TokenizedDocument`), so no document is tokenized twice:
doing it twice would cost as much CPU as the scoring of a small model. The token counts of
short documents are estimates (``BYTES_PER_TOKEN``), good enough for packing batches. The usage a response reports
is exact: the scorer returns the tokens it computed with each search's scores
(:class:`~acare_ray.scoring.backend.ScoredSearch`), read from its own tokenization.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from acare_ray.scoring.context import AgentContext, Mode
from acare_ray.scoring.prompt import FIELD_CAPS, cap_fields
from acare_ray.scoring.untrusted import TokenizedDocument, needs_whole, precut

if TYPE_CHECKING:
    from acare_ray.scoring.scorer import Scorer

# Typical UTF-8 bytes per token of English text for BPE/WordPiece vocabularies.
BYTES_PER_TOKEN = 4


@dataclass(frozen=True)
class FittedDocuments:
    """Documents as they will be scored, and their token counts.

    ``texts[i]`` is document ``i`` cut at a word boundary to at most ``limit`` tokens;
    ``kept[i]`` its token count after the cut; ``original[i]`` its count before (a lower bound
    when only a prefix of a very long text had to be tokenized to know it is over the limit).
    ``exact[i]`` says whether document ``i`` was tokenized; if not, it provably fits and its
    counts are byte-based estimates. ``whole[i]``: ``original[i]`` counts the whole text (else
    only a prefix was tokenized, and the text has at least that many tokens). ``tokenized[i]``:
    document ``i`` (uncut) with the ids made here, for the scorer to use rather than tokenize
    it again; None where it was not tokenized, or only its end was and not all of it.
    """

    texts: list[str]
    kept: list[int]
    original: list[int]
    exact: list[bool]
    whole: list[bool]
    tokenized: list[TokenizedDocument | None]


class TokenLayout:
    """How one backend turns (context, documents) into tokens; see the module docstring."""

    def __init__(self, scorer: Scorer) -> None:
        self._backend = scorer.backend
        self.instruction_line = self._backend.instruction_line
        self.tokenizer = self._backend.tokenizer
        self.inert = self._backend.inert
        self.lead = self._backend.document_lead
        self.max_length = self._backend.max_length

    def context_tokens(self, context: AgentContext, mode: Mode) -> int:
        """Tokens of everything but the document (caps applied). Raises if nothing fits."""
        return self._backend.context_tokens(context, mode)

    def room(self, context_tokens: int) -> int:
        """How many document tokens fit beside the context under the model's max_length."""
        return self._backend.document_room(context_tokens)

    def cost(self, context_tokens: int, document_tokens: Sequence[int]) -> int:
        """Tokens the model computes for one request (the shared prefix counted once)."""
        if not document_tokens:
            return 0
        return self._backend.request_cost(context_tokens, document_tokens)

    def cut_fields(self, context: AgentContext, mode: Mode) -> dict[str, int]:
        """The context fields ``mode`` reads that their token caps cut, each with its cap (the
        core's names: ``sub_query``, ``question``, ``reasoning``), so a cut is never silent.
        A field of at most its cap in bytes cannot be over it and is not tokenized."""
        caps = self._backend.prompt.caps
        context = context.for_mode(mode)
        sizes = {a: len((getattr(context, a) or "").encode("utf-8")) for _, a, _ in FIELD_CAPS}
        if all(size <= getattr(caps, attribute) for attribute, size in sizes.items()):
            return {}
        attributes = {name: attribute for name, attribute, _ in FIELD_CAPS}
        cut = [n for n, f in cap_fields(self.inert, context, caps).items() if f.ids is not None]
        return {attributes[name]: getattr(caps, attributes[name]) for name in cut}

    def fit(self, documents: Sequence[str], limit: int, keep_end: bool = False) -> FittedDocuments:
        """Cut each document to at most ``limit`` tokens (its start, or its end if ``keep_end``)."""
        sizes = [len(self.lead.encode()) + len(doc.encode("utf-8")) for doc in documents]
        texts = list(documents)
        kept = [max(1, -(-size // BYTES_PER_TOKEN)) for size in sizes]
        original = list(kept)
        exact = [False] * len(documents)
        whole = [True] * len(documents)
        tokenized: list[TokenizedDocument | None] = [None] * len(documents)
        long = [i for i, size in enumerate(sizes) if size > limit]
        if not long:
            return FittedDocuments(texts, kept, original, exact, whole, tokenized)
        pieces = {i: precut(documents[i], limit, keep_end) for i in long}
        for i, (ids, offsets) in zip(long, self._encode([pieces[i] for i in long])):
            doc, piece = documents[i], pieces[i]
            if needs_whole(doc, piece, len(ids), limit):
                (ids, offsets), piece = self._encode([doc])[0], doc
            exact[i], whole[i] = True, len(piece) == len(doc)
            original[i] = kept[i] = len(ids)
            if whole[i] or not keep_end:  # a start piece's first `limit` ids are the whole's
                tokenized[i] = TokenizedDocument(doc, tuple(ids), None if whole[i] else limit)
            if len(ids) > limit:
                base = len(doc) - len(piece) if keep_end else 0
                texts[i], kept[i] = self._cut(doc, offsets, base, limit, keep_end)
        return FittedDocuments(texts, kept, original, exact, whole, tokenized)

    def _encode(self, pieces: list[str]) -> list[tuple[list[int], list[tuple[int, int]]]]:
        return self.inert.encode_offsets([self.lead + p for p in pieces])

    def _cut(
        self, doc: str, offsets: list[tuple[int, int]], base: int, limit: int, keep_end: bool
    ) -> tuple[str, int]:
        """The kept text and its token count: at most ``limit`` whole tokens, cut at a space.

        Cutting where a word ends (or, keeping the end, where one starts) means the kept text
        tokenizes to exactly those tokens; a cut inside a word happens only when no word
        boundary lies within the limit. A cut that would leave only whitespace takes more.
        """
        n = len(offsets)

        def at(char: int) -> int:
            return min(max(char + base - len(self.lead), 0), len(doc))

        if keep_end:
            firsts = range(n - limit, n)
            clean = [
                j
                for j in firsts
                if (s := at(offsets[j][0])) == 0 or doc[s].isspace() or doc[s - 1].isspace()
            ]
            order = [*clean, n - limit, *range(n - limit - 1, -1, -1)]
            for first in order:
                text = doc[at(offsets[first][0]) :].lstrip()
                if text.strip():
                    return text, n - first
        else:
            lasts = range(limit - 1, -1, -1)
            clean = [j for j in lasts if (e := at(offsets[j][1])) >= len(doc) or doc[e].isspace()]
            order = [*clean, limit - 1, *range(limit, n)]
            for last in order:
                text = doc[: at(offsets[last][1])]
                if text.strip():
                    return text, last + 1
        return doc, n
