"""What every protocol's request adds to its own shape: the agent's context."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from acare_ray.online.service import RerankInput


class AgentFields(BaseModel):
    """The ACARe extension: what the agent knows beyond the sub-query in ``query``."""

    model_config = ConfigDict(extra="forbid")

    original_question: str | None = Field(
        None, description="The agent's original (global) question for the session."
    )
    reasoning: str | None = Field(
        None, description="The agent's reasoning just before this search (its end matters most)."
    )
    mode: str = Field(
        "auto",
        description=(
            "Which fields the reranker reads: M0 (query only, the official prompt), M1 (+reasoning),"
            " M2 (+original_question), M3 (both); aliases base/reasoning/question/full; auto = the"
            " richest mode the given fields allow."
        ),
    )
    instruction: str | None = Field(
        None,
        description="Replaces the prompt's <Instruct> line for this request (causal models); "
        "absent: the mode's default.",
    )

    def agent_search(self, query: str, documents: Sequence[str], **options: Any) -> RerankInput:
        """A :class:`RerankInput` of ``query`` over ``documents`` with these fields (``options``:
        the other :class:`RerankInput` settings of the endpoint's shape)."""
        return RerankInput(
            query=query,
            documents=documents,
            original_question=self.original_question,
            reasoning=self.reasoning,
            mode=self.mode,
            instruction=self.instruction,
            **options,
        )
