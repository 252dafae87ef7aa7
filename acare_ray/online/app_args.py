"""The Serve app's arguments (``args:`` of a Serve config, ``key=value`` on ``serve run``) and
each replica's runtime settings (``user_config``): what :mod:`acare_ray.online.deployment`
builds the app from. No Ray here beyond what the models' validation needs."""

import json
import os
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, InstanceOf, field_validator, model_validator

from acare_ray.online.http import parse_keys
from acare_ray.online.models import (
    NAME_PATTERN,
    ModelCatalog,
    ModelSource,
    short_model_name,
)
from acare_ray.scoring import DEFAULT_MODEL, ScorerSettings

DEFAULT_MAX_BATCH_SIZE = 8
DEFAULT_BATCH_WAIT_TIMEOUT_S = 0.005
DEFAULT_MAX_BATCH_TOKENS = 65536
# Below both configs' proxy request_timeout_s (60 s on GPU, 120 s on CPU) with room for the
# request's own scoring and for throughput estimates that are off.
DEFAULT_ADMISSION_DEADLINE_S = 10.0
# Until a batch is measured: below what one loaded CPU core scoring MiniLM does (docs/speed.md).
DEFAULT_ADMISSION_PRIOR_TOKENS_PER_S = 2000.0
DEFAULT_CLIENT_SHARE = 0.5
# Below the GPU config's proxy request_timeout_s (60 s).
DEFAULT_REQUEST_DEADLINE_S = 55.0
DEFAULT_MAX_RESIDENT_MODELS = 2


class ModelChoice(BaseModel):
    """One entry of ``models``: a Hugging Face id or checkpoint directory (a plain string is
    the same as ``{model: ...}``), and for a Hub id the commit to load."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    model: str = Field(min_length=1, description="Hugging Face id or checkpoint directory.")
    revision: str | None = Field(None, description="Hub commit (or tag); None: default branch.")


class AppArgs(BaseModel):
    """Application arguments (``args:`` in a Serve config, ``key=value`` on ``serve run``)."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    model: str = Field(DEFAULT_MODEL, description="Hugging Face id or checkpoint directory.")
    revision: str | None = Field(
        None, description="Hub commit (or tag) of the model; None: the default branch."
    )
    served_model_name: str | None = Field(
        None,
        description="Name reported by the API; default: a Hub id as given, a checkpoint "
        "folder by its own name (never a server path).",
    )
    scorer: InstanceOf[ScorerSettings] = Field(
        default_factory=ScorerSettings,
        description="How every served model is loaded and run (acare_ray.scoring.ScorerSettings, "
        "the same section as the offline jobs' and the trainer's): device, dtype, backend, "
        "max_length, max_batch_tokens (padded tokens per forward pass), pack_searches, ...",
    )
    max_documents: int = Field(1000, ge=1, description="Documents per request (more: 413).")
    max_body_bytes: int = Field(16 * 2**20, ge=1024, description="Request body limit (413).")
    auto_truncate: bool = Field(True, description="Cut documents that do not fit (else 413).")
    max_request_tokens: int = Field(
        1_048_576,
        ge=1,
        description="Upper bound of one request's tokens (from its bytes, before tokenizing; "
        "more: 413).",
    )
    body_read_timeout_s: float = Field(
        30.0, gt=0, description="Time a client gets to send the whole body (else 408)."
    )
    api_key_env: str | None = Field(
        "ACARE_API_KEY",
        description="Environment variable holding the bearer key(s), comma or newline "
        "separated, whitespace stripped.",
    )
    search: dict[str, Any] | None = Field(
        None,
        description="POST /v1/search: a first stage and session bounds "
        "(acare_ray.online.search_routes.SearchSettings); None: no search routes.",
    )
    allow_unauthenticated: bool = Field(
        False,
        description="Serve without a key when api_key_env is unset, missing or empty; without "
        "it such a replica refuses to start.",
    )
    models: dict[str, ModelChoice] | None = Field(
        None,
        description="Several models by name (instead of model/revision/served_model_name); a "
        "request picks one with its `model` field or the serve_multiplexed_model_id header.",
    )
    default_model: str | None = Field(
        None, description="The name in models a request without one gets (default: the first)."
    )
    max_resident_models: int = Field(
        DEFAULT_MAX_RESIDENT_MODELS,
        ge=1,
        description="Models loaded at once per replica (least recently used unloaded first).",
    )

    @field_validator("scorer", mode="before")
    @classmethod
    def _scorer_section(cls, value: Any) -> ScorerSettings:
        if isinstance(value, str):  # serve run's key=value: scorer='{"device": "cpu"}'
            try:
                value = json.loads(value)
            except json.JSONDecodeError as err:
                raise ValueError(f"scorer: not a JSON object ({err})") from None
        return ScorerSettings.parse(value)

    @field_validator("models", mode="before")
    @classmethod
    def _plain_paths(cls, value: Any) -> Any:
        if isinstance(value, dict):
            return {k: {"model": v} if isinstance(v, str) else v for k, v in value.items()}
        return value

    @model_validator(mode="after")
    def _one_way_to_name_models(self) -> "AppArgs":
        if self.models is None:
            if self.default_model is not None:
                raise ValueError("default_model: only with models")
            return self
        if not self.models:
            raise ValueError("models: give at least one model")
        for name in self.models:
            if not NAME_PATTERN.match(name):
                raise ValueError(
                    f"models: the name {name!r} must be 1-128 letters, digits or ._:/@+- "
                    "(it travels in HTTP headers)"
                )
        single = ("model", "revision", "served_model_name")
        given = [f for f in single if getattr(self, f) != AppArgs.model_fields[f].default]
        if given:
            raise ValueError(
                f"{given[0]}: give either model (one model) or models (several), not both; "
                "each entry of models has its own model and revision"
            )
        if self.default_model is not None and self.default_model not in self.models:
            raise ValueError(
                f"default_model: {self.default_model!r} is not one of models "
                f"({', '.join(self.models)})"
            )
        return self

    def catalog(self) -> ModelCatalog:
        """The models this app serves; a single ``model`` is a catalog of one that ignores
        the request's model name, as it always did."""
        if self.models is None:
            name = self.served_model_name or short_model_name(self.model)
            return ModelCatalog({name: ModelSource(self.model, self.revision)}, name, strict=False)
        sources = {n: ModelSource(c.model, c.revision) for n, c in self.models.items()}
        return ModelCatalog(sources, self.default_model or next(iter(sources)))

    def api_keys(self) -> tuple[str, ...]:
        """The configured keys; raises if there are none and serving open was not chosen."""
        keys = parse_keys(os.environ.get(self.api_key_env, "")) if self.api_key_env else ()
        if not keys and not self.allow_unauthenticated:
            where = (
                f"environment variable {self.api_key_env} is missing or empty"
                if self.api_key_env
                else "api_key_env is not set"
            )
            raise ValueError(
                f"no API key: {where}. Set the key (e.g. from a Kubernetes secret), or set "
                "allow_unauthenticated: true in the application args to serve without auth."
            )
        return keys


BATCH_FIELDS = ("max_batch_size", "batch_wait_timeout_s", "max_batch_tokens")


class ReplicaSettings(BaseModel):
    """Runtime knobs, batching and admission: the deployment's ``user_config``."""

    model_config = ConfigDict(extra="forbid")

    max_batch_size: int = Field(DEFAULT_MAX_BATCH_SIZE, ge=1, description="Requests per batch.")
    batch_wait_timeout_s: float = Field(DEFAULT_BATCH_WAIT_TIMEOUT_S, ge=0)
    max_batch_tokens: int = Field(DEFAULT_MAX_BATCH_TOKENS, ge=1, description="Tokens per batch.")
    admission_deadline_s: float = Field(
        DEFAULT_ADMISSION_DEADLINE_S,
        gt=0,
        description="Refuse (503) a request the work queued ahead would start later than this; "
        "keep it well below the proxy's request_timeout_s.",
    )
    admission_prior_tokens_per_s: float = Field(
        DEFAULT_ADMISSION_PRIOR_TOKENS_PER_S,
        gt=0,
        description="Throughput assumed until the first batch is measured (err low).",
    )
    admission_measure_at_start: bool = Field(
        True,
        description="At start, score one synthetic request (after one untimed warm-up) and take "
        "its throughput as the first measured batch, so a new replica does not refuse work on "
        "the prior; false: the prior until the first real batch.",
    )
    client_share: float = Field(
        DEFAULT_CLIENT_SHARE,
        gt=0,
        le=1,
        description="Share of the admission deadline's work one client (API key) may hold "
        "queued; beyond it 429 (1: no per-client limit).",
    )
    request_deadline_s: float = Field(
        DEFAULT_REQUEST_DEADLINE_S,
        gt=0,
        description="No request runs longer (504, its work cancelled), whatever timeout "
        "headers the client sent; keep it at most the proxy's request_timeout_s.",
    )

    def batching(self) -> dict[str, Any]:
        return self.model_dump(include=set(BATCH_FIELDS))
