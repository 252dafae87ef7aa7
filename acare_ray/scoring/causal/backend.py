"""The causal-LM backend: prompts tokenized once per search, candidates in token-budget batches.

Registered as ``causal_lm`` (:data:`acare_ray.scoring.backend.BACKENDS`). The scoring module is
the fast shared-prefix path or the exact fallback (:mod:`acare_ray.scoring.causal.load` picks);
this class is the loop around it: tokenizing with :class:`~acare_ray.scoring.prompt.PromptEncoder`,
planning batches, packing small searches, and the training and token-accounting hooks of
:class:`~acare_ray.scoring.backend.Backend`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
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
from acare_ray.scoring.causal.head import YesNoModule
from acare_ray.scoring.causal.load import load_causal_module
from acare_ray.scoring.config import ACARE_CONFIG_FILE, PromptConfig
from acare_ray.scoring.context import AgentContext, Mode
from acare_ray.scoring.prompt import DOCUMENT_LEAD, PromptEncoder
from acare_ray.scoring.untrusted import InertTokenizer


class CausalLMBackend(Backend):
    """Inference loop: prefix tokenized and run once per search, documents in token-budget batches.

    ``plan`` cuts a list of sequence lengths into batches of indices. ``stats`` accumulates real
    vs computed tokens and the time spent tokenizing, for the benchmarks. ``path`` says which
    module scores: ``"fast"`` (:class:`~acare_ray.scoring.causal.fast.PrefixSharedYesNo`) or
    ``"fallback"`` (the model's own forward,
    :class:`~acare_ray.scoring.causal.hf_forward.HFForwardYesNo`); ``path_reasons`` says why it
    is not the fast one (empty on the fast path). ``pack_tokens`` (None: off) lets consecutive
    small searches share forward passes (:meth:`_packs`).
    """

    name: ClassVar[str] = "causal_lm"
    has_reference: ClassVar[bool] = True
    document_lead: ClassVar[str] = DOCUMENT_LEAD  # a document is " " + text, after the prefix
    instruction_line: ClassVar[bool] = True
    default_prompt: ClassVar[PromptConfig] = PromptConfig()

    def __init__(
        self,
        module: YesNoModule,
        encoder: PromptEncoder,
        plan: BatchPlan,
        device: torch.device,
        pack_tokens: int | None = None,
        pack_rows: int = 512,
        path_reasons: Sequence[str] = (),
    ) -> None:
        super().__init__(encoder.config, plan, device)
        self.module = module.eval()
        self.path: str = module.path
        self.path_reasons: list[str] = list(path_reasons)
        self.encoder = encoder
        self.pack_tokens = pack_tokens
        self.pack_rows = pack_rows

    @classmethod
    def accepts(cls, architectures: Sequence[str]) -> bool:
        return any("CausalLM" in name for name in architectures)

    @classmethod
    def load(cls, request: LoadRequest) -> CausalLMBackend:
        encoder = PromptEncoder(request.tokenizer, request.prompt)
        for key, found in (("yes_token_id", encoder.yes_id), ("no_token_id", encoder.no_id)):
            if key in request.saved and request.saved[key] != found:
                raise ValueError(
                    f"{ACARE_CONFIG_FILE} says {key}={request.saved[key]}, "
                    f"the tokenizer gives {found}"
                )
        module, reasons = load_causal_module(request, encoder.yes_id, encoder.no_id)
        config = request.config
        return cls(
            module,
            encoder,
            request.plan,
            request.device,
            pack_tokens=config.max_batch_tokens if config.pack_searches else None,
            pack_rows=config.max_batch_size,
            path_reasons=reasons,
        )

    def render(self, context: AgentContext, document: str, mode: Mode) -> str:
        return self.encoder.render(context, document, mode)

    @property
    def hf_model(self) -> nn.Module:
        return self.module.lm

    @property
    def tokenizer(self) -> Any:
        return self.encoder.tokenizer

    @property
    def inert(self) -> InertTokenizer:
        return self.encoder.inert

    def checkpoint_fields(self) -> dict[str, Any]:
        return {"yes_token_id": self.encoder.yes_id, "no_token_id": self.encoder.no_id}

    def trainable_module(self) -> nn.Module:
        return self.module

    def collate_groups(
        self, prompts: Sequence[tuple[AgentContext, Mode]], documents: Sequence[Sequence[str]]
    ) -> CausalBatch:
        encoder = self.encoder
        prefixes = [encoder.prefix_ids(context, mode) for context, mode in prompts]
        budgets = [encoder.document_budget(len(p)) for p, d in zip(prefixes, documents) for _ in d]
        flat = [text for group in documents for text in group]
        seqs = [ids + encoder.suffix_ids for ids in encoder.document_ids(flat, budgets)]
        pad_id = encoder.tokenizer.pad_token_id or 0
        prefix_ids, prefix_lengths = pad_right(prefixes, pad_id)
        steps = torch.arange(prefix_ids.shape[1])
        doc_ids, doc_lengths = pad_right(seqs, pad_id)
        return CausalBatch(
            prefix_ids=prefix_ids,
            prefix_mask=steps[None, :] < prefix_lengths[:, None],
            doc_ids=doc_ids,
            doc_lengths=doc_lengths,
            doc_group=torch.tensor([g for g, group in enumerate(documents) for _ in group]),
            modes=[mode for _, mode in prompts],
        )

    def context_tokens(self, context: AgentContext, mode: Mode) -> int:
        return len(self.encoder.prefix_ids(context, mode))

    def document_room(self, context_tokens: int) -> int:
        return self.encoder.document_budget(context_tokens)

    def request_cost(self, context_tokens: int, document_tokens: Sequence[int]) -> int:
        if not document_tokens:
            return 0
        suffix = len(self.encoder.suffix_ids)
        return context_tokens + sum(document_tokens) + suffix * len(document_tokens)

    def score_searches(
        self, searches: list[Search], cancel: CancelFn | None = None
    ) -> list[ScoredSearch]:
        """Float32 log-odds per search, documents in input order, and the tokens computed;
        ``cancel`` is checked before every forward pass
        (:func:`~acare_ray.scoring.backend.check_cancelled`)."""
        started = time.perf_counter()
        prefixes = [self.encoder.prefix_ids(context, mode) for context, mode, _ in searches]
        documents = [doc for _, _, docs in searches for doc in docs]
        budgets = [
            self.encoder.document_budget(len(prefix))
            for prefix, (_, _, docs) in zip(prefixes, searches)
            for _ in docs
        ]
        doc_ids = self.encoder.document_ids(documents, budgets)
        self.stats.tokenize_s += time.perf_counter() - started
        suffix = self.encoder.suffix_ids
        seqs, tokens, start = [], [], 0
        for prefix, (_, _, docs) in zip(prefixes, searches):
            mine = doc_ids[start : start + len(docs)]
            seqs.append([ids + suffix for ids in mine])
            tokens.append(self.request_cost(len(prefix), [len(ids) for ids in mine]))
            start += len(docs)
        results: list[np.ndarray] = [np.empty(0, dtype=np.float32)] * len(searches)
        stop = {} if cancel is None else {"cancel": cancel}
        with torch.inference_mode():
            for pack in self._packs(prefixes, seqs):
                if len(pack) == 1:
                    results[pack[0]] = self._score_search(prefixes[pack[0]], seqs[pack[0]], **stop)
                else:
                    scores = self._score_pack(
                        [prefixes[i] for i in pack], [seqs[i] for i in pack], **stop
                    )
                    for i, out in zip(pack, scores):
                        results[i] = out
        return [ScoredSearch(scores, n) for scores, n in zip(results, tokens)]

    def _packs(self, prefixes: list[list[int]], seqs: list[list[list[int]]]) -> list[list[int]]:
        """Search indices cut into runs scored together: with ``pack_tokens`` set, consecutive
        small searches share forward passes (one prefix pass for all their prefixes, candidates
        batched across searches) while their prefixes and candidates stay within
        ``pack_tokens`` real tokens and ``pack_rows`` candidates; otherwise one search each."""
        if self.pack_tokens is None:
            return [[i] for i in range(len(seqs))]
        packs, tokens, rows = [], 0, 0
        for i, (prefix, docs) in enumerate(zip(prefixes, seqs)):
            size = len(prefix) + sum(len(d) for d in docs)
            if not docs:  # nothing to score: no prefix pass either
                packs.append([i])
                tokens, rows = self.pack_tokens + 1, 0
                continue
            if packs and tokens + size <= self.pack_tokens and rows + len(docs) <= self.pack_rows:
                packs[-1].append(i)
                tokens, rows = tokens + size, rows + len(docs)
            else:
                packs.append([i])
                tokens, rows = size, len(docs)
        return packs

    def _score_pack(
        self,
        prefixes: list[list[int]],
        seqs: list[list[list[int]]],
        cancel: CancelFn | None = None,
    ) -> list[np.ndarray]:
        """Several searches in shared forwards: prefixes right-padded into one prefix pass, each
        candidate attending to its own search's prefix (``doc_group``)."""
        check_cancelled(cancel)
        prefix_ids, prefix_lengths = pad_right(prefixes)
        prefix_mask = torch.arange(prefix_ids.shape[1])[None] < prefix_lengths[:, None]
        state = self.module.encode_prefixes(prefix_ids.to(self.device), prefix_mask.to(self.device))
        self.stats.add(real=int(prefix_lengths.sum()), computed=prefix_ids.numel())
        flat = [seq for docs in seqs for seq in docs]
        group = np.repeat(np.arange(len(seqs)), [len(docs) for docs in seqs])
        scores = np.empty(len(flat), dtype=np.float32)
        for batch in self.plan([len(s) for s in flat]):
            check_cancelled(cancel)
            padded, lengths = pad_right([flat[i] for i in batch])
            self.stats.add(real=int(lengths.sum()), computed=padded.numel())
            out = self.module.score_documents(
                state,
                padded.to(self.device),
                lengths.to(self.device),
                torch.from_numpy(group[batch]).to(self.device),
            )
            scores[batch] = out.cpu().numpy()
        bounds = np.cumsum([len(docs) for docs in seqs])[:-1]
        return np.split(scores, bounds)

    def _score_search(
        self, prefix: list[int], seqs: list[list[int]], cancel: CancelFn | None = None
    ) -> np.ndarray:
        scores = np.empty(len(seqs), dtype=np.float32)
        if not seqs:
            return scores
        check_cancelled(cancel)
        prefix_ids = torch.tensor([prefix], device=self.device)
        state = self.module.encode_prefixes(
            prefix_ids, torch.ones_like(prefix_ids, dtype=torch.bool)
        )
        self.stats.add(real=len(prefix), computed=len(prefix))
        for batch in self.plan([len(s) for s in seqs]):
            check_cancelled(cancel)
            padded, lengths = pad_right([seqs[i] for i in batch])
            self.stats.add(real=int(lengths.sum()), computed=padded.numel())
            out = self.module.score_documents(
                state, padded.to(self.device), lengths.to(self.device)
            )
            scores[batch] = out.cpu().numpy()
        return scores


@dataclass
class CausalBatch:
    """Inputs of the causal scoring module for training: one prefix row per group."""

    prefix_ids: torch.Tensor  # [G, P] right-padded
    prefix_mask: torch.Tensor  # [G, P] bool
    doc_ids: torch.Tensor  # [G * group_size, D] document + suffix ids, right-padded
    doc_lengths: torch.Tensor  # [G * group_size]
    doc_group: torch.Tensor  # [G * group_size] prefix row of each document
    modes: list[Mode]

    def inputs(self) -> tuple[torch.Tensor, ...]:
        return self.prefix_ids, self.prefix_mask, self.doc_ids, self.doc_lengths, self.doc_group

    def to(self, device: torch.device) -> CausalBatch:
        return move_tensors(self, device)
