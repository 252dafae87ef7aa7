"""Loading a causal LM for scoring: check the fast path's assumptions, else the model's own forward.

:class:`~acare_ray.scoring.causal.fast.PrefixSharedYesNo` (the fast path) re-implements Llama-family
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
- :class:`~acare_ray.scoring.causal.hf_forward.HFForwardYesNo` (the fallback) is slower but exact for any ``*ForCausalLM``: it runs
  the model's own forward, reuses each prefix through the model's own KV cache (one prefix pass,
  the cache broadcast to the candidates of each batch) and reads only the last real position of
  each candidate, projected onto the "yes" and "no" rows of ``lm_head``;
- :func:`load_causal_module` loads the model; :func:`build_causal_module` picks one (``causal_path="auto" | "fast" | "fallback"``) and logs
  a warning naming why when it falls back.
"""

from __future__ import annotations

import logging
import sys

import torch
from torch import nn

from acare_ray.scoring.backend import LoadRequest
from acare_ray.scoring.causal.fast import (
    SUPPORTED_MODEL_TYPES,
    PrefixSharedYesNo,
    apply_rope,
    select_cuda_kernel,
)
from acare_ray.scoring.causal.head import YesNoModule
from acare_ray.scoring.causal.hf_forward import HFForwardYesNo
from acare_ray.scoring.config import CAUSAL_PATHS

logger = logging.getLogger(__name__)

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


def _children_reasons(
    module: nn.Module, required: set[str], optional: set[str] = frozenset(), label: str = ""
) -> list[str]:
    """What ``module`` lacks of the ``required`` child modules, and the children the fast path
    would not run (neither required nor ``optional``)."""
    reasons = []
    children = {name for name, _ in module.named_children()}
    if missing := required - children:
        reasons.append(f"{label}{type(module).__name__} lacks {', '.join(sorted(missing))}")
    if extra := children - required - optional:
        reasons.append(
            f"{label}{type(module).__name__} has modules the fast path does not run: "
            f"{', '.join(sorted(extra))}"
        )
    return reasons


def _decoder_reasons(decoder: nn.Module, config) -> list[str]:
    reasons = _children_reasons(decoder, DECODER_CHILDREN, label="decoder ")
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
    reasons = _children_reasons(layer, LAYER_CHILDREN)
    attn = getattr(layer, "self_attn", None)
    if not isinstance(attn, nn.Module):
        return reasons
    names = {name for name, _ in attn.named_children()}
    reasons += _children_reasons(attn, ATTENTION_PROJECTIONS, optional=ATTENTION_NORMS)
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
    got = apply_rope(q, cos.unsqueeze(1), sin.unsqueeze(1))
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


def build_causal_module(
    causal_lm: nn.Module,
    yes_id: int,
    no_id: int,
    device: torch.device | str,
    causal_path: str = "auto",
) -> tuple[YesNoModule, list[str]]:
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
        select_cuda_kernel(torch.device(device), next(causal_lm.parameters()).dtype)
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


def load_causal_module(
    request: LoadRequest, yes_id: int, no_id: int
) -> tuple[YesNoModule, list[str]]:
    """The model at ``request.path`` as a scoring module on its device (the path
    ``request.config.causal_path`` asks for), and why it is not the fast one."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        request.path, dtype=request.dtype, attn_implementation="sdpa", revision=request.revision
    )
    module, reasons = build_causal_module(
        model, yes_id, no_id, request.device, request.config.causal_path
    )
    if compile_wanted(request.config.compile, request.device) and module.path == "fast":
        module.compile_layers()
        module.warm_up(packs=request.config.pack_searches)
    return module, reasons


def compile_wanted(setting: bool | None, device: torch.device) -> bool:
    """``compile`` as set, or by default (None) on CUDA: there the fused element-wise work
    doubles the fast path's speed (docs/speed.md); on CPU compiling is opt-in."""
    return device.type == "cuda" if setting is None else setting
