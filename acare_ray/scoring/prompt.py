"""Prompt templates and token assembly for the Qwen3-Reranker yes/no format.

The layout is described in docs/architecture.md, section 3.

The templates are data: one table of query blocks and default instructions per mode. Everything
up to and including ``<Document>:`` depends only on the search, never on the candidate, so it is
tokenized once per search (the shared prefix); each document is tokenized as ``" " + doc``; the
suffix is a constant. ``prefix_ids + document_ids + suffix_ids`` equals tokenizing the whole
prompt at once (checked on real MuSiQue paragraphs in the tests), which is what lets the scorer
reuse the prefix's KV cache for every candidate.

Every field, document and custom instruction is untrusted text: it is tokenized by
:class:`acare_ray.scoring.untrusted.InertTokenizer`, so only the template produces control tokens, and a
field over its cap is cut on token ids (never decoded and tokenized again).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from string import Formatter
from typing import Any

from acare_ray.scoring.config import FieldCaps, PromptConfig
from acare_ray.scoring.context import AgentContext, FieldError, Mode, missing_field_error
from acare_ray.scoring.untrusted import (
    Document,
    Ids,
    InertTokenizer,
    Part,
    Template,
    UserText,
    cut_ids,
    encode_capped,
    encode_documents,
)

SYSTEM_PREFIX = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query "
    'and the Instruct provided. Note that the answer can only be "yes" or "no".<|im_end|>\n'
    "<|im_start|>user\n"
)
DOCUMENT_LEAD = " "
"""A document is tokenized as ``" " + text`` after the prompt prefix."""
SUFFIX = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
DOCUMENT_TAG = "<Document>:"

QUERY_BLOCKS: dict[Mode, str] = {
    Mode.M0: "{query}",
    Mode.M1: "#Reasoning Trace: {reasoning}\n#Query: {query}",
    Mode.M2: "#Original Question (global query): {question}\n#Query: {query}",
    Mode.M3: (
        "#Original Question (global query): {question}\n#Reasoning Trace: {reasoning}\n"
        "#Query: {query}"
    ),
}

INSTRUCTIONS: dict[Mode, str] = {
    Mode.M0: "Given a web search query, retrieve relevant passages that answer the query",
    Mode.M1: (
        "Given a user generated web search query and the user's reasoning trace that motivated "
        "the query (when available), retrieve relevant passages that answer the query in light "
        "of the reasoning context"
    ),
    Mode.M2: (
        "Given a user generated query issued during an iterative research session and the "
        "original question (global query) that motivated the session, retrieve relevant passages "
        "that answer the query in light of the original question"
    ),
    Mode.M3: (
        "Given a user generated query, the original question (global query), and the user's "
        "reasoning trace (when available) that motivated the query, retrieve relevant passages "
        "that answer the query in light of the original question and reasoning context"
    ),
}

YES_TOKEN = "yes"
NO_TOKEN = "no"


def query_block(context: AgentContext, mode: Mode) -> str:
    """The text inside ``<Query>:`` for ``mode`` (the context must have the mode's fields)."""
    return QUERY_BLOCKS[mode].format(
        query=context.sub_query, question=context.question, reasoning=context.reasoning
    )


def render_prefix(context: AgentContext, mode: Mode, instruction: str | None = None) -> str:
    """Prompt text up to and including ``<Document>:`` (no trailing space)."""
    instruction = instruction or INSTRUCTIONS[mode]
    return (
        f"{SYSTEM_PREFIX}<Instruct>: {instruction}\n<Query>: {query_block(context, mode)}\n"
        f"{DOCUMENT_TAG}"
    )


def render(context: AgentContext, document: str, mode: Mode, instruction: str | None = None) -> str:
    """The full prompt text for one (context, document) pair in ``mode``."""
    return f"{render_prefix(context, mode, instruction)} {document}{SUFFIX}"


def single_token_id(tokenizer: Any, text: str) -> int:
    """The id of ``text``, which must be exactly one token for this tokenizer."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if len(ids) != 1:
        raise ValueError(
            f"{text!r} must be a single token for the yes/no head, but this tokenizer gives {ids}"
        )
    return ids[0]


FIELD_CAPS: tuple[tuple[str, str, bool], ...] = (
    # (template placeholder, AgentContext attribute, keep the end when cut)
    ("query", "sub_query", False),
    ("question", "question", False),
    ("reasoning", "reasoning", True),
)


@dataclass(frozen=True)
class CappedField:
    """One context field after its cap: ``ids`` is None when the whole text fits (it is then
    tokenized together with the template around it), else the kept token ids."""

    text: str
    ids: tuple[int, ...] | None = None


def cap_fields(
    inert: InertTokenizer, context: AgentContext, caps: FieldCaps
) -> dict[str, CappedField]:
    """The context's present fields, each cut on token ids to its cap (reasoning keeps its end).

    Keys are the query-block placeholders (``query``, ``question``, ``reasoning``). A cut field
    keeps its ids and is never decoded and tokenized again; its ``text`` is for display only.
    """
    out = {}
    for name, attribute, keep_end in FIELD_CAPS:
        text = getattr(context, attribute)
        if text is None:
            continue
        limit = getattr(caps, attribute)
        (ids,) = encode_capped(inert, [text], [limit], keep_end)
        kept = cut_ids(ids, limit, keep_end)
        out[name] = CappedField(text) if kept is None else CappedField(inert.decode(kept), kept)
    return out


def query_block_parts(mode: Mode, fields: dict[str, CappedField]) -> list[Part]:
    """The ``<Query>:`` text of ``mode`` as template parts and untrusted field parts."""
    parts: list[Part] = []
    for literal, name, _, _ in Formatter().parse(QUERY_BLOCKS[mode]):
        if literal:
            parts.append(Template(literal))
        if name is not None:
            if name not in fields:
                raise missing_field_error(mode, name)
            field_ = fields[name]
            parts.append(UserText(field_.text) if field_.ids is None else Ids(field_.ids))
    return parts


class ContextMemo:
    """The token ids of the last few contexts a backend tokenized, so a request's context is
    tokenized once: a server's token accounting asks for them before scoring and the scorer
    reads them again; an agent's next search with the same context is not tokenized at all.

    Bounded by ``entries`` and by key size (a context of more than ``max_chars`` characters is
    not kept). Thread-safe. Each call returns a new list, so a caller may change it.
    """

    def __init__(self, entries: int = 64, max_chars: int = 1 << 16) -> None:
        self.entries = entries
        self.max_chars = max_chars
        self._ids: OrderedDict[tuple[AgentContext, Mode], tuple[int, ...]] = OrderedDict()
        self._lock = threading.Lock()

    def ids(self, context: AgentContext, mode: Mode, make: Callable[[], list[int]]) -> list[int]:
        """The ids of ``(context, mode)``: remembered, else ``make()`` (an error is not kept)."""
        key = (context, mode)
        with self._lock:
            found = self._ids.get(key)
            if found is not None:
                self._ids.move_to_end(key)
                return list(found)
        ids = make()
        size = sum(len(f) for f in (context.sub_query, context.question, context.reasoning,
                                    context.instruction) if f)  # fmt: skip
        if size <= self.max_chars and self.entries > 0:
            with self._lock:
                self._ids[key] = tuple(ids)
                while len(self._ids) > self.entries:
                    self._ids.popitem(last=False)
        return list(ids)


class PromptEncoder:
    """Turns (context, documents) into token ids: capped fields, shared prefix, truncated documents.

    All user text (fields, documents, a configured instruction) goes through an
    :class:`~acare_ray.scoring.untrusted.InertTokenizer`: only the template makes control tokens.
    ``prefix_ids`` is computed once per search; ``document_ids`` tokenizes all documents of any
    number of searches in one batched call; ``document_budget`` says how many document tokens fit
    beside a prefix so that prefix + document + suffix <= ``max_length``.
    """

    def __init__(self, tokenizer: Any, config: PromptConfig | None = None) -> None:
        self.tokenizer = tokenizer
        self.config = config or PromptConfig()
        self.inert = InertTokenizer(tokenizer)
        self.inert.check_template(tokenizer, SYSTEM_PREFIX)
        self.suffix_ids: list[int] = self.inert.check_template(tokenizer, SUFFIX)
        self.yes_id = single_token_id(tokenizer, YES_TOKEN)
        self.no_id = single_token_id(tokenizer, NO_TOKEN)
        self.memo = ContextMemo()

    def capped(self, context: AgentContext) -> AgentContext:
        """``context`` with each field cut to its token cap, as display text (reasoning keeps
        its end). The ids the model reads come from :meth:`prefix_ids`, not from this text."""
        fields = cap_fields(self.inert, context, self.config.caps)
        return AgentContext(
            fields["query"].text,
            question=fields["question"].text if "question" in fields else None,
            reasoning=fields["reasoning"].text if "reasoning" in fields else None,
            instruction=context.instruction,
        )

    def instruction_for(self, context: AgentContext) -> str | None:
        """The custom instruction of this search: its own, else the configured one (None: the
        mode's default, a template part)."""
        return context.instruction if context.instruction is not None else self.config.instruction

    def prefix_parts(self, context: AgentContext, mode: Mode) -> list[Part]:
        """The prompt up to and including ``<Document>:`` as template and user parts."""
        fields = cap_fields(self.inert, context.for_mode(mode), self.config.caps)
        instruction = self.instruction_for(context)
        return [
            Template(f"{SYSTEM_PREFIX}<Instruct>: "),
            Template(INSTRUCTIONS[mode]) if instruction is None else UserText(instruction),
            Template("\n<Query>: "),
            *query_block_parts(mode, fields),
            Template(f"\n{DOCUMENT_TAG}"),
        ]

    def prefix_text(self, context: AgentContext, mode: Mode) -> str:
        """Display text of the prefix (cut fields shown decoded)."""
        return render_prefix(
            self.capped(context).for_mode(mode), mode, self.instruction_for(context)
        )

    def render(self, context: AgentContext, document: str, mode: Mode) -> str:
        """The exact prompt text (capped fields; the document as given, before truncation)."""
        return f"{self.prefix_text(context, mode)} {document}{SUFFIX}"

    def prefix_ids(self, context: AgentContext, mode: Mode) -> list[int]:
        """The prompt's ids up to and including ``<Document>:`` (tokenized once per context:
        :class:`ContextMemo`); FieldError when no document would fit beside it."""
        ids = self.memo.ids(
            context, mode, lambda: self.inert.assemble(self.prefix_parts(context, mode))
        )
        if len(ids) + len(self.suffix_ids) >= self.config.max_length:
            message = (
                f"prompt without document is {len(ids) + len(self.suffix_ids)} tokens, "
                f"max_length is {self.config.max_length}"
            )
            raise FieldError("context", message, message=message)
        return ids

    def document_budget(self, prefix_len: int) -> int:
        return self.config.max_length - prefix_len - len(self.suffix_ids)

    def document_ids(self, documents: Sequence[Document], budgets: list[int]) -> list[list[int]]:
        """Token ids of ``" " + doc`` for each document, cut to its budget, in one batched call
        (very long documents are cut by characters first: :func:`encode_capped`); a document
        that carries its ids (:class:`TokenizedDocument`) is not tokenized again."""
        return encode_documents(self.inert, DOCUMENT_LEAD, documents, budgets)
