"""The fast causal path: yes/no scoring with a shared prefix (Qwen3-Reranker and ACARe checkpoints).

:class:`PrefixSharedYesNo` runs the decoder layers of a Hugging Face Llama-family causal LM
(Qwen3, Qwen2, Llama, Mistral) itself, in two passes:

1. the prefix pass runs each search's shared prefix once and keeps its keys and values;
2. the document pass runs only the candidate tokens (document + suffix). Their queries attend
   to the prefix keys/values, which are broadcast to the candidates of that search (an
   ``expand`` view when a batch holds one search, never a per-candidate forward of the prefix),
   and causally to their own tokens.

Only the last real position of each candidate is normalised and projected, onto the two
lm_head rows for "yes" and "no" (:mod:`acare_ray.scoring.causal.head`).
:mod:`acare_ray.scoring.causal.load` checks at load time that a model has the layout this
path assumes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from acare_ray.scoring.causal.head import YesNoModule, yes_no_logodds

SUPPORTED_MODEL_TYPES = ("qwen3", "qwen2", "llama", "mistral")


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return x * cos + rotate_half(x) * sin


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


class PrefixSharedYesNo(YesNoModule):
    """Wraps a ``*ForCausalLM`` model; scores candidates sharing prefixes, yes/no rows only.

    The fast path. :func:`acare_ray.scoring.causal.load.check_fast_path` lists what it assumes
    of the model; a model that departs from it is scored by the exact fallback
    (:class:`acare_ray.scoring.causal.hf_forward.HFForwardYesNo`) instead.
    """

    path = "fast"

    def __init__(self, causal_lm: nn.Module, yes_id: int, no_id: int) -> None:
        model_type = getattr(causal_lm.config, "model_type", None)
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(
                f"model_type {model_type!r} is not supported by the causal yes/no backend "
                f"(supported: {', '.join(SUPPORTED_MODEL_TYPES)})"
            )
        if getattr(causal_lm.config, "use_sliding_window", False):
            raise ValueError("sliding-window attention is not supported by the causal backend")
        super().__init__(causal_lm, yes_id, no_id)
        self._compiled_layer: Callable | None = None

    def compile_layers(self, **options) -> None:
        """Run every decoder-layer step through ``torch.compile`` (dynamic shapes) from now on.

        Fuses the element-wise work around the matrix products (norms, rotary, SiLU); the first
        calls pay the compilation, and one graph serves every layer (docs/speed.md has both
        figures). Scores stay equal within float rounding. ``options`` go to ``torch.compile``.
        """
        self._compiled_layer = torch.compile(type(self)._layer, dynamic=True, **options)

    def _step(self, *args) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if self._compiled_layer is not None:
            return self._compiled_layer(self, *args)
        return self._layer(*args)

    @property
    def _decoder(self) -> nn.Module:
        return self.lm.model

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
        q = apply_rope(q.transpose(1, 2), cos, sin)
        k = apply_rope(k.transpose(1, 2), cos, sin)
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
        candidates (there it beats copying the prefix per candidate, docs/speed.md; a short M0
        prefix is cheaper to copy than to merge). Everything else concatenates."""
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
        return yes_no_logodds(self._decoder.norm(last), self.lm.lm_head, self.yes_no_ids)
