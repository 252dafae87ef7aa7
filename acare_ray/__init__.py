"""acare_ray: agent-context-aware reranking with one scoring core for Ray Data, Serve and Train."""

from acare_ray.scoring import (
    AgentContext,
    FieldDropout,
    Mode,
    Ranking,
    Scorer,
    ScorerConfig,
    parse_mode,
)

__all__ = [
    "AgentContext",
    "FieldDropout",
    "Mode",
    "Ranking",
    "Scorer",
    "ScorerConfig",
    "parse_mode",
]
__version__ = "0.1.0"
