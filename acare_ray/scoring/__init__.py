"""The scoring core: (agent context, document) pairs in, float32 log-odds out. No Ray imports.

Its public surface, each in one place:

- :class:`~acare_ray.scoring.scorer.Scorer` (``from_pretrained``, ``score``, ``score_many``,
  ``score_resolved``, ``rank``, ``render``) and :class:`~acare_ray.scoring.context.AgentContext` /
  :class:`~acare_ray.scoring.context.Mode`;
- :class:`~acare_ray.scoring.config.ScorerConfig`: every setting and its default;
- :class:`~acare_ray.scoring.backend.Backend` and the registry
  :data:`~acare_ray.scoring.backend.BACKENDS` (``causal_lm``, ``cross_encoder``);
- :func:`~acare_ray.scoring.errors.score_isolated` (and ``score_resolved_isolated``, for modes
  already chosen, with token counts): the error policy every caller scores through;
- :class:`~acare_ray.scoring.tokens.TokenLayout`: token accounting and document truncation
  before scoring (the online service).

Inside: :mod:`~acare_ray.scoring.prompt` (the prompt template and token assembly),
:mod:`~acare_ray.scoring.untrusted` (user text can never become a control token; the bounded
pre-cut), :mod:`~acare_ray.scoring.batching` (the token-budget planner),
:mod:`~acare_ray.scoring.causal` and :mod:`~acare_ray.scoring.cross_encoder` (the backends).
docs/architecture.md draws how they fit.
"""

from acare_ray.scoring.backend import (
    BACKENDS,
    Backend,
    BackendStats,
    CancelFn,
    Cancelled,
    ScoredSearch,
)
from acare_ray.scoring.config import (
    ACARE_CONFIG_FILE,
    DEFAULT_MODEL,
    FieldCaps,
    PromptConfig,
    ScorerConfig,
    ScorerSettings,
    read_acare_config,
    resolve_model_path,
)
from acare_ray.scoring.context import (
    AUTO,
    AgentContext,
    FieldDropout,
    FieldError,
    Mode,
    parse_mode,
)
from acare_ray.scoring.errors import is_out_of_memory, score_isolated, score_resolved_isolated
from acare_ray.scoring.scorer import Ranking, Scorer, check_documents, rank_order
from acare_ray.scoring.tokens import TokenLayout

__all__ = [
    "ACARE_CONFIG_FILE",
    "AUTO",
    "BACKENDS",
    "DEFAULT_MODEL",
    "AgentContext",
    "Backend",
    "BackendStats",
    "CancelFn",
    "Cancelled",
    "FieldCaps",
    "FieldDropout",
    "FieldError",
    "Mode",
    "PromptConfig",
    "Ranking",
    "ScoredSearch",
    "Scorer",
    "ScorerConfig",
    "ScorerSettings",
    "TokenLayout",
    "check_documents",
    "is_out_of_memory",
    "parse_mode",
    "rank_order",
    "read_acare_config",
    "resolve_model_path",
    "score_isolated",
    "score_resolved_isolated",
]
