"""Several models behind one app: which checkpoint a request names, and what answered it.

A deployment is configured with a catalog of named checkpoints (:class:`ModelCatalog`; the
app args ``models`` and ``default_model``), for example a base model and two fine-tuned ones.
A request picks one by name: the Cohere body's ``model`` field, or Serve's routing header
``serve_multiplexed_model_id`` (which also lets the proxy send it to a replica that has the
model loaded already). Absent both, the default model answers. An unknown name is a 404
whose body lists the available names (:class:`UnknownModel`).

A deployment configured with a single ``model`` (no ``models``) is a catalog of one that is
not *strict*: the ``model`` field is accepted and ignored
(Cohere's SDK requires some value), and the one model answers every request.

The HTTP layer reaches the loaded models through a :class:`ModelRouter`: ``use(name)`` gives a
:class:`Served` (the model's :class:`RerankService`, its fitted fusion, name and version) and
keeps it from being unloaded until the request is done. The deployment's router loads on
demand with Serve's model multiplexing; :class:`StaticModels` holds models loaded already
(in-process apps and tests).
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from acare_ray.online.errors import ClientError
from acare_ray.online.service import RerankService, ScoringJob, is_local_path

# Serve's routing header (HTTP proxies may turn its underscores into hyphens).
MODEL_HEADER = "serve_multiplexed_model_id"
MODEL_HEADERS = (MODEL_HEADER, MODEL_HEADER.replace("_", "-"))
# Names travel in response headers (x-acare-model) and Serve's routing header.
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,127}$")
VERSION_CHARS = 16
# Weight files above this are fingerprinted by size and modification time, not read again.
HASHED_FILE_BYTES = 64 * 2**20


def short_model_name(model: str) -> str:
    """The name clients see for a model given as ``model``: a Hub id or alias as it is; a
    local folder by its own name, so no server path reaches a response. A trainer's generic folder names (``final``, ``best``,
    ``checkpoint_*``) keep their run folder: ``<run>/final``. Characters a name may not carry
    become ``-``."""
    if not is_local_path(model):
        return model
    path = Path(model).expanduser().resolve()
    name = path.name
    if (name.startswith("checkpoint") or name in ("final", "best", "last")) and path.parent.name:
        name = f"{path.parent.name}/{name}"
    name = re.sub(r"[^A-Za-z0-9._:/@+-]", "-", name).lstrip("._:/@+-")[:128]
    return name or "model"


class UnknownModel(ClientError):
    """A request named a model the deployment does not serve (404); lists the ones it does."""

    def __init__(self, requested: str, available: tuple[str, ...]) -> None:
        super().__init__(
            404, "model", f"unknown model {requested!r}; available: {', '.join(available)}"
        )
        self.available = available

    def body(self) -> dict[str, Any]:
        return {"available": list(self.available)}


@dataclass(frozen=True)
class ModelSource:
    """Where a named model comes from: a Hugging Face id or a checkpoint directory, and for a
    Hub id the commit (or tag) to load (None: the default branch; a directory ignores it)."""

    model: str
    revision: str | None = None


@dataclass(frozen=True)
class ModelCatalog:
    """The models a deployment serves, by name, and the one a request without a name gets.

    ``strict``: a request that names a model must name one of these (404 otherwise); a
    single-model deployment is not strict (the name is ignored, as it always was)."""

    sources: Mapping[str, ModelSource]
    default: str
    strict: bool = True

    def __post_init__(self) -> None:
        if self.default not in self.sources:
            raise ValueError(
                f"default_model: {self.default!r} is not one of models ({', '.join(self.sources)})"
            )

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.sources)

    def name_for(self, body: str | None = None, header: str | None = None) -> str:
        """The name of the model to answer a request whose body named ``body`` and whose
        routing header named ``header`` (either may be None); raises :class:`ClientError`."""
        if not self.strict:
            return self.default
        if body is not None and header is not None and body != header:
            raise ClientError(
                400,
                "model",
                f"the body names {body!r} but the {MODEL_HEADER} header names {header!r}",
            )
        requested = body if body is not None else header
        if requested is None:
            return self.default
        if requested not in self.sources:
            raise UnknownModel(requested, self.names)
        return requested


def header_model(headers: Mapping[str, str]) -> str | None:
    """The model a request's routing header names (None when it has none or it is empty)."""
    for name in MODEL_HEADERS:
        value = headers.get(name)
        if value:
            return value
    return None


ScoreFn = Callable[[ScoringJob, str], Awaitable[Any]]


@dataclass
class Served:
    """One loaded model as a request uses it. ``score``: how to score a job on this model
    (None: it cannot be scored, a model card only); ``version``: the Hub revision, or a fingerprint of the
    checkpoint directory's files (None for an unpinned Hub id)."""

    name: str
    service: RerankService
    fitted_fusion: Any = None
    version: str | None = None
    score: ScoreFn | None = None
    source: ModelSource | None = field(default=None)


class ModelRouter(Protocol):
    """What the HTTP layer needs of the served models."""

    catalog: ModelCatalog

    def use(self, name: str) -> Any:
        """An async context manager giving the :class:`Served` model ``name`` (loading it if
        need be) and keeping it loaded until the context exits."""

    def cards(self) -> list[dict[str, Any]]:
        """What ``GET /v1/models`` says about each model, catalog order."""


def model_card(
    name: str,
    source: ModelSource | None,
    described: dict[str, Any] | None,
    version: str | None,
    default: bool,
) -> dict[str, Any]:
    """One model's entry in ``/v1/models``: ``described`` (its :meth:`RerankService.describe`
    card) when it is or was loaded on this replica, else what the catalog knows."""
    card: dict[str, Any] = {"id": name}
    if described is not None:
        card |= described | {"id": name}
    elif source is not None and not is_local_path(source.model):
        card["source"] = source.model  # a Hub id; a local path stays behind /v1/status
    if version is not None:
        card["version"] = version
    if source is not None and source.revision is not None:
        card["revision"] = source.revision
    card["default"] = default
    return card


class StaticModels:
    """A router over models that are loaded already (nothing is loaded or unloaded)."""

    def __init__(self, models: Mapping[str, Served], catalog: ModelCatalog) -> None:
        missing = set(catalog.names) - set(models)
        if missing:
            raise ValueError(f"no loaded model for {sorted(missing)}")
        self.models = dict(models)
        self.catalog = catalog

    @classmethod
    def single(
        cls, service: RerankService, fitted_fusion: Any = None, score: ScoreFn | None = None
    ) -> StaticModels:
        """The one model of an app built around one :class:`RerankService` (not strict),
        scored by ``score``."""
        name = service.model_name
        served = Served(name, service, fitted_fusion, None, score=score)
        source = ModelSource(service.scorer.source or name)
        return cls({name: served}, ModelCatalog({name: source}, name, strict=False))

    @asynccontextmanager
    async def use(self, name: str) -> AsyncIterator[Served]:
        yield self.models[name]

    def cards(self) -> list[dict[str, Any]]:
        if not self.catalog.strict:  # one model: the card it always had
            (served,) = self.models.values()
            return [served.service.describe()]
        return [
            model_card(
                n,
                self.catalog.sources[n],
                self.models[n].service.describe(),
                self.models[n].version,
                n == self.catalog.default,
            )
            for n in self.catalog.names
        ]


def checkpoint_version(source: ModelSource) -> str | None:
    """A version label for what ``source`` loads: its revision; for a checkpoint directory a
    fingerprint of its files (names; contents, or size and modification time for files over
    :data:`HASHED_FILE_BYTES`), so a retrained or refitted checkpoint written to the same path
    gets a new label; None for a Hub id without a revision."""
    if source.revision is not None and not Path(source.model).is_dir():
        return source.revision
    root = Path(source.model)
    if not root.is_dir():
        return None
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        digest.update(os.fsencode(path.relative_to(root)) + b"\0")
        stat = path.stat()
        if stat.st_size > HASHED_FILE_BYTES:
            digest.update(f"{stat.st_size}:{stat.st_mtime_ns}".encode())
        else:
            digest.update(path.read_bytes())
        digest.update(b"\0")
    return "sha256:" + digest.hexdigest()[:VERSION_CHARS]
