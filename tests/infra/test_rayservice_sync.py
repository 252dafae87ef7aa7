"""The RayService serves exactly serve_configs/gpu.yaml, which Ray's own Serve schema accepts."""

from __future__ import annotations

import importlib
import math
import subprocess
import sys
from typing import Any

import pytest
import yaml
from infra_support import INFRA, KUBERAY, REPO, load_infra_script, load_yaml_documents
from ray.serve.schema import ServeDeploySchema

GPU_CONFIG = REPO / "serve_configs" / "gpu.yaml"
SYNC = INFRA / "sync_rayservice.py"
sync = load_infra_script("sync_rayservice")


def rayservice() -> dict[str, Any]:
    (doc,) = load_yaml_documents(KUBERAY / "rayservice.yaml")
    return doc


def embedded_config() -> dict[str, Any]:
    return yaml.safe_load(rayservice()["spec"]["serveConfigV2"])


def gpu_config() -> dict[str, Any]:
    assert GPU_CONFIG.is_file(), f"{GPU_CONFIG.relative_to(REPO)} is missing"
    return yaml.safe_load(GPU_CONFIG.read_text(encoding="utf-8"))


def run_sync(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SYNC), *args], capture_output=True, text=True, timeout=60
    )


def test_serve_config_v2_equals_gpu_yaml():
    assert embedded_config() == gpu_config()


def test_sync_check_passes_on_the_committed_files():
    result = run_sync("--check")
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("source", ["serve_configs/gpu.yaml", "rayservice.serveConfigV2"])
def test_serve_config_validates_against_ray_serve_deploy_schema(source):
    config = gpu_config() if source.endswith(".yaml") else embedded_config()
    schema = ServeDeploySchema.model_validate(config)
    assert schema.applications, f"{source} deploys no application"


@pytest.mark.parametrize(
    "mutate",
    [
        lambda c: c["applications"].append(dict(c["applications"][0])),
        lambda c: c.update(applications=[{"name": "x"}]),
        lambda c: c.pop("applications"),
    ],
    ids=["duplicate-application", "no-import-path", "no-applications"],
)
def test_broken_serve_config_fails_the_serve_schema(mutate):
    config = gpu_config()
    mutate(config)
    with pytest.raises(ValueError):
        ServeDeploySchema.model_validate(config)


def test_serve_import_paths_resolve_to_callables():
    for app in gpu_config()["applications"]:
        module, _, attribute = app["import_path"].partition(":")
        target = getattr(importlib.import_module(module), attribute)
        assert callable(target) or hasattr(target, "deployments"), app["import_path"]


def test_gpu_group_holds_every_serve_replica_at_max_scale():
    cluster = rayservice()["spec"]["rayClusterConfig"]
    groups = [
        (g["maxReplicas"], int(c["resources"]["limits"].get("nvidia.com/gpu", 0)))
        for g in cluster["workerGroupSpecs"]
        for c in g["template"]["spec"]["containers"]
    ]
    per_pod = max(gpus for _, gpus in groups)
    capacity = sum(replicas * gpus for replicas, gpus in groups)
    needed = 0.0
    for app in gpu_config()["applications"]:
        for deployment in app.get("deployments", []):
            gpus = deployment.get("ray_actor_options", {}).get("num_gpus", 0)
            if not gpus:
                continue
            assert gpus <= per_pod, f"{deployment['name']}: num_gpus {gpus} > {per_pod} per pod"
            autoscaling = deployment.get("autoscaling_config") or {}
            replicas = autoscaling.get("max_replicas", deployment.get("num_replicas", 1))
            needed += gpus * replicas
    assert needed > 0, "no Serve deployment asks for a GPU in serve_configs/gpu.yaml"
    assert math.ceil(needed) <= capacity, f"Serve may need {needed} GPUs, cluster has {capacity}"


SMALL_CONFIG = """\
# a comment travels with the config
applications:
  - name: app
    import_path: mod:app

    route_prefix: /
"""
MANIFEST = """\
apiVersion: ray.io/v1
kind: RayService
metadata:
  name: x
spec:
  serveConfigV2: |
    applications: []

  rayClusterConfig:
    headGroupSpec: {}
"""


def test_render_replaces_only_the_block():
    rendered = sync.render(MANIFEST, SMALL_CONFIG)
    assert yaml.safe_load(yaml.safe_load(rendered)["spec"]["serveConfigV2"]) == yaml.safe_load(
        SMALL_CONFIG
    )
    before, after = MANIFEST.split("  serveConfigV2: |\n    applications: []\n")
    assert rendered.startswith(before) and rendered.endswith(after)
    assert sync.render(rendered, SMALL_CONFIG) == rendered


def test_check_fails_on_a_stale_block_and_sync_repairs_it(tmp_path):
    config, manifest = tmp_path / "gpu.yaml", tmp_path / "rayservice.yaml"
    config.write_text(SMALL_CONFIG)
    manifest.write_text(MANIFEST)
    paths = ("--serve-config", str(config), "--rayservice", str(manifest))

    stale = run_sync("--check", *paths)
    assert stale.returncode == 1 and "serveConfigV2 differs" in stale.stderr
    assert manifest.read_text() == MANIFEST, "--check must not write"

    assert run_sync(*paths).returncode == 0
    assert run_sync("--check", *paths).returncode == 0

    config.write_text(SMALL_CONFIG.replace("route_prefix: /", "route_prefix: /v2"))
    assert run_sync("--check", *paths).returncode == 1


def test_manifest_without_a_literal_block_is_an_error(tmp_path):
    config, manifest = tmp_path / "gpu.yaml", tmp_path / "rayservice.yaml"
    config.write_text(SMALL_CONFIG)
    manifest.write_text(MANIFEST.replace("serveConfigV2: |", "serveConfigV2: >"))
    result = run_sync("--check", "--serve-config", str(config), "--rayservice", str(manifest))
    assert result.returncode == 2 and "serveConfigV2: |" in result.stderr
