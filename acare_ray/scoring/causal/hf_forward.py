"""The exact causal path: the model's own forward, its own KV cache for the shared prefix.

Slower than :mod:`acare_ray.scoring.causal.fast` but exact for any ``*ForCausalLM``; what
:mod:`acare_ray.scoring.causal.load` falls back to when a model departs from the layout the
fast path assumes.
"""

from __future__ import annotations

import copy
import inspect
from dataclasses import dataclass

import torch
from torch import nn

from acare_ray.scoring.causal.head import YesNoModule, yes_no_logodds

# Config fields after which the two lm_head rows no longer give the model's logits.
HEAD_FIELDS = ("final_logit_softcapping", "logits_scaling", "logit_scale")


@dataclass
class CachedPrefixes:
    """One model KV cache per prefix (unpadded), with the prefix lengths ``[G]``."""

    caches: list
    lengths: torch.Tensor


def _broadcast_cache(cache, rows: int):
    """A copy of a batch-1 cache whose keys/values are broadcast (``expand``) to ``rows``.

    The copy shares the prefix tensors (no per-candidate copy); the forward that uses it grows
    its own layers by concatenation, so the prefix cache stays untouched for the next batch.
    Works with layered caches (transformers 5: ``cache.layers``) and the older
    ``key_cache``/``value_cache`` lists.
    """
    fork = copy.copy(cache)
    if hasattr(cache, "layers"):
        fork.layers = []
        for layer in cache.layers:
            layer = copy.copy(layer)
            if getattr(layer, "keys", None) is not None and layer.keys.numel():
                layer.keys = layer.keys.expand(rows, *layer.keys.shape[1:])
                layer.values = layer.values.expand(rows, *layer.values.shape[1:])
            fork.layers.append(layer)
    else:  # transformers 4.x DynamicCache
        fork.key_cache = [k.expand(rows, *k.shape[1:]) for k in cache.key_cache]
        fork.value_cache = [v.expand(rows, *v.shape[1:]) for v in cache.value_cache]
    return fork


class HFForwardYesNo(YesNoModule):
    """The fallback: the model's own forward with its own KV cache for the shared prefix.

    Same interface as :class:`~acare_ray.scoring.causal.fast.PrefixSharedYesNo`
    (:class:`~acare_ray.scoring.causal.head.YesNoModule`), so
    :class:`~acare_ray.scoring.causal.backend.CausalLMBackend`, packing and training use it
    unchanged. Each prefix runs once, alone (no padding, so
    sliding windows count exactly the real tokens); candidates are right-padded, continue the
    prefix at positions ``P, P+1, ...`` and read their score at their last real position, where
    padding after it cannot reach under causal attention. The base model's final hidden state
    there is projected onto the "yes"/"no" rows of ``lm_head``; a head the two rows cannot
    reproduce (logit soft-capping or scaling) takes the model's own logits at those positions.
    """

    path = "fallback"

    def __init__(self, causal_lm: nn.Module, yes_id: int, no_id: int) -> None:
        super().__init__(causal_lm, yes_id, no_id)
        config = causal_lm.config
        self._own_head = not isinstance(getattr(causal_lm, "lm_head", None), nn.Linear) or any(
            getattr(config, name, None) not in (None, 1.0) for name in HEAD_FIELDS
        )
        decoder = self._decoder
        params = inspect.signature(decoder.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"

    @property
    def _decoder(self) -> nn.Module:
        # get_decoder() returns None on some transformers 4.x causal LMs; their decoder is the
        # base model (``base_model_prefix``, "model" for Llama-family models).
        decoder = self.lm.get_decoder()
        if decoder is None:
            decoder = getattr(self.lm, getattr(self.lm, "base_model_prefix", "model"), None)
        if decoder is None:
            raise ValueError(f"{type(self.lm).__name__}: no decoder found (get_decoder() is None)")
        return decoder

    def encode_prefixes(
        self, prefix_ids: torch.Tensor, prefix_mask: torch.Tensor
    ) -> CachedPrefixes:
        """Run each real prefix of right-padded ``[G, P]`` once, alone; keep the model's cache."""
        lengths = prefix_mask.sum(dim=1)
        caches = []
        for row, length in zip(prefix_ids, lengths.tolist()):
            out = self._decoder(input_ids=row[None, :length], use_cache=True)
            cache = getattr(out, "cache", None)
            caches.append(cache if cache is not None else out.past_key_values)
        return CachedPrefixes(caches, lengths)

    def score_documents(
        self,
        prefix: CachedPrefixes,
        doc_ids: torch.Tensor,
        doc_lengths: torch.Tensor,
        doc_group: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Scores ``[N]`` (float32 log-odds) of right-padded candidates ``[N, D]`` (document +
        suffix tokens); ``doc_group[i]``: the prefix candidate ``i`` continues."""
        if doc_group is None:
            if len(prefix.caches) != 1:
                raise ValueError("doc_group is required when several prefixes are encoded")
            groups = [(0, None)]
        else:
            groups = [(int(g), torch.nonzero(doc_group == g).flatten()) for g in doc_group.unique()]
        parts, order = [], []
        for g, rows in groups:
            ids = doc_ids if rows is None else doc_ids[rows]
            lengths = doc_lengths if rows is None else doc_lengths[rows]
            parts.append(self._score_group(prefix.caches[g], int(prefix.lengths[g]), ids, lengths))
            if rows is not None:
                order.append(rows)
        scores = torch.cat(parts)
        if doc_group is None:
            return scores
        return scores[torch.argsort(torch.cat(order))]

    def _score_group(
        self, cache, prefix_length: int, doc_ids: torch.Tensor, doc_lengths: torch.Tensor
    ) -> torch.Tensor:
        rows = doc_ids.shape[0]
        width = int(doc_lengths.max())
        doc_ids = doc_ids[:, :width]
        device = doc_ids.device
        steps = torch.arange(width, device=device)
        mask = torch.cat(
            [
                torch.ones(rows, prefix_length, dtype=torch.long, device=device),
                (steps[None] < doc_lengths[:, None]).long(),
            ],
            dim=1,
        )
        inputs = dict(
            input_ids=doc_ids,
            attention_mask=mask,
            position_ids=(prefix_length + steps).expand(rows, -1),
            use_cache=True,
        )
        inputs[self._cache_kw] = _broadcast_cache(cache, rows)
        last = doc_lengths - 1
        picked = torch.arange(rows, device=device)
        yes_no = self.yes_no_ids
        if self._own_head:
            positions = torch.unique(last)
            logits = self.lm(**inputs, logits_to_keep=positions).logits
            at = torch.searchsorted(positions, last)
            logits = logits[picked, at][:, yes_no].float()
        else:
            hidden = self._decoder(**inputs).last_hidden_state[picked, last]
            return yes_no_logodds(hidden, self.lm.lm_head, yes_no)
        return logits[:, 0] - logits[:, 1]
