"""Sequence-classification cross-encoders (BERT-style: MiniLM, bge-reranker, ...).

A pair is (rendered context block, document): the text inside ``<Query>:`` for the mode (so the
four modes mean the same thing as for the causal backend) and the document, truncated from the
document side. The single output logit is the score (log-odds, docs/architecture.md section
2). There is no prefix to share in a bidirectional encoder, so candidates of all searches are
batched together by token budget.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from acare_ray.scoring.backend import (
    Backend,
    CancelFn,
    LoadRequest,
    ScoredSearch,
    Search,
    check_cancelled,
)
from acare_ray.scoring.batching import BatchPlan, move_tensors, pad_right
from acare_ray.scoring.config import FieldCaps, PromptConfig
from acare_ray.scoring.context import AgentContext, FieldError, Mode
from acare_ray.scoring.prompt import ContextMemo, cap_fields, query_block, query_block_parts
from acare_ray.scoring.untrusted import InertTokenizer, encode_documents


class CrossEncoderBackend(Backend):
    """Registered as ``cross_encoder``; takes any architecture ``backend="auto"`` leaves."""

    name: ClassVar[str] = "cross_encoder"
    document_lead: ClassVar[str] = ""
    instruction_line: ClassVar[bool] = False
    default_prompt: ClassVar[PromptConfig] = PromptConfig(
        caps=FieldCaps(sub_query=64, question=128, reasoning=160), max_length=512
    )

    def __init__(
        self,
        model: nn.Module,
        tokenizer: Any,
        prompt: PromptConfig,
        plan: BatchPlan,
        device: torch.device,
    ) -> None:
        super().__init__(prompt, plan, device)
        self.model = model.eval()
        self._tokenizer = tokenizer
        self._inert = InertTokenizer(tokenizer)
        self.pair = PairLayout.of(self._inert)
        self.memo = ContextMemo()

    @classmethod
    def load(cls, request: LoadRequest) -> CrossEncoderBackend:
        from transformers import AutoModelForSequenceClassification

        # A bare backbone gets a fresh classification head: seed it so every replica and every
        # job actor starts from the same weights and scores identically.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            model = AutoModelForSequenceClassification.from_pretrained(
                request.path, num_labels=1, dtype=request.dtype, revision=request.revision
            )
        prompt = replace(
            request.prompt,
            max_length=min(request.prompt.max_length, model.config.max_position_embeddings),
        )
        return cls(
            model.to(request.device), request.tokenizer, prompt, request.plan, request.device
        )

    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

    @property
    def inert(self) -> InertTokenizer:
        return self._inert

    def context_ids(self, context: AgentContext, mode: Mode) -> list[int]:
        """Ids of the mode's query block, fields capped on ids, user text inert (tokenized once
        per context: :class:`~acare_ray.scoring.prompt.ContextMemo`)."""

        def make() -> list[int]:
            fields = cap_fields(self.inert, context.for_mode(mode), self.prompt.caps)
            return self.inert.assemble(query_block_parts(mode, fields))

        return self.memo.ids(context, mode, make)

    def context_text(self, context: AgentContext, mode: Mode) -> str:
        """Display text of the query block (cut fields shown decoded)."""
        fields = cap_fields(self.inert, context.for_mode(mode), self.prompt.caps)
        shown = {name: f.text for name, f in fields.items()}
        return query_block(
            AgentContext(
                shown["query"], question=shown.get("question"), reasoning=shown.get("reasoning")
            ),
            mode,
        )

    def render(self, context: AgentContext, document: str, mode: Mode) -> str:
        sep = self.tokenizer.sep_token or "\n"
        return f"{self.context_text(context, mode)} {sep} {document}"

    @property
    def hf_model(self) -> nn.Module:
        return self.model

    def trainable_module(self) -> nn.Module:
        return PairScorer(self)

    def collate_groups(
        self, prompts: Sequence[tuple[AgentContext, Mode]], documents: Sequence[Sequence[str]]
    ) -> PairBatch:
        searches = [(ctx, mode, list(docs)) for (ctx, mode), docs in zip(prompts, documents)]
        ids, lengths = pad_right(self.encode(searches), self.tokenizer.pad_token_id or 0)
        return PairBatch(ids=ids, lengths=lengths, modes=[mode for _, mode in prompts])

    def context_tokens(self, context: AgentContext, mode: Mode) -> int:
        count = len(self.context_ids(context, mode))
        specials = self.pair.specials
        if count + specials >= self.max_length:
            message = f"context is {count + specials} tokens, max_length is {self.max_length}"
            raise FieldError("context", message, message=message)
        return count

    def document_room(self, context_tokens: int) -> int:
        return self.max_length - context_tokens - self.pair.specials

    def request_cost(self, context_tokens: int, document_tokens: Sequence[int]) -> int:
        specials = self.pair.specials
        return sum(document_tokens) + (context_tokens + specials) * len(document_tokens)

    def encode(self, searches: list[Search]) -> list[list[int]]:
        """Pair ids (special tokens, context block, document cut to the room left) per document."""
        firsts, seconds, rooms = [], [], []
        for context, mode, docs in searches:
            if context.instruction is not None:
                detail = "a cross-encoder has no instruction line"
                raise FieldError("instruction", detail, message=f"instruction: {detail}")
            if not docs:
                continue
            first = self.context_ids(context, mode)
            room = max(self.max_length - len(first) - self.pair.specials, 0)
            firsts.extend([first] * len(docs))
            seconds.extend(docs)
            rooms.extend([room] * len(docs))
        encoded = encode_documents(self.inert, self.document_lead, seconds, rooms)
        return [self.pair.join(a, b) for a, b in zip(firsts, encoded)]

    def forward_ids(self, ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """Logits ``[N]`` for right-padded pair ids; differentiable (training calls this)."""
        steps = torch.arange(ids.shape[1], device=ids.device)
        mask = (steps[None, :] < lengths[:, None]).long()
        extra = {}
        if getattr(self.model.config, "type_vocab_size", 1) > 1:
            extra["token_type_ids"] = self._token_types(ids, mask)
        out = self.model(input_ids=ids, attention_mask=mask, **extra)
        return out.logits[:, 0].float()

    def _token_types(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        sep = self.tokenizer.sep_token_id
        after_first_sep = (ids == sep).long().cumsum(dim=1) - (ids == sep).long() >= 1
        return (after_first_sep & mask.bool()).long()

    def score_searches(
        self, searches: list[Search], cancel: CancelFn | None = None
    ) -> list[ScoredSearch]:
        started = time.perf_counter()
        encoded = self.encode(searches)
        self.stats.tokenize_s += time.perf_counter() - started
        flat = np.empty(len(encoded), dtype=np.float32)
        with torch.inference_mode():
            for batch in self.plan([len(e) for e in encoded]):
                check_cancelled(cancel)
                ids, lengths = pad_right([encoded[i] for i in batch], self.tokenizer.pad_token_id)
                self.stats.add(real=int(lengths.sum()), computed=ids.numel())
                flat[batch] = (
                    self.forward_ids(ids.to(self.device), lengths.to(self.device)).cpu().numpy()
                )
        out, start = [], 0
        for _, _, docs in searches:
            pairs = encoded[start : start + len(docs)]
            out.append(ScoredSearch(flat[start : start + len(docs)], sum(map(len, pairs))))
            start += len(docs)
        return out


@dataclass(frozen=True)
class PairLayout:
    """Where a tokenizer puts its special tokens around a text pair (``[CLS] a [SEP] b [SEP]``
    for BERT, ``<s> a </s></s> b </s>`` for XLM-R), read once from its post-processor."""

    head: tuple[int, ...]
    middle: tuple[int, ...]
    tail: tuple[int, ...]

    @classmethod
    def of(cls, inert: InertTokenizer) -> PairLayout:
        first = inert.plain.encode("a", add_special_tokens=False)
        second = inert.plain.encode("b", add_special_tokens=False)
        ids = inert.plain.post_process(first, second, add_special_tokens=True).ids
        a = _find(ids, first.ids, 0)
        b = _find(ids, second.ids, a + len(first.ids))
        return cls(
            tuple(ids[:a]), tuple(ids[a + len(first.ids) : b]), tuple(ids[b + len(second.ids) :])
        )

    @property
    def specials(self) -> int:
        return len(self.head) + len(self.middle) + len(self.tail)

    def join(self, first: list[int], second: list[int]) -> list[int]:
        return [*self.head, *first, *self.middle, *second, *self.tail]


def _find(ids: list[int], piece: list[int], start: int) -> int:
    for i in range(start, len(ids) - len(piece) + 1):
        if ids[i : i + len(piece)] == piece:
            return i
    raise ValueError(f"the tokenizer's pair template {ids} does not contain {piece}")


class PairScorer(nn.Module):
    """A cross-encoder backend as an ``nn.Module``: ``forward(ids, lengths)`` -> logits ``[N]``.

    It owns the backend's Hugging Face model (so DDP/FSDP see its parameters) and calls the
    backend's ``forward_ids``, the function inference uses.

    ``chunk_tokens``: run the pairs sorted by length in chunks of at most that many padded tokens
    (at least one pair), each padded to its own longest pair instead of the batch's, as inference
    batches by token budget. A pair's logit does not depend on the padding or the other pairs, so
    the logits are the same within float rounding, in the input order, and gradients flow
    through every chunk; only the padded work shrinks. None: one call on the whole batch.
    """

    def __init__(self, backend: CrossEncoderBackend, chunk_tokens: int | None = None) -> None:
        super().__init__()
        if chunk_tokens is not None and chunk_tokens < 1:
            raise ValueError(f"chunk_tokens must be >= 1 or None, got {chunk_tokens}")
        self.model = backend.model
        self._backend = backend
        self.chunk_tokens = chunk_tokens

    def forward(self, ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        if self.chunk_tokens is None or ids.shape[0] <= 1:
            return self._backend.forward_ids(ids, lengths)
        order = torch.argsort(lengths, descending=True, stable=True)
        parts = []
        for chunk in length_chunks(lengths[order].tolist(), self.chunk_tokens):
            rows = order[chunk.start : chunk.stop]
            width = int(lengths[rows[0]])
            parts.append(self._backend.forward_ids(ids[rows, :width], lengths[rows]))
        logits = torch.cat(parts)
        return logits[torch.argsort(order)]


def length_chunks(lengths: Sequence[int], chunk_tokens: int) -> list[slice]:
    """Consecutive slices of ``lengths`` (sorted longest first) whose padded size, rows x the
    first row's length, stays within ``chunk_tokens``; a row longer than that is a chunk alone."""
    chunks, start = [], 0
    for end in range(1, len(lengths) + 1):
        if end - start > 1 and (end - start) * lengths[start] > chunk_tokens:
            chunks.append(slice(start, end - 1))
            start = end - 1
    if start < len(lengths):
        chunks.append(slice(start, len(lengths)))
    return chunks


@dataclass
class PairBatch:
    """Inputs of a cross-encoder for training: pair ids, groups laid out in turn."""

    ids: torch.Tensor  # [G * group_size, L] right-padded
    lengths: torch.Tensor  # [G * group_size]
    modes: list[Mode]

    def inputs(self) -> tuple[torch.Tensor, ...]:
        return self.ids, self.lengths

    def to(self, device: torch.device) -> PairBatch:
        return move_tensors(self, device)
