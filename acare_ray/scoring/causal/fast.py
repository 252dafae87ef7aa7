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


# Flash attention that also returns the log-sum-exp of each query row (the public SDPA does
# not), which lets two attention calls over disjoint key sets be merged exactly. The CPU kernel
# takes an additive mask; the CUDA one takes none (a causal flag only) and runs bf16/fp16.
_CPU_FLASH = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
_CUDA_FLASH = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention", None)
_CUDA_CUDNN = getattr(torch.ops.aten, "_scaled_dot_product_cudnn_attention", None)
CUDA_KERNELS = ("cudnn", "flash")
cuda_kernel = "cudnn"
"""Which CUDA kernel the split path calls (:data:`CUDA_KERNELS`): cuDNN's fused attention where
it runs (less device time than PyTorch's flash-2 kernel at the same scores within bf16
rounding, measured in ``benchmarks/results/gpu-levers.md``), else flash
(:func:`select_cuda_kernel`)."""


def select_cuda_kernel(device: torch.device, dtype: torch.dtype) -> str:
    """Keep cuDNN for the split path when it runs on ``device`` in ``dtype`` and agrees with the
    flash kernel on a small case; otherwise switch the process to flash. Returns the choice."""
    global cuda_kernel
    if device.type != "cuda" or cuda_kernel != "cudnn":
        return cuda_kernel
    try:
        gen = torch.Generator(device=device).manual_seed(0)
        q, k, v = (
            torch.randn(1, 2, n, 128, device=device, dtype=dtype, generator=gen)
            for n in (96, 80, 80)
        )
        with torch.inference_mode():
            out, lse = _CUDA_CUDNN(q, k, v, None, True, 0.0, False, False, scale=0.088)[:2]
            ref, ref_lse = _CUDA_FLASH(q, k, v, 0.0, False, False, scale=0.088)[:2]
        agree = torch.allclose(out.float(), ref.float(), atol=2e-2) and torch.allclose(
            lse.reshape(ref_lse.shape).float(), ref_lse.float(), atol=2e-2
        )
    except Exception:  # noqa: BLE001 - any failure means cuDNN's kernel is not usable here
        agree = False
    if not agree:
        cuda_kernel = "flash"
    return cuda_kernel


ATTENTION_CHOICES = ("auto", "split", "concat")
"""How candidates attend to their search's prefix (:attr:`PrefixSharedYesNo.attention`):
``split`` (the prefix once for all candidates, merged with each candidate's own causal attention
by log-sum-exp), ``concat`` (the prefix keys/values copied before each candidate's own, one
masked attention) or ``auto`` (split when the prefix is at least as long as the candidates and a
kernel returns the log-sum-exp on the device, else concat)."""


def split_kernel(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether a flash kernel with log-sum-exp runs on ``device`` in ``dtype``."""
    if device.type == "cpu":
        return _CPU_FLASH is not None
    if device.type == "cuda":
        return _CUDA_FLASH is not None and dtype in (torch.float16, torch.bfloat16)
    return False


def _flash_lse(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float,
    causal: bool = False,
    bias: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention output ``[B, H, L, d]`` and float32 log-sum-exp ``[B, H, L]``, equal head counts.

    The one device switch of the split path: the CUDA kernel (no mask; ``bias`` must be None)
    or the CPU kernel (optional additive ``bias``)."""
    if q.device.type == "cuda":
        if cuda_kernel == "cudnn":
            out = _CUDA_CUDNN(q, k, v, None, True, 0.0, causal, False, scale=scale)
            return out[0], out[1].reshape(q.shape[:-1])
        out = _CUDA_FLASH(q, k, v, 0.0, causal, False, scale=scale)
    else:
        out = _CPU_FLASH(q, k, v, 0.0, causal, attn_mask=bias, scale=scale)
    return out[0], out[1]


def _attend_shared_prefix(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    prefix_k: torch.Tensor,
    prefix_v: torch.Tensor,
    own_bias: torch.Tensor | None,
    scale: float,
) -> torch.Tensor:
    """softmax over [prefix ; own keys] without copying the prefix keys/values per candidate.

    ``q`` ``[B, H, D, d]``; ``k``, ``v`` ``[B, KV, D, d]``; ``prefix_k/v`` ``[1, KV, P, d]``
    (one prefix, every position real). Query heads sharing a key head are folded into the query
    length, and for the prefix all candidates' queries form one long block against the single
    prefix, so each prefix key is read once per batch instead of once per candidate; no mask is
    needed there. The candidates' own tokens: with ``own_bias`` ``[B, 1, H/KV * D, D]`` (causal
    and length as an additive mask, CPU) the folded queries against their key head; with None,
    the kernel's causal flag with the own keys repeated per query head (CUDA: its flash kernel
    takes no mask; right padding cannot reach a real position under a causal mask). The two
    partial softmaxes are merged with their log-sum-exps: ``out = w * out_prefix + (1 - w) *
    out_own``, ``w = sigmoid(lse_prefix - lse_own)``.
    """
    batch, heads, length, dim = q.shape
    kv_heads = k.shape[1]
    group = heads // kv_heads
    folded = q.reshape(batch, kv_heads, group * length, dim)
    shared_q = folded.transpose(0, 1).reshape(1, kv_heads, batch * group * length, dim)
    out_p, lse_p = _flash_lse(shared_q, prefix_k, prefix_v, scale)
    out_p = out_p.reshape(kv_heads, batch, group * length, dim).transpose(0, 1)
    lse_p = lse_p.reshape(kv_heads, batch, group * length).transpose(0, 1)
    if own_bias is not None:
        out_o, lse_o = _flash_lse(folded, k, v, scale, bias=own_bias)
    else:
        own_k, own_v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        out_o, lse_o = _flash_lse(q, own_k, own_v, scale, causal=True)
    shape = (batch, kv_heads, group * length)
    weight = torch.sigmoid(lse_p - lse_o.reshape(shape)).unsqueeze(-1)
    weight = weight.to(out_p.dtype)  # the log-sum-exps are float32 also for bfloat16 inputs
    out = torch.lerp(out_o.reshape(*shape, dim), out_p, weight)
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
    """The split path's mask for the candidates' own tokens: an additive causal/length bias with
    query heads folded per key head (CPU), or None (CUDA: the kernel's causal flag)."""

    own_bias: torch.Tensor | None  # [B, 1, H/KV * D, D]

    @classmethod
    def build(cls, own: torch.Tensor, config, dtype: torch.dtype) -> _SplitMask:
        if own.device.type == "cuda":
            return cls(None)
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
        self.attention = "auto"
        """One of :data:`ATTENTION_CHOICES`; benchmarks set it to compare the two."""
        self._compiled: dict[str, Callable] = {}

    def compile_layers(self, **options) -> None:
        """Run every decoder-layer step through ``torch.compile`` (dynamic shapes) from now on.

        Fuses the element-wise work around the matrix products (norms, rotary, SiLU, the
        log-sum-exp merge); one graph serves every layer. The prefix pass, the split document
        pass and the concatenating one are compiled apart, so each keeps its own few graphs.
        The first call of each shape class pays the compilation: :meth:`warm_up` makes those
        calls at load. Scores stay equal within float rounding. ``options`` go to
        ``torch.compile``.
        """
        self._compiled = {
            kind: torch.compile(step, dynamic=True, **options)
            for kind, step in (
                ("prefix", _prefix_step),
                ("split", _split_step),
                ("concat", _concat_step),
            )
        }

    @property
    def compiled(self) -> bool:
        return bool(self._compiled)

    def warm_up(self, packs: bool = False) -> None:
        """Score a few made-up searches so that each graph a request can need is compiled now:
        a long and a short prefix (the split and the concat document pass), batches of two
        candidates and of one (sizes 1 are their own graphs), and with ``packs`` two prefixes
        in one pass (:attr:`~acare_ray.scoring.causal.backend.CausalLMBackend.pack_tokens`)."""
        weight = self._decoder.embed_tokens.weight
        device, vocab = weight.device, weight.shape[0]
        ids = (torch.arange(1, 49, device=device) * 7919) % vocab
        docs = ids[24:40].reshape(2, 8)
        lengths = torch.tensor([8, 5], device=device)
        with torch.inference_mode():
            for prefix_length in (24, 4):
                prefix = ids[None, :prefix_length]
                state = self.encode_prefixes(prefix, torch.ones_like(prefix, dtype=torch.bool))
                for rows in (2, 1):
                    self.score_documents(state, docs[:rows], lengths[:rows])
            if packs:
                prefixes = ids[:24].reshape(2, 12)
                mask = torch.ones_like(prefixes, dtype=torch.bool)
                mask[1, 9:] = False
                state = self.encode_prefixes(prefixes, mask)
                group = torch.tensor([0, 1], device=device)
                for rows in (2, 1):
                    self.score_documents(state, docs[:rows], lengths[:rows], group[:rows])

    def _step(self, kind: str, *args) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        step = self._compiled.get(kind)
        if step is not None:
            return step(self, *args)
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
        mask: torch.Tensor | _SplitMask | None,
        past: tuple[torch.Tensor, torch.Tensor, torch.Tensor | None] | None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One decoder layer. ``mask``: a boolean mask, the split path's own-token mask, or None
        (causal: one unpadded prefix)."""
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
                q,
                keys,
                values,
                attn_mask=mask,
                is_causal=mask is None,
                scale=attn.scaling,
                enable_gqa=True,
            )
        x = x + attn.o_proj(out.transpose(1, 2).reshape(batch, length, -1))
        x = x + layer.mlp(layer.post_attention_layernorm(x))
        return x, k, v

    def _rotary(
        self, x: torch.Tensor, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        cos, sin = self._decoder.rotary_emb(x, positions)
        return cos.unsqueeze(1), sin.unsqueeze(1)

    def _can_split(self, x: torch.Tensor, prefix: PrefixState, doc_group) -> bool:
        """Split attention (:func:`_attend_shared_prefix`) for inference on one unpadded prefix
        at least as long as the candidates, where a kernel for it runs (CPU; CUDA in bf16/fp16).
        A short (M0) prefix is cheaper to copy than to merge on both (docs/speed.md has the
        measurement).
        :attr:`attention` forces either."""
        if (
            self.attention == "concat"
            or doc_group is not None
            or torch.is_grad_enabled()
            or not split_kernel(x.device, x.dtype)
            or not bool(prefix.mask.all())
        ):
            return False
        return self.attention == "split" or prefix.mask.shape[1] >= x.shape[1]

    def encode_prefixes(self, prefix_ids: torch.Tensor, prefix_mask: torch.Tensor) -> PrefixState:
        """Run right-padded prefixes ``[G, P]`` once; keep every layer's keys and values."""
        groups, length = prefix_ids.shape
        x = self._decoder.embed_tokens(prefix_ids)
        positions = torch.arange(length, device=x.device).expand(groups, -1)
        cos, sin = self._rotary(x, positions)
        mask = None  # one unpadded prefix: the kernel's causal flag
        if groups > 1 or not bool(prefix_mask.all()):
            causal = torch.ones(length, length, dtype=torch.bool, device=x.device).tril()
            mask = (causal[None] & prefix_mask[:, None, :])[:, None]
        keys, values = [], []
        for layer in self._decoder.layers:
            x, k, v = self._step("prefix", layer, x, cos, sin, mask, None)
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
        split = self._can_split(x, prefix, doc_group)
        if split:
            mask = _SplitMask.build(own, self.lm.config, x.dtype)
        else:
            shared = prefix.mask[group][:, None, :].expand(-1, length, -1)
            mask = torch.cat([shared, own], dim=2)[:, None]
        for i, layer in enumerate(self._decoder.layers):
            past = (prefix.keys[i], prefix.values[i], doc_group)
            x, _, _ = self._step("split" if split else "concat", layer, x, cos, sin, mask, past)
        last = x[torch.arange(rows, device=x.device), doc_lengths - 1]
        return yes_no_logodds(self._decoder.norm(last), self.lm.lm_head, self.yes_no_ids)


# The compiled steps: one function per kind of pass, so that torch.compile keeps each kind's
# graphs (and its recompilation limit) apart.
def _prefix_step(module: PrefixSharedYesNo, *args):
    return module._layer(*args)


def _split_step(module: PrefixSharedYesNo, *args):
    return module._layer(*args)


def _concat_step(module: PrefixSharedYesNo, *args):
    return module._layer(*args)
