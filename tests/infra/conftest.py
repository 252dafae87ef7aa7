"""Fixtures for the infra tests (helpers live in infra_support.py)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
from infra_support import (
    CRD_FILES,
    KUBERAY,
    RAY_API_VERSION,
    KubernetesValidator,
    closed_schema,
    crd_schema,
    format_error,
    load_yaml_documents,
)


@pytest.fixture(scope="session")
def crd_errors() -> Callable[[dict[str, Any]], list[str]]:
    """``crd_errors(doc)``: every schema violation of a ray.io/v1 document, as ``path: message``."""
    cache: dict[str, Any] = {}

    def errors(doc: dict[str, Any]) -> list[str]:
        kind = doc.get("kind")
        if kind not in CRD_FILES:
            return [f"kind: {kind!r} is not one of {sorted(CRD_FILES)}"]
        if doc.get("apiVersion") != RAY_API_VERSION:
            return [f"apiVersion: {doc.get('apiVersion')!r}, expected {RAY_API_VERSION!r}"]
        if kind not in cache:
            cache[kind] = KubernetesValidator(closed_schema(crd_schema(kind)))
        found = sorted(cache[kind].iter_errors(doc), key=lambda e: list(e.absolute_path))
        return [format_error(e) for e in found]

    return errors


@pytest.fixture
def raycluster() -> dict[str, Any]:
    """A private copy of the RayCluster manifest, free to mutate."""
    (doc,) = load_yaml_documents(KUBERAY / "raycluster.yaml")
    return copy.deepcopy(doc)
