"""A safe causal backend: check the fast path's assumptions at load, else run the model's own forward.

:class:`~acare_ray.causal_lm.PrefixSharedYesNo` (the fast path) re-implements Llama-family
decoder layers: it calls ``self_attn.q_proj`` / ``k_proj`` / ``v_proj`` / ``o_proj``, the
optional ``q_norm`` / ``k_norm``, ``input_layernorm``, ``mlp``, ``post_attention_layernorm``
and ``model.rotary_emb`` itself, applies rotate-half RoPE and plain full causal softmax
attention, and projects the last position onto two ``lm_head`` rows. A transformers release
that renames a module, changes the rotary embedding, adds per-layer sliding windows or hybrid
layers, or a checkpoint whose config asks for any of these, would make that code drift
silently or fail deep inside a job. So:

- :func:`check_fast_path` lists every way the loaded model departs from what the fast path
  assumes (module names and attributes, rotary call and convention, sliding-window / hybrid
  layers, ``model_type``, attention implementation, logit post-processing);
- :func:`probe_fast_path` then runs a few tokens through both the fast path and the model's own
  forward and reports a disagreement (catches what no structural check names);
- :class:`HFForwardYesNo` (the fallback) is slower but exact for any ``*ForCausalLM``: it runs
  the model's own forward, reuses each prefix through the model's own KV cache (one prefix pass,
  the cache broadcast to the candidates of each batch) and reads only the last real position of
  each candidate, projected onto the "yes" and "no" rows of ``lm_head``;
- :func:`build_causal_module` picks one (``causal_path="auto" | "fast" | "fallback"``) and logs
  a warning naming why when it falls back.
"""

from __future__ import annotations

import copy
import inspect
import logging
import sys
from dataclasses import dataclass

import torch
from torch import nn

from acare_ray.causal_lm import SUPPORTED_MODEL_TYPES, PrefixSharedYesNo, _rope

logger = logging.getLogger(__name__)

CAUSAL_PATHS = ("auto", "fast", "fallback")
LAYER_CHILDREN = {"self_attn", "mlp", "input_layernorm", "post_attention_layernorm"}
ATTENTION_PROJECTIONS = {"q_proj", "k_proj", "v_proj", "o_proj"}
ATTENTION_NORMS = {"q_norm", "k_norm"}
DECODER_CHILDREN = {"embed_tokens", "layers", "norm", "rotary_emb"}
# Exact softmax attention under every one of these; a custom kernel may not be.
ATTENTION_IMPLEMENTATIONS = (
    None,
    "eager",
    "sdpa",
    "flash_attention_2",
    "flash_attention_3",
    "flex_attention",
)
# Config fields that change the math in ways the fast path does not reproduce (value: the
# setting under which it is harmless).
UNSUPPORTED_FIELDS = {
    "attn_logit_softcapping": None,
    "final_logit_softcapping": None,
    "logits_scaling": 1.0,
    "logit_scale": 1.0,
    "attention_chunk_size": None,
    "no_rope_layers": None,
    "partial_rotary_factor": 1.0,
}
# Fields after which even the fallback cannot use two lm_head rows: it takes the model's logits.
HEAD_FIELDS = ("final_logit_softcapping", "logits_scaling", "logit_scale")


def check_fast_path(causal_lm: nn.Module) -> list[str]:
    """Every reason the fast path could not reproduce ``causal_lm`` exactly (empty: it can)."""
    config = causal_lm.config
    reasons: list[str] = []
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        reasons.append(
            f"model_type {model_type!r} is not one the fast path supports "
            f"({', '.join(SUPPORTED_MODEL_TYPES)})"
        )
    reasons += _sliding_reasons(config)
    implementation = getattr(config, "_attn_implementation", None)
    if implementation not in ATTENTION_IMPLEMENTATIONS:
        reasons.append(
            f"attention implementation {implementation!r} is not plain softmax attention "
            f"({', '.join(str(i) for i in ATTENTION_IMPLEMENTATIONS[1:])})"
        )
    for name, harmless in UNSUPPORTED_FIELDS.items():
        value = getattr(config, name, harmless)
        if value is not None and value != harmless:
            reasons.append(f"config.{name}={value!r} is not reproduced by the fast path")
    head = getattr(causal_lm, "lm_head", None)
    if not isinstance(head, nn.Linear):
        reasons.append(f"lm_head is {type(head).__name__}, not nn.Linear")
    elif head.bias is not None:
        reasons.append("lm_head has a bias (the fast path projects on its weight rows only)")
    decoder = getattr(causal_lm, "model", None)
    if not isinstance(decoder, nn.Module):
        reasons.append(f"{type(causal_lm).__name__} has no .model decoder module")
        return reasons
    reasons += _decoder_reasons(decoder, config)
    if not reasons:
        reasons += _rotary_reasons(decoder, config)
    return reasons


def _sliding_reasons(config) -> list[str]:
    reasons = []
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None:
        other = sorted({str(t) for t in layer_types} - {"full_attention"})
        if other:
            reasons.append(
                f"config.layer_types has {', '.join(other)} layers "
                f"(sliding_window={getattr(config, 'sliding_window', None)!r}); "
                "the fast path runs full attention in every layer"
            )
    if getattr(config, "use_sliding_window", False):
        reasons.append(
            f"config.use_sliding_window=True (sliding_window="
            f"{getattr(config, 'sliding_window', None)!r}, max_window_layers="
            f"{getattr(config, 'max_window_layers', None)!r})"
        )
    window = getattr(config, "sliding_window", None)
    if window is not None and not hasattr(config, "use_sliding_window"):
        reasons.append(
            f"config.sliding_window={window!r} without use_sliding_window "
            "(the model applies the window; the fast path would not)"
        )
    return reasons


def _decoder_reasons(decoder: nn.Module, config) -> list[str]:
    reasons = []
    children = {name for name, _ in decoder.named_children()}
    if missing := DECODER_CHILDREN - children:
        reasons.append(f"decoder {type(decoder).__name__} lacks {', '.join(sorted(missing))}")
    if extra := children - DECODER_CHILDREN:
        reasons.append(
            f"decoder {type(decoder).__name__} has modules the fast path does not run: "
            f"{', '.join(sorted(extra))}"
        )
    layers = getattr(decoder, "layers", None)
    if not isinstance(layers, nn.ModuleList):
        return reasons
    if len(layers) != getattr(config, "num_hidden_layers", len(layers)):
        reasons.append(
            f"{len(layers)} decoder layers but config.num_hidden_layers={config.num_hidden_layers}"
        )
    seen = set()
    for i, layer in enumerate(layers):
        for reason in _layer_reasons(layer, config):
            if reason not in seen:  # one line per kind of problem, naming the first layer
                seen.add(reason)
                reasons.append(f"layer {i}: {reason}")
    return reasons


def _layer_reasons(layer: nn.Module, config) -> list[str]:
    reasons = []
    children = {name for name, _ in layer.named_children()}
    if missing := LAYER_CHILDREN - children:
        reasons.append(f"{type(layer).__name__} lacks {', '.join(sorted(missing))}")
    if extra := children - LAYER_CHILDREN:
        reasons.append(
            f"{type(layer).__name__} has modules the fast path does not run: "
            f"{', '.join(sorted(extra))}"
        )
    attn = getattr(layer, "self_attn", None)
    if not isinstance(attn, nn.Module):
        return reasons
    names = {name for name, _ in attn.named_children()}
    if missing := ATTENTION_PROJECTIONS - names:
        reasons.append(f"{type(attn).__name__} lacks {', '.join(sorted(missing))}")
    if extra := names - ATTENTION_PROJECTIONS - ATTENTION_NORMS:
        reasons.append(
            f"{type(attn).__name__} has modules the fast path does not run: "
            f"{', '.join(sorted(extra))}"
        )
    if len(names & ATTENTION_NORMS) == 1:
        reasons.append(f"{type(attn).__name__} has only one of q_norm / k_norm")
    for name in ATTENTION_PROJECTIONS & names:
        if not isinstance(getattr(attn, name), nn.Linear):
            reasons.append(f"self_attn.{name} is not nn.Linear")
    head_dim, scaling = getattr(attn, "head_dim", None), getattr(attn, "scaling", None)
    if not isinstance(head_dim, int):
        reasons.append(f"{type(attn).__name__} has no integer head_dim")
    if not isinstance(scaling, float):
        reasons.append(f"{type(attn).__name__} has no float scaling")
    if getattr(attn, "sliding_window", None) is not None:
        reasons.append(f"self_attn.sliding_window={attn.sliding_window!r}")
    if getattr(attn, "is_causal", True) is not True:
        reasons.append("self_attn.is_causal is not True")
    if any(name == "sinks" for name, _ in attn.named_parameters(recurse=False)):
        reasons.append("self_attn has attention sinks")
    if isinstance(head_dim, int) and not reasons:
        for name, heads in (
            ("q_proj", config.num_attention_heads),
            ("k_proj", config.num_key_value_heads),
            ("v_proj", config.num_key_value_heads),
        ):
            if getattr(attn, name).out_features != heads * head_dim:
                reasons.append(
                    f"self_attn.{name} has {getattr(attn, name).out_features} outputs, "
                    f"expected {heads} heads x {head_dim}"
                )
    return reasons


def _rotary_reasons(decoder: nn.Module, config) -> list[str]:
    """``rotary_emb(x, position_ids)`` must give (cos, sin) ``[B, L, head_dim]`` that the fast
    path's rotate-half RoPE applies exactly as the model's own ``apply_rotary_pos_emb``."""
    attn = decoder.layers[0].self_attn
    head_dim = attn.head_dim
    weight = decoder.embed_tokens.weight
    x = torch.zeros(1, 5, config.hidden_size, dtype=weight.dtype, device=weight.device)
    positions = torch.arange(3, 8, device=weight.device)[None]
    try:
        with torch.no_grad():
            out = decoder.rotary_emb(x, positions)
    except Exception as error:  # noqa: BLE001 - any failure means the call changed
        return [f"rotary_emb(x, position_ids) fails: {type(error).__name__}: {error}"]
    if not (isinstance(out, tuple | list) and len(out) == 2):
        return [f"rotary_emb(x, position_ids) returns {type(out).__name__}, not (cos, sin)"]
    cos, sin = out
    if not all(isinstance(t, torch.Tensor) for t in out):
        return ["rotary_emb(x, position_ids) does not return tensors"]
    if cos.shape != (1, 5, head_dim) or sin.shape != cos.shape:
        return [
            f"rotary_emb gives cos {tuple(cos.shape)} / sin {tuple(sin.shape)}, "
            f"expected (1, 5, {head_dim})"
        ]
    apply = getattr(sys.modules.get(type(attn).__module__), "apply_rotary_pos_emb", None)
    if apply is None:
        return []  # nothing to compare the convention with; the probe still checks
    q = torch.linspace(-1, 1, config.num_attention_heads * 5 * head_dim, device=weight.device)
    q = q.reshape(1, config.num_attention_heads, 5, head_dim).to(weight.dtype)
    try:
        with torch.no_grad():
            want, _ = apply(q, q, cos, sin)
    except Exception as error:  # noqa: BLE001
        return [f"apply_rotary_pos_emb(q, k, cos, sin) fails: {type(error).__name__}: {error}"]
    got = _rope(q, cos.unsqueeze(1), sin.unsqueeze(1))
    if not torch.allclose(got.float(), want.float(), atol=1e-2, rtol=1e-2):
        return ["the model's apply_rotary_pos_emb differs from the fast path's rotate-half RoPE"]
    return []


def probe_fast_path(fast: PrefixSharedYesNo) -> str | None:
    """Score a few tokens with the fast path and with the model's own forward; a reason when
    they disagree (beyond float rounding), else None."""
    lm = fast.lm
    weight = lm.model.embed_tokens.weight
    vocab, device = weight.shape[0], weight.device
    ids = (torch.arange(1, 15, device=device) * 7919) % vocab
    prefix, docs = ids[:7], [ids[7:14], ids[7:10]]
    yes, no = (int(i) for i in fast.yes_no_ids)
    try:
        with torch.inference_mode():
            state = fast.encode_prefixes(
                prefix[None], torch.ones(1, 7, dtype=torch.bool, device=device)
            )
            padded = torch.zeros(2, 7, dtype=torch.long, device=device)
            padded[0], padded[1, :3] = docs[0], docs[1]
            lengths = torch.tensor([7, 3], device=device)
            got = fast.score_documents(state, padded, lengths).float()
            want = []
            for doc in docs:
                logits = lm(input_ids=torch.cat([prefix, doc])[None]).logits[0, -1].float()
                want.append(logits[yes] - logits[no])
            want = torch.stack(want)
    except Exception as error:  # noqa: BLE001 - the fast path must not fail on its own model
        return f"the fast path fails on this model: {type(error).__name__}: {error}"
    if weight.dtype == torch.float32:
        tolerance = 1e-3 + 1e-3 * want.abs()
    else:  # bfloat16 moves scores by ~0.025 between the two paths (docs/speed.md)
        tolerance = 0.1 * want.abs().clamp(min=1.0)
    if not bool(((got - want).abs() <= tolerance).all()):
        return (
            f"the fast path disagrees with the model's own forward on a probe "
            f"({got.tolist()} vs {want.tolist()})"
        )
    return None


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


class HFForwardYesNo(nn.Module):
    """The fallback: the model's own forward with its own KV cache for the shared prefix.

    Same interface as :class:`~acare_ray.causal_lm.PrefixSharedYesNo` (``encode_prefixes``,
    ``score_documents``, ``forward``, ``.lm``), so :class:`~acare_ray.causal_lm.CausalLMBackend`,
    packing and training use it unchanged. Each prefix runs once, alone (no padding, so
    sliding windows count exactly the real tokens); candidates are right-padded, continue the
    prefix at positions ``P, P+1, ...`` and read their score at their last real position, where
    padding after it cannot reach under causal attention. The base model's final hidden state
    there is projected onto the "yes"/"no" rows of ``lm_head``; a head the two rows cannot
    reproduce (logit soft-capping or scaling) takes the model's own logits at those positions.
    """

    path = "fallback"

    def __init__(self, causal_lm: nn.Module, yes_id: int, no_id: int) -> None:
        super().__init__()
        self.lm = causal_lm
        self.register_buffer("yes_no_ids", torch.tensor([yes_id, no_id]), persistent=False)
        config = causal_lm.config
        self._own_head = not isinstance(getattr(causal_lm, "lm_head", None), nn.Linear) or any(
            getattr(config, name, None) not in (None, 1.0) for name in HEAD_FIELDS
        )
        decoder = self._decoder
        params = inspect.signature(decoder.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"

    def compile_layers(self, **options) -> None:
        logger.warning("compile=True is ignored on the fallback causal path")

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
            head = self.lm.lm_head
            logits = hidden.float() @ head.weight[yes_no].float().T
            if head.bias is not None:
                logits = logits + head.bias[yes_no].float()
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


def build_causal_module(
    causal_lm: nn.Module,
    yes_id: int,
    no_id: int,
    device: torch.device | str,
    causal_path: str = "auto",
) -> tuple[nn.Module, list[str]]:
    """The scoring module for ``causal_lm`` on ``device`` and why the fast path was not used.

    ``causal_path``: ``"auto"`` (fast when every check and the probe pass, else the fallback
    with a warning naming the reasons), ``"fast"`` (a ValueError listing the reasons when the
    model does not fit it) or ``"fallback"`` (always the model's own forward).
    """
    if causal_path not in CAUSAL_PATHS:
        raise ValueError(
            f"causal_path must be one of {', '.join(CAUSAL_PATHS)}, got {causal_path!r}"
        )
    if causal_path == "fallback":
        logger.info(
            "causal backend: fallback path (the model's own forward), forced by causal_path"
        )
        return HFForwardYesNo(causal_lm, yes_id, no_id).to(device), [
            "forced by causal_path='fallback'"
        ]
    causal_lm = causal_lm.to(device)
    reasons = check_fast_path(causal_lm)
    if not reasons:
        fast = PrefixSharedYesNo(causal_lm, yes_id, no_id).to(device)
        probe = probe_fast_path(fast)
        if probe is None:
            return fast, []
        reasons.append(probe)
    if causal_path == "fast":
        raise ValueError(
            "causal_path='fast' but the fast causal path cannot run this model exactly: "
            + "; ".join(reasons)
        )
    logger.warning(
        "causal backend: falling back to the model's own forward (slower, exact) because %s",
        "; ".join(reasons),
    )
    return HFForwardYesNo(causal_lm, yes_id, no_id).to(device), reasons
