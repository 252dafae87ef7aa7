"""Causal-LM yes/no scoring with a shared prefix (Qwen3-Reranker and ACARe checkpoints).

score = logit("yes") - logit("no") at the last real position (docs/architecture.md, section 2).

:class:`PrefixSharedYesNo` runs the decoder layers of a Hugging Face Llama-family causal LM
(Qwen3, Qwen2, Llama, Mistral) itself, in two passes:

1. the prefix pass runs each search's shared prefix once and keeps its keys and values;
2. the document pass runs only the candidate tokens (document + suffix). Their queries attend
   to the prefix keys/values, which are broadcast to the candidates of that search (an
   ``expand`` view when a batch holds one search, never a per-candidate forward of the prefix),
   and causally to their own tokens.

Only the last real position of each candidate is normalised and projected, onto the two
lm_head rows for "yes" and "no"; the vocabulary-wide head is never computed. The module is an
``nn.Module`` with a plain ``forward`` so training wraps it in DDP/FSDP and gets gradients
through exactly the code that serves.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from acare_ray.backend import CancelFn, check_cancelled
from acare_ray.context import AgentContext, Mode
from acare_ray.prompt import PromptEncoder

SUPPORTED_MODEL_TYPES = ("qwen3", "qwen2", "llama", "mistral")


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return x * cos + _rotate_half(x) * sin


# Flash attention on CPU that also returns the log-sum-exp of each query row (the public SDPA
# does not), which lets two attention calls over disjoint key sets be merged exactly.
_CPU_FLASH = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def _attend_shared_prefix(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    prefix_k: torch.Tensor,
    prefix_v: torch.Tensor,
    own_bias: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """softmax over [prefix ; own keys] without copying the prefix keys/values per candidate.

    ``q`` ``[B, H, D, d]``; ``k``, ``v`` ``[B, KV, D, d]``; ``prefix_k/v`` ``[1, KV, P, d]``
    (one prefix, every position real); ``own_bias`` ``[B, 1, H/KV * D, D]`` additive mask.
    Query heads sharing a key head are folded into the query length, and for the prefix all
    candidates' queries form one long block against the single prefix, so each prefix key is
    read once per batch instead of once per candidate. The two partial softmaxes are merged
    with their log-sum-exps: ``out = w * out_prefix + (1 - w) * out_own``,
    ``w = sigmoid(lse_prefix - lse_own)``.
    """
    batch, heads, length, dim = q.shape
    kv_heads = k.shape[1]
    folded = q.reshape(batch, kv_heads, heads // kv_heads * length, dim)
    rows = folded.shape[2]
    shared_q = folded.transpose(0, 1).reshape(1, kv_heads, batch * rows, dim)
    out_p, lse_p = _CPU_FLASH(shared_q, prefix_k, prefix_v, scale=scale)
    out_p = out_p.reshape(kv_heads, batch, rows, dim).transpose(0, 1)
    lse_p = lse_p.reshape(kv_heads, batch, rows).transpose(0, 1)
    out_o, lse_o = _CPU_FLASH(folded, k, v, attn_mask=own_bias, scale=scale)
    weight = torch.sigmoid(lse_p - lse_o.reshape(batch, kv_heads, rows)).unsqueeze(-1)
    weight = weight.to(out_p.dtype)  # the log-sum-exps are float32 also for bfloat16 inputs
    out = torch.lerp(out_o.reshape(batch, kv_heads, rows, dim), out_p, weight)
    return out.reshape(batch, heads, length, dim)


@dataclass
class PrefixState:
    """Keys/values of one batch of prefixes: per layer ``[G, kv_heads, P, head_dim]``."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    mask: torch.Tensor  # [G, P] bool, True for real prefix tokens
    lengths: torch.Tensor  # [G]


@dataclass
class _SplitMask:
    """Candidates' own causal/length mask as an additive bias, query heads folded per key head."""

    own_bias: torch.Tensor  # [B, 1, H/KV * D, D]

    @classmethod
    def build(cls, own: torch.Tensor, config, dtype: torch.dtype) -> _SplitMask:
        group = config.num_attention_heads // config.num_key_value_heads
        batch, length, _ = own.shape
        bias = torch.zeros(own.shape, dtype=dtype, device=own.device)
        bias.masked_fill_(~own, float("-inf"))
        folded = bias[:, None].expand(batch, group, length, length)
        return cls(folded.reshape(batch, 1, group * length, length))


class PrefixSharedYesNo(nn.Module):
    """Wraps a ``*ForCausalLM`` model; scores candidates sharing prefixes, yes/no rows only.

    The fast path. :func:`acare_ray.causal_fallback.check_fast_path` lists what it assumes of
    the model; a model that departs from it is scored by the exact fallback
    (:class:`acare_ray.causal_fallback.HFForwardYesNo`) instead.
    """

    path = "fast"

    def __init__(self, causal_lm: nn.Module, yes_id: int, no_id: int) -> None:
        super().__init__()
        model_type = getattr(causal_lm.config, "model_type", None)
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(
                f"model_type {model_type!r} is not supported by the causal yes/no backend "
                f"(supported: {', '.join(SUPPORTED_MODEL_TYPES)})"
            )
        if getattr(causal_lm.config, "use_sliding_window", False):
            raise ValueError("sliding-window attention is not supported by the causal backend")
        self.lm = causal_lm
        self.register_buffer("yes_no_ids", torch.tensor([yes_id, no_id]), persistent=False)
        self._compiled_layer: Callable | None = None

    def compile_layers(self, **options) -> None:
        """Run every decoder-layer step through ``torch.compile`` (dynamic shapes) from now on.

        Fuses the element-wise work around the matrix products (norms, rotary, SiLU), which is
        a quarter of the time on CPU in float32 and most of it in bfloat16. The first calls pay
        the compilation (about a minute on 2 CPU cores); one graph serves every layer. Scores
        stay equal within float rounding. ``options`` go to ``torch.compile``.
        """
        self._compiled_layer = torch.compile(type(self)._layer, dynamic=True, **options)

    def _step(self, *args) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if self._compiled_layer is not None:
            return self._compiled_layer(self, *args)
        return self._layer(*args)

    @property
    def _decoder(self) -> nn.Module:
        return self.lm.model

    def _head_rows(self) -> torch.Tensor:
        return self.lm.lm_head.weight[self.yes_no_ids]

    def _layer(
        self,
        layer: nn.Module,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor | _SplitMask,
        past: tuple[torch.Tensor, torch.Tensor, torch.Tensor | None] | None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        attn = layer.self_attn
        batch, length, _ = x.shape
        h = layer.input_layernorm(x)
        shape = (batch, length, -1, attn.head_dim)
        q = attn.q_proj(h).view(shape)
        k = attn.k_proj(h).view(shape)
        if hasattr(attn, "q_norm"):
            q, k = attn.q_norm(q), attn.k_norm(k)
        q = _rope(q.transpose(1, 2), cos, sin)
        k = _rope(k.transpose(1, 2), cos, sin)
        v = attn.v_proj(h).view(shape).transpose(1, 2)
        if isinstance(mask, _SplitMask):
            past_k, past_v, _ = past
            out = _attend_shared_prefix(q, k, v, past_k, past_v, mask.own_bias, attn.scaling)
        else:
            keys, values = k, v
            if past is not None:
                past_k, past_v, rows = past
                if rows is None:
                    past_k = past_k.expand(batch, -1, -1, -1)
                    past_v = past_v.expand(batch, -1, -1, -1)
                else:
                    past_k, past_v = past_k[rows], past_v[rows]
                keys, values = torch.cat([past_k, k], dim=2), torch.cat([past_v, v], dim=2)
            out = F.scaled_dot_product_attention(
                q, keys, values, attn_mask=mask, scale=attn.scaling, enable_gqa=True
            )
        x = x + attn.o_proj(out.transpose(1, 2).reshape(batch, length, -1))
        x = x + layer.mlp(layer.post_attention_layernorm(x))
        return x, k, v

    def _rotary(
        self, x: torch.Tensor, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        cos, sin = self._decoder.rotary_emb(x, positions)
        return cos.unsqueeze(1), sin.unsqueeze(1)

    @staticmethod
    def _can_split(x: torch.Tensor, prefix: PrefixState, doc_group: torch.Tensor | None) -> bool:
        """Split attention for CPU inference on one unpadded prefix at least as long as the
        candidates (there it beats copying the prefix per candidate: M3 15% faster on CPU; a
        short M0 prefix is cheaper to copy than to merge). Everything else concatenates."""
        return (
            _CPU_FLASH is not None
            and x.device.type == "cpu"
            and doc_group is None
            and not torch.is_grad_enabled()
            and prefix.mask.shape[1] >= x.shape[1]
            and bool(prefix.mask.all())
        )

    def encode_prefixes(self, prefix_ids: torch.Tensor, prefix_mask: torch.Tensor) -> PrefixState:
        """Run right-padded prefixes ``[G, P]`` once; keep every layer's keys and values."""
        groups, length = prefix_ids.shape
        x = self._decoder.embed_tokens(prefix_ids)
        positions = torch.arange(length, device=x.device).expand(groups, -1)
        cos, sin = self._rotary(x, positions)
        causal = torch.ones(length, length, dtype=torch.bool, device=x.device).tril()
        mask = (causal[None] & prefix_mask[:, None, :])[:, None]
        keys, values = [], []
        for layer in self._decoder.layers:
            x, k, v = self._step(layer, x, cos, sin, mask, None)
            keys.append(k)
            values.append(v)
        return PrefixState(keys, values, prefix_mask, prefix_mask.sum(dim=1))

    def score_documents(
        self,
        prefix: PrefixState,
        doc_ids: torch.Tensor,
        doc_lengths: torch.Tensor,
        doc_group: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Scores ``[N]`` (float32 log-odds) of right-padded candidates ``[N, D]``.

        ``doc_ids`` holds document + suffix tokens; ``doc_group[i]`` is the prefix row candidate
        ``i`` continues (``None``: every candidate continues the single prefix, broadcast).
        """
        rows, length = doc_ids.shape
        if doc_group is None and prefix.mask.shape[0] != 1:
            raise ValueError("doc_group is required when several prefixes are encoded")
        group = (
            torch.zeros(rows, dtype=torch.long, device=doc_ids.device)
            if doc_group is None
            else doc_group
        )
        x = self._decoder.embed_tokens(doc_ids)
        positions = prefix.lengths[group][:, None] + torch.arange(length, device=x.device)
        cos, sin = self._rotary(x, positions)
        steps = torch.arange(length, device=x.device)
        own = (steps[None, :] <= steps[:, None])[None] & (
            steps[None, None, :] < doc_lengths[:, None, None]
        )
        if self._can_split(x, prefix, doc_group):
            mask = _SplitMask.build(own, self.lm.config, x.dtype)
        else:
            shared = prefix.mask[group][:, None, :].expand(-1, length, -1)
            mask = torch.cat([shared, own], dim=2)[:, None]
        for i, layer in enumerate(self._decoder.layers):
            past = (prefix.keys[i], prefix.values[i], doc_group)
            x, _, _ = self._step(layer, x, cos, sin, mask, past)
        last = x[torch.arange(rows, device=x.device), doc_lengths - 1]
        last = self._decoder.norm(last)
        logits = last.float() @ self._head_rows().float().T
        return logits[:, 0] - logits[:, 1]

    def forward(
        self,
        prefix_ids: torch.Tensor,
        prefix_mask: torch.Tensor,
        doc_ids: torch.Tensor,
        doc_lengths: torch.Tensor,
        doc_group: torch.Tensor,
    ) -> torch.Tensor:
        """Differentiable scores for training: several groups, each with its own prefix."""
        state = self.encode_prefixes(prefix_ids, prefix_mask)
        return self.score_documents(state, doc_ids, doc_lengths, doc_group)


class CausalLMBackend:
    """Inference loop: prefix tokenized and run once per search, documents in token-budget batches.

    ``plan`` cuts a list of sequence lengths into batches of indices (see
    :func:`acare_ray.scorer.plan_batches`). ``stats`` accumulates real vs computed tokens and the
    time spent tokenizing, for the benchmarks. ``path`` says which module scores: ``"fast"``
    (:class:`PrefixSharedYesNo`) or ``"fallback"`` (the model's own forward,
    :class:`acare_ray.causal_fallback.HFForwardYesNo`); ``path_reasons`` says why it is not the
    fast one (empty on the fast path).
    """

    name = "causal_lm"

    def __init__(
        self,
        module: nn.Module,
        encoder: PromptEncoder,
        plan: Callable[[list[int]], list[np.ndarray]],
        device: torch.device,
        pack_tokens: int | None = None,
        pack_rows: int = 512,
        path_reasons: Sequence[str] = (),
    ) -> None:
        self.module = module.eval()
        self.path: str = getattr(module, "path", "fast")
        self.path_reasons: list[str] = list(path_reasons)
        self.encoder = encoder
        self.plan = plan
        self.device = device
        self.pack_tokens = pack_tokens
        self.pack_rows = pack_rows
        self.stats = BackendStats()

    def render(self, context: AgentContext, document: str, mode: Mode) -> str:
        return self.encoder.render(context, document, mode)

    # The rest of the Backend protocol (acare_ray.backend): checkpoints, training, online tokens.
    document_lead = " "  # a document is tokenized as " " + text, after the prefix

    @property
    def hf_model(self) -> nn.Module:
        return self.module.lm

    @property
    def tokenizer(self) -> Any:
        return self.encoder.tokenizer

    @property
    def inert(self) -> Any:
        return self.encoder.inert

    @property
    def max_length(self) -> int:
        return self.encoder.config.max_length

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
        self, searches: list[tuple[AgentContext, Mode, list[str]]], cancel: CancelFn | None = None
    ) -> list[np.ndarray]:
        """Float32 log-odds per search, documents in input order; ``cancel`` is checked before
        every forward pass (:func:`~acare_ray.backend.check_cancelled`)."""
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
        seqs, start = [], 0
        for _, _, docs in searches:
            seqs.append([ids + suffix for ids in doc_ids[start : start + len(docs)]])
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
        return results

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
class BackendStats:
    """Counters a backend accumulates: tokens really present vs computed, tokenizing time."""

    real_tokens: int = 0
    computed_tokens: int = 0
    tokenize_s: float = 0.0

    def add(self, real: int, computed: int) -> None:
        self.real_tokens += real
        self.computed_tokens += computed

    @property
    def padding_efficiency(self) -> float:
        return self.real_tokens / self.computed_tokens if self.computed_tokens else 1.0


@dataclass
class CausalBatch:
    """Inputs of :class:`PrefixSharedYesNo` for training: one prefix row per group."""

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


def move_tensors(batch: Any, device: torch.device) -> Any:
    """A copy of dataclass ``batch`` with its tensor fields on ``device``."""
    moved = {
        f.name: getattr(batch, f.name).to(device)
        for f in fields(batch)
        if isinstance(getattr(batch, f.name), torch.Tensor)
    }
    return replace(batch, **moved)


def pad_right(rows: list[list[int]], pad_id: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``[N, max_len]`` right-padded ids and ``[N]`` lengths."""
    lengths = np.fromiter((len(r) for r in rows), dtype=np.int64, count=len(rows))
    out = np.full((len(rows), int(lengths.max())), pad_id, dtype=np.int64)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return torch.from_numpy(out), torch.from_numpy(lengths)
