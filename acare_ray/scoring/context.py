"""What the agent knows at search time, the four input modes, and training-time field dropout.

An :class:`AgentContext` carries the sub-query the agent sent plus, optionally, the original
question of the session and the agent's current reasoning. A :class:`Mode` says which of those
fields the reranker reads (docs/architecture.md, section 3):

==== ============ ==========================
mode alias        fields
==== ============ ==========================
M0   ``base``     sub-query (official prompt)
M1   ``reasoning`` sub-query + reasoning
M2   ``question`` sub-query + original question
M3   ``full``     sub-query + question + reasoning
==== ============ ==========================

``"auto"`` picks the richest mode the supplied fields allow. A field that is missing, ``None``
or whitespace-only is absent.
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass
from enum import Enum

AUTO = "auto"


class FieldError(ValueError):
    """An input the scoring core refuses, naming it: ``field`` is the core's name for it
    (``sub_query``, ``question``, ``reasoning``, ``instruction``, ``documents``, or ``context``
    for the prompt beside the documents as a whole), ``index`` the document's position (for
    ``documents``), ``detail`` what is wrong with it. ``str()`` is the whole message. Callers
    name the field their own way from these attributes (the online 4xx bodies: ``query`` for
    ``sub_query``, ``texts[1]`` on TEI), never from the message text."""

    def __init__(
        self, field: str, detail: str, index: int | None = None, message: str = ""
    ) -> None:
        self.field, self.detail, self.index = field, detail, index
        name = field if index is None else f"{field}[{index}]"
        super().__init__(message or f"{name} {detail}")

    def __reduce__(self) -> tuple:
        # Rebuilt from its own fields (Ray ships errors between processes by pickling them).
        return (type(self), (self.field, self.detail, self.index, str(self)))


class Mode(str, Enum):
    M0 = "M0"
    M1 = "M1"
    M2 = "M2"
    M3 = "M3"

    @property
    def uses_question(self) -> bool:
        return self in (Mode.M2, Mode.M3)

    @property
    def uses_reasoning(self) -> bool:
        return self in (Mode.M1, Mode.M3)

    @classmethod
    def for_fields(cls, *, question: bool, reasoning: bool) -> Mode:
        """The mode that reads exactly these optional fields."""
        if question:
            return cls.M3 if reasoning else cls.M2
        return cls.M1 if reasoning else cls.M0


MODE_ALIASES: dict[str, Mode] = {
    "base": Mode.M0,
    "reasoning": Mode.M1,
    "question": Mode.M2,
    "full": Mode.M3,
}


def parse_mode(value: str | Mode) -> Mode | str:
    """``"M0".."M3"``, an alias (``base``/``reasoning``/``question``/``full``) or ``"auto"``.

    Returns a :class:`Mode`, or the string ``"auto"``. Case-insensitive.
    """
    if isinstance(value, Mode):
        return value
    if not isinstance(value, str):
        raise ValueError(f"mode must be a string, got {type(value).__name__}")
    key = value.strip()
    if key.lower() == AUTO:
        return AUTO
    if key.upper() in Mode.__members__:
        return Mode[key.upper()]
    if key.lower() in MODE_ALIASES:
        return MODE_ALIASES[key.lower()]
    allowed = ", ".join([*Mode.__members__, *MODE_ALIASES, AUTO])
    raise ValueError(f"mode {value!r} is not one of: {allowed}")


def _present(text: str | None) -> str | None:
    if text is None:
        return None
    if not isinstance(text, str):
        raise ValueError(f"expected a string, got {type(text).__name__}")
    return text if text.strip() else None


@dataclass(frozen=True)
class AgentContext:
    """One agent search: the sub-query sent, and optionally the session's question and reasoning.

    ``question`` and ``reasoning`` are normalised so that an empty or whitespace-only value is
    ``None``. ``sub_query`` is required and must contain text. ``instruction``, when given,
    replaces the prompt's ``<Instruct>:`` line for this search (untrusted text like the fields;
    ``None``: the scorer's configured instruction, else the mode's default). No mode selects
    it: it is kept by :meth:`for_mode`.
    """

    sub_query: str
    question: str | None = None
    reasoning: str | None = None
    instruction: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.sub_query, str) or not self.sub_query.strip():
            raise FieldError("sub_query", "is missing or empty")
        for name in ("question", "reasoning", "instruction"):
            try:
                object.__setattr__(self, name, _present(getattr(self, name)))
            except ValueError as err:
                raise FieldError(name, str(err), message=f"{name}: {err}") from None

    @property
    def richest_mode(self) -> Mode:
        return Mode.for_fields(
            question=self.question is not None, reasoning=self.reasoning is not None
        )

    def resolve_mode(self, mode: str | Mode = AUTO) -> Mode:
        """The concrete mode for this context; a forced mode whose field is absent raises."""
        parsed = parse_mode(mode)
        if parsed == AUTO:
            return self.richest_mode
        if missing := self.missing_field(parsed):
            raise missing_field_error(parsed, missing)
        return parsed

    def missing_field(self, mode: Mode) -> str | None:
        """The first field ``mode`` reads that this context lacks (None: it has them all); the
        one check of "this mode needs that field" (callers name the field their own way)."""
        if mode.uses_question and self.question is None:
            return "question"
        if mode.uses_reasoning and self.reasoning is None:
            return "reasoning"
        return None

    def for_mode(self, mode: Mode) -> AgentContext:
        """This context restricted to the fields ``mode`` reads."""
        return AgentContext(
            self.sub_query,
            question=self.question if mode.uses_question else None,
            reasoning=self.reasoning if mode.uses_reasoning else None,
            instruction=self.instruction,
        )


def _uniform(seed: int, epoch: int, field: str, group_id: str) -> float:
    digest = hashlib.blake2b(f"{seed}|{epoch}|{field}|{group_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


@dataclass(frozen=True)
class FieldDropout:
    """Per-group context dropout for training (docs/architecture.md, section 5.3).

    Each optional field is dropped independently with its probability. The draw is a hash of
    (seed, epoch, field, group id), so a rerun repeats it exactly and no RNG state is shared
    between workers.
    """

    p_question: float = 0.5
    p_reasoning: float = 0.5
    seed: int = 0

    def keeps(self, field: str, group_id: str, epoch: int) -> bool:
        p = {"question": self.p_question, "reasoning": self.p_reasoning}[field]
        return _uniform(self.seed, epoch, field, str(group_id)) >= p

    def apply(self, context: AgentContext, group_id: str, epoch: int) -> AgentContext:
        """The context with dropped fields removed; ``richest_mode`` of the result is its mode."""
        return dataclasses.replace(
            context,
            question=context.question if self.keeps("question", group_id, epoch) else None,
            reasoning=context.reasoning if self.keeps("reasoning", group_id, epoch) else None,
        )


def missing_field_error(mode: Mode, field: str) -> FieldError:
    """``mode`` reads ``field``, which the search does not have."""
    message = f"mode {mode.value} needs the field {field!r}, which is missing"
    return FieldError(field, message, message=message)
