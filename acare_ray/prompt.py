"""Prompt templates and token assembly for the Qwen3-Reranker yes/no format.

The layout is described in docs/architecture.md, section 3.

The templates are data: one table of query blocks and default instructions per mode. Everything
up to and including ``<Document>:`` depends only on the search, never on the candidate, so it is
tokenized once per search (the shared prefix); each document is tokenized as ``" " + doc``; the
suffix is a constant. ``prefix_ids + document_ids + suffix_ids`` equals tokenizing the whole
prompt at once (checked on real MuSiQue paragraphs in the tests), which is what lets the scorer
reuse the prefix's KV cache for every candidate.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from acare_ray.context import AgentContext, Mode

SYSTEM_PREFIX = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query "
    'and the Instruct provided. Note that the answer can only be "yes" or "no".<|im_end|>\n'
    "<|im_start|>user\n"
)
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


@dataclass(frozen=True)
class FieldCaps:
    """Per-field token caps, applied before assembly. Reasoning keeps its end."""

    sub_query: int = 256
    question: int = 2048
    reasoning: int = 512


@dataclass(frozen=True)
class PromptConfig:
    """How prompts are built: caps, the overall length limit and an optional custom instruction."""

    caps: FieldCaps = field(default_factory=FieldCaps)
    max_length: int = 8192
    instruction: str | None = None


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


class PromptEncoder:
    """Turns (context, documents) into token ids: capped fields, shared prefix, truncated documents.

    ``prefix_ids`` is computed once per search; ``document_ids`` tokenizes all documents of any
    number of searches in one batched fast-tokenizer call; ``document_budget`` says how many
    document tokens fit beside a prefix so that prefix + document + suffix <= ``max_length``.
    """

    def __init__(self, tokenizer: Any, config: PromptConfig | None = None) -> None:
        self.tokenizer = tokenizer
        self.config = config or PromptConfig()
        self.suffix_ids: list[int] = self._ids(SUFFIX)
        self.yes_id = single_token_id(tokenizer, YES_TOKEN)
        self.no_id = single_token_id(tokenizer, NO_TOKEN)

    def _ids(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def _cap(self, text: str | None, limit: int, keep_end: bool = False) -> str | None:
        if text is None:
            return None
        ids = self._ids(text)
        if len(ids) <= limit:
            return text
        kept = ids[-limit:] if keep_end else ids[:limit]
        return self.tokenizer.decode(kept)

    def capped(self, context: AgentContext) -> AgentContext:
        """``context`` with each field cut to its token cap (reasoning keeps its end)."""
        caps = self.config.caps
        return AgentContext(
            self._cap(context.sub_query, caps.sub_query),
            question=self._cap(context.question, caps.question),
            reasoning=self._cap(context.reasoning, caps.reasoning, keep_end=True),
        )

    def prefix_text(self, context: AgentContext, mode: Mode) -> str:
        return render_prefix(self.capped(context).for_mode(mode), mode, self.config.instruction)

    def render(self, context: AgentContext, document: str, mode: Mode) -> str:
        """The exact prompt text (capped fields; the document as given, before truncation)."""
        return f"{self.prefix_text(context, mode)} {document}{SUFFIX}"

    def prefix_ids(self, context: AgentContext, mode: Mode) -> list[int]:
        ids = self._ids(self.prefix_text(context, mode))
        if len(ids) + len(self.suffix_ids) >= self.config.max_length:
            raise ValueError(
                f"prompt without document is {len(ids) + len(self.suffix_ids)} tokens, "
                f"max_length is {self.config.max_length}"
            )
        return ids

    def document_budget(self, prefix_len: int) -> int:
        return self.config.max_length - prefix_len - len(self.suffix_ids)

    def document_ids(self, documents: list[str], budgets: list[int]) -> list[list[int]]:
        """Token ids of ``" " + doc`` for each document, cut to its budget, in one batched call.

        Very long documents are cut by characters before tokenizing (a token spans at most a
        few dozen characters in practice); if the cut text yields too few tokens the whole
        document is tokenized instead, so the result never depends on the shortcut.
        """
        if not documents:
            return []
        limits = [max(8 * b, 4096) for b in budgets]
        texts = [" " + doc[:limit] for doc, limit in zip(documents, limits)]
        encoded = self.tokenizer(texts, add_special_tokens=False)["input_ids"]
        out = []
        for doc, limit, budget, ids in zip(documents, limits, budgets, encoded):
            if len(doc) > limit and len(ids) <= budget + 16:
                ids = self._ids(" " + doc)
            out.append(ids[:budget])
        return out
