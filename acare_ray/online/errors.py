"""The one error type of a refused request in the Serve app: the HTTP status and the request
field at fault. The retrievers (:mod:`acare_ray.search`) raise their own
:class:`~acare_ray.search.first_stage.UpstreamError`, which the search route answers as 502."""

from __future__ import annotations

# Error messages may quote client input (a mode name, an exception text): never echo more.
MAX_MESSAGE_CHARS = 300


def bounded(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """``text`` cut to ``limit`` characters (marked with an ellipsis) and made valid UTF-8."""
    text = text.encode("utf-8", "replace").decode("utf-8")
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


class ClientError(Exception):
    """A request the server refuses: ``status`` (HTTP code), ``field`` (request field at fault).

    The message is bounded (:data:`MAX_MESSAGE_CHARS`) whatever input it quotes."""

    def __init__(self, status: int, field: str, message: str) -> None:
        field = bounded(field, 100)
        self.status = status
        self.field = field
        self.message = bounded(f"{field}: {message}")
        super().__init__(self.message)
