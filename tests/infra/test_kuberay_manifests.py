"""The KubeRay manifests validate against the real CRD schemas and hang together as a cluster."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from infra_support import (
    KUBERAY,
    dockerfile_args,
    load_yaml_documents,
    manifest_documents,
    ray_manifests,
)

EXPECTED = {
    "raycluster.yaml": "RayCluster",
    "rayservice.yaml": "RayService",
    "rayjob-rerank.yaml": "RayJob",
    "rayjob-relabel.yaml": "RayJob",
    "rayjob-eval.yaml": "RayJob",
    "rayjob-train.yaml": "RayJob",
}
OTHER_KINDS = {"PersistentVolumeClaim", "NetworkPolicy"}
DNS_1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
RAY_MANIFESTS = ray_manifests()


def cluster_specs(doc: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The RayCluster specs a document defines (none for a RayJob using clusterSelector)."""
    spec = doc["spec"]
    if doc["kind"] == "RayCluster":
        yield spec
    elif doc["kind"] == "RayService":
        yield spec["rayClusterConfig"]
    elif doc["kind"] == "RayJob" and "rayClusterSpec" in spec:
        yield spec["rayClusterSpec"]


def pod_specs(cluster: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    yield "head", cluster["headGroupSpec"]["template"]["spec"]
    for group in cluster.get("workerGroupSpecs", []):
        yield group["groupName"], group["template"]["spec"]


def all_pod_specs() -> Iterator[tuple[str, dict[str, Any]]]:
    for key, doc in RAY_MANIFESTS.items():
        for cluster in cluster_specs(doc):
            for group, pod in pod_specs(cluster):
                yield f"{key}:{group}", pod


def gpu_limit(pod: dict[str, Any]) -> int:
    return sum(
        int(c.get("resources", {}).get("limits", {}).get("nvidia.com/gpu", 0))
        for c in pod["containers"]
    )


def only_doc(name: str) -> dict[str, Any]:
    (doc,) = load_yaml_documents(KUBERAY / name)
    return doc


def test_every_expected_manifest_exists_with_its_kind():
    kinds = {key.split("#")[0]: doc["kind"] for key, doc in RAY_MANIFESTS.items()}
    assert kinds == EXPECTED


@pytest.mark.parametrize("key", sorted(RAY_MANIFESTS))
def test_manifest_validates_against_the_kuberay_v1_crd(key, crd_errors):
    assert crd_errors(RAY_MANIFESTS[key]) == []


def test_other_documents_are_known_core_kinds():
    others = {key: doc["kind"] for key, doc in manifest_documents() if key not in RAY_MANIFESTS}
    assert set(others.values()) <= OTHER_KINDS, others


@pytest.mark.parametrize(
    "mutate, expected",
    [
        (lambda s: s["workerGroupSpecs"][0].update(maxReplica=8), "'maxReplica' was unexpected"),
        (lambda s: s["workerGroupSpecs"][0].update(minReplicas="one"), "is not of type 'integer'"),
        (lambda s: s["workerGroupSpecs"][0].pop("groupName"), "'groupName' is a required"),
        (lambda s: s["autoscalerOptions"].update(upscalingMode="Fast"), "is not one of"),
        (lambda s: s.update(enableInTreeAutoscaling="yes"), "is not of type 'boolean'"),
        (
            lambda s: s["headGroupSpec"]["template"]["spec"]["containers"][0]["env"].append(
                {"name": "HF_HOME", "value": "/tmp"}
            ),
            "share the map key",
        ),
        (
            lambda s: s["headGroupSpec"]["template"]["spec"]["containers"][0]["resources"].update(
                limit={"cpu": "1"}
            ),
            "'limit' was unexpected",
        ),
        (
            lambda s: s["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["resources"][
                "limits"
            ].update(memory="lots"),
            "does not match",
        ),
    ],
    ids=[
        "misspelt-field",
        "wrong-type",
        "missing-required",
        "bad-enum",
        "bool-as-string",
        "duplicate-env",
        "pod-field-typo",
        "bad-quantity",
    ],
)
def test_broken_raycluster_fails_validation(raycluster, crd_errors, mutate, expected):
    mutate(raycluster["spec"])
    errors = crd_errors(raycluster)
    assert any(expected in e for e in errors), errors


def test_manifest_with_wrong_api_version_is_rejected(raycluster, crd_errors):
    raycluster["apiVersion"] = "ray.io/v1alpha1"
    assert crd_errors(raycluster) and "apiVersion" in crd_errors(raycluster)[0]


@pytest.mark.parametrize("key", sorted(RAY_MANIFESTS))
def test_resource_names_are_dns_labels(key):
    name = RAY_MANIFESTS[key]["metadata"]["name"]
    assert DNS_1035_LABEL.match(name), f"{key}: metadata.name {name!r} is not a DNS-1035 label"


def test_raycluster_has_a_cpu_head_and_an_autoscaling_gpu_group():
    spec = only_doc("raycluster.yaml")["spec"]
    assert spec["enableInTreeAutoscaling"] is True
    head = spec["headGroupSpec"]
    assert gpu_limit(head["template"]["spec"]) == 0
    assert head["rayStartParams"].get("num-cpus") == "0", "head should take no tasks or actors"
    gpu_groups = [g for g in spec["workerGroupSpecs"] if gpu_limit(g["template"]["spec"]) > 0]
    assert gpu_groups, "no worker group requests nvidia.com/gpu"
    for group in gpu_groups:
        assert group["minReplicas"] < group["maxReplicas"], group["groupName"]


@pytest.mark.parametrize("key", sorted(RAY_MANIFESTS))
def test_worker_groups_start_within_their_replica_bounds(key):
    for cluster in cluster_specs(RAY_MANIFESTS[key]):
        for group in cluster.get("workerGroupSpecs", []):
            low, high = group["minReplicas"], group["maxReplicas"]
            assert 0 <= low <= group.get("replicas", low) <= high, f"{key}:{group['groupName']}"


def test_gpu_requests_equal_gpu_limits():
    # Kubernetes rejects extended resources whose request differs from the limit.
    for where, pod in all_pod_specs():
        for container in pod["containers"]:
            resources = container.get("resources", {})
            limit = resources.get("limits", {}).get("nvidia.com/gpu")
            request = resources.get("requests", {}).get("nvidia.com/gpu", limit)
            assert str(request) == str(limit), f"{where}/{container['name']}"


def test_every_volume_mount_and_claim_is_defined():
    claims = {doc["metadata"]["name"] for doc in load_yaml_documents(KUBERAY / "storage.yaml")}
    for where, pod in all_pod_specs():
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        for container in pod["containers"]:
            for mount in container.get("volumeMounts", []):
                assert mount["name"] in volumes, f"{where}: mount {mount['name']!r} has no volume"
        for volume in volumes.values():
            if "persistentVolumeClaim" in volume:
                claim = volume["persistentVolumeClaim"]["claimName"]
                assert claim in claims, f"{where}: claim {claim!r} not in storage.yaml"


def test_all_ray_pods_run_one_image_at_the_dockerfile_ray_version():
    images = {c["image"] for _, pod in all_pod_specs() for c in pod["containers"]}
    assert len(images) == 1, images
    versions = {
        key: cluster["rayVersion"]
        for key, doc in RAY_MANIFESTS.items()
        for cluster in cluster_specs(doc)
    }
    assert set(versions.values()) == {dockerfile_args()["RAY_VERSION"]}, versions


def test_rayservice_cluster_mirrors_the_raycluster_head_and_gpu_group():
    cluster = only_doc("raycluster.yaml")["spec"]
    service = only_doc("rayservice.yaml")["spec"]["rayClusterConfig"]
    assert service["headGroupSpec"] == cluster["headGroupSpec"]
    groups = {g["groupName"]: g for g in cluster["workerGroupSpecs"]}
    for group in service["workerGroupSpecs"]:
        assert group["groupName"] in groups, group["groupName"]
        assert group["template"] == groups[group["groupName"]]["template"], group["groupName"]


@pytest.mark.parametrize("name", sorted(n for n in EXPECTED if n.startswith("rayjob-")))
def test_rayjobs_run_on_the_raycluster(name):
    spec = only_doc(name)["spec"]
    cluster_name = only_doc("raycluster.yaml")["metadata"]["name"]
    assert spec.get("clusterSelector") == {"ray.io/cluster": cluster_name}
    assert "rayClusterSpec" not in spec
