"""Helpers for the infra tests: repository paths, manifests, KubeRay CRD schemas, the Dockerfile.

The CRD schemas come from ``tests/fixtures/kuberay_crds`` (KubeRay v1.7.0, see its SOURCE.md). They
are applied the way the Kubernetes API server applies a structural schema under strict field
validation (``kubectl apply``'s default): an object with declared ``properties`` accepts no other
keys, ``nullable: true`` admits null, and ``x-kubernetes-list-map-keys`` lists have unique keys.
CEL rules (``x-kubernetes-validations``) are not evaluated.
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml
from jsonschema import Draft4Validator, ValidationError, validators

REPO = Path(__file__).resolve().parents[2]
INFRA = REPO / "infra"
KUBERAY = INFRA / "kuberay"
DOCKERFILE = INFRA / "docker" / "Dockerfile"
CRDS = REPO / "tests" / "fixtures" / "kuberay_crds"
CRD_FILES = {
    "RayCluster": "ray.io_rayclusters.yaml",
    "RayService": "ray.io_rayservices.yaml",
    "RayJob": "ray.io_rayjobs.yaml",
}
RAY_API_VERSION = "ray.io/v1"

_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_yaml_documents(path: Path) -> list[Any]:
    """Every non-empty document of a YAML file."""
    with open(path, encoding="utf-8") as f:
        return [doc for doc in yaml.load_all(f, Loader=_Loader) if doc is not None]


def manifest_documents() -> Iterator[tuple[str, dict[str, Any]]]:
    """(``file#index``, document) for every document under infra/kuberay."""
    for path in sorted(KUBERAY.glob("*.yaml")):
        for index, doc in enumerate(load_yaml_documents(path)):
            yield f"{path.name}#{index}", doc


def ray_manifests() -> dict[str, dict[str, Any]]:
    """The KubeRay documents (apiVersion ``ray.io/...``), keyed by ``file#index``."""
    return {
        key: doc
        for key, doc in manifest_documents()
        if str(doc.get("apiVersion", "")).startswith("ray.io/")
    }


def closed_schema(schema: Any) -> Any:
    """A copy of an OpenAPI v3 structural schema with Kubernetes' strictness made explicit."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    if "properties" in schema:
        out["properties"] = {name: closed_schema(sub) for name, sub in schema["properties"].items()}
        if "additionalProperties" not in schema and not schema.get(
            "x-kubernetes-preserve-unknown-fields"
        ):
            out["additionalProperties"] = False
    if isinstance(schema.get("additionalProperties"), dict):
        out["additionalProperties"] = closed_schema(schema["additionalProperties"])
    if "items" in schema:
        out["items"] = closed_schema(schema["items"])
    for keyword in ("anyOf", "allOf", "oneOf"):
        if keyword in schema:
            out[keyword] = [closed_schema(sub) for sub in schema[keyword]]
    if schema.get("nullable") is True and isinstance(schema.get("type"), str):
        out["type"] = [schema["type"], "null"]
    return out


def _unique_list_map_keys(validator, keys, instance, schema):
    if not isinstance(instance, list):
        return
    seen: dict[tuple, int] = {}
    for index, item in enumerate(instance):
        if not isinstance(item, dict):
            continue
        key = tuple(item.get(k) for k in keys)
        if key in seen:
            yield ValidationError(
                f"items {seen[key]} and {index} share the map key {dict(zip(keys, key))}"
            )
        seen[key] = index


KubernetesValidator = validators.extend(
    Draft4Validator, {"x-kubernetes-list-map-keys": _unique_list_map_keys}
)


def crd_schema(kind: str, version: str = "v1") -> dict[str, Any]:
    """The ``openAPIV3Schema`` of ``kind`` at ``version`` from the KubeRay CRD fixtures."""
    path = CRDS / CRD_FILES[kind]
    if not path.is_file():
        raise FileNotFoundError(f"KubeRay CRD for {kind} not found at {path}")
    (crd,) = load_yaml_documents(path)
    if crd["spec"]["names"]["kind"] != kind:
        raise ValueError(f"{path} defines {crd['spec']['names']['kind']}, not {kind}")
    for entry in crd["spec"]["versions"]:
        if entry["name"] == version:
            return entry["schema"]["openAPIV3Schema"]
    raise KeyError(f"{path} has no version {version!r}")


def format_error(error: ValidationError) -> str:
    where = ".".join(str(p) for p in error.absolute_path) or "<root>"
    return f"{where}: {error.message}"


def dockerfile_instructions(path: Path = DOCKERFILE) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, with line continuations joined and comments dropped."""
    instructions: list[tuple[str, str]] = []
    pending = ""
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue
        pending += line[:-1] + " " if line.endswith("\\") else line
        if not line.endswith("\\"):
            word, _, rest = pending.partition(" ")
            instructions.append((word.upper(), re.sub(r"\s+", " ", rest).strip()))
            pending = ""
    return instructions


def dockerfile_args(path: Path = DOCKERFILE) -> dict[str, str]:
    """Default values of the Dockerfile's ``ARG NAME=value`` lines."""
    args = {}
    for word, rest in dockerfile_instructions(path):
        if word == "ARG":
            name, _, default = rest.partition("=")
            args[name] = default
    return args


def load_infra_script(name: str) -> ModuleType:
    """Import ``infra/<name>.py`` (infra/ holds scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(f"infra_{name}", INFRA / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
