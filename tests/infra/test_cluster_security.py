"""The KubeRay manifests close the cluster (issue 21, part 2).

Before the fix the RayCluster and the RayService ran without ``authOptions`` (a fresh pod has no
token file, so Ray's token auth stayed off), the head exposed the Ray Client port, no
NetworkPolicy limited who reaches the GCS and the dashboard (whoever reached port 8265 could
submit a job: code execution on the GPU nodes), and the API key Secret was ``optional: true``
(no Secret: the API served without auth). Each test below fails on those manifests.

The core kinds (NetworkPolicy, PersistentVolumeClaim) are validated with the Kubernetes JSON
schemas of the ``kubernetes-validate`` package (strict: unknown fields are errors). Who may
connect is checked by evaluating the NetworkPolicies with Kubernetes' rules (a pod selected by
an Ingress policy accepts a connection only if some rule of a selecting policy allows it).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import kubernetes_validate
import pytest
import yaml
from infra_support import KUBERAY, REPO, load_yaml_documents, manifest_documents, ray_manifests

from acare_ray.online.app_args import AppArgs

RAY_MANIFESTS = ray_manifests()
CLUSTERS = {
    key: doc["spec"] if doc["kind"] == "RayCluster" else doc["spec"]["rayClusterConfig"]
    for key, doc in RAY_MANIFESTS.items()
    if doc["kind"] in ("RayCluster", "RayService")
}
POLICIES = [doc for _, doc in manifest_documents() if doc["kind"] == "NetworkPolicy"]
K8S_VERSIONS = ("1.30.0", kubernetes_validate.latest_version())
RAY_NAMESPACE = {"kubernetes.io/metadata.name": "acare"}
OPERATOR_NAMESPACE = {"kubernetes.io/metadata.name": "kuberay-system"}
MONITORING_NAMESPACE = {"kubernetes.io/metadata.name": "monitoring"}
# Ports Ray listens on besides the named ones (raylet, object manager, dashboard agent, a worker).
RAY_INTERNAL_PORTS = (6379, 8265, 10001, 52365, 8076, 10002)


def only_doc(name: str) -> dict[str, Any]:
    (doc,) = load_yaml_documents(KUBERAY / name)
    return doc


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize(
    "key", [k for k, d in manifest_documents() if not d["apiVersion"].startswith("ray.io/")]
)
def test_core_manifests_validate_against_the_kubernetes_schema(key, version):
    doc = dict(manifest_documents())[key]
    kubernetes_validate.validate(doc, version, strict=True)


def test_a_broken_network_policy_fails_schema_validation():
    broken = yaml.safe_load(yaml.safe_dump(POLICIES[0]))
    broken["spec"]["ingress"][0]["form"] = broken["spec"]["ingress"][0].pop("from")
    with pytest.raises(kubernetes_validate.ValidationError, match="form"):
        kubernetes_validate.validate(broken, K8S_VERSIONS[-1], strict=True)


@pytest.mark.parametrize("key", sorted(CLUSTERS))
def test_token_auth_is_on(key):
    assert CLUSTERS[key].get("authOptions", {}).get("mode") == "token", key


def head_container(cluster: dict[str, Any]) -> dict[str, Any]:
    return cluster["headGroupSpec"]["template"]["spec"]["containers"][0]


@pytest.mark.parametrize("key", sorted(CLUSTERS))
def test_services_stay_in_the_cluster_and_only_the_serve_port_faces_clients(key):
    """KubeRay builds the head Service from the head container's ports and the Serve Service
    from those named ``serve``/``serve-*``; both take ``headGroupSpec.serviceType``."""
    cluster = CLUSTERS[key]
    assert cluster["headGroupSpec"].get("serviceType", "ClusterIP") == "ClusterIP"
    doc = RAY_MANIFESTS[key]
    for custom in (cluster["headGroupSpec"].get("headService"), doc["spec"].get("serveService")):
        assert custom is None or custom.get("spec", {}).get("type", "ClusterIP") == "ClusterIP"
    ports = {p["name"]: p["containerPort"] for p in head_container(cluster)["ports"]}
    serve = {n: p for n, p in ports.items() if n == "serve" or n.startswith("serve-")}
    assert serve == {"serve": 8000}, ports
    assert 10001 not in ports.values(), "the Ray Client port is not used: do not expose it"


def pod_labels(cluster: dict[str, Any]) -> Iterator[tuple[str, dict[str, str]]]:
    """Each pod's labels as KubeRay sets them: the template's plus ray.io/node-type."""
    head = cluster["headGroupSpec"]["template"].get("metadata", {}).get("labels", {})
    yield "head", {**head, "ray.io/node-type": "head", "ray.io/is-ray-node": "yes"}
    for group in cluster.get("workerGroupSpecs", []):
        labels = group["template"].get("metadata", {}).get("labels", {})
        yield (
            group["groupName"],
            {**labels, "ray.io/node-type": "worker", "ray.io/is-ray-node": "yes"},
        )


def matches(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    assert set(selector) <= {"matchLabels"}, f"selector form not modelled: {selector}"
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


def peer_matches(peer: dict[str, Any], source: dict[str, Any]) -> bool:
    assert "ipBlock" not in peer, "ipBlock peers not modelled"
    if "namespaceSelector" in peer:
        if not matches(peer["namespaceSelector"], source["namespace"]):
            return False
    elif source["namespace"] != RAY_NAMESPACE:
        return False
    return "podSelector" not in peer or matches(peer["podSelector"], source["labels"])


def allowed(target: dict[str, str], source: dict[str, Any], port: int) -> bool:
    """Kubernetes' NetworkPolicy ingress rule for a TCP connection to ``target`` (a Ray pod)."""
    selecting = [
        p
        for p in POLICIES
        if "Ingress" in p["spec"].get("policyTypes", ["Ingress"])
        and matches(p["spec"]["podSelector"], target)
    ]
    if not selecting:
        return True
    for policy in selecting:
        for rule in policy["spec"].get("ingress", []):
            peers = rule.get("from") or []
            ports = rule.get("ports") or []
            if peers and not any(peer_matches(peer, source) for peer in peers):
                continue
            if ports and not any(p.get("port") == port for p in ports):
                continue
            return True
    return False


SOURCES = {
    "other-pod-in-namespace": {"namespace": RAY_NAMESPACE, "labels": {"app": "web"}},
    "pod-in-other-namespace": {"namespace": {"kubernetes.io/metadata.name": "x"}, "labels": {}},
    "operator": {
        "namespace": OPERATOR_NAMESPACE,
        "labels": {"app.kubernetes.io/name": "kuberay-operator"},
    },
    "rayjob-submitter": {
        "namespace": RAY_NAMESPACE,
        "labels": {"ray.io/originated-from-crd": "RayJob"},
    },
    "prometheus": {
        "namespace": MONITORING_NAMESPACE,
        "labels": {"app.kubernetes.io/name": "prometheus"},
    },
}
# (source, port) -> may connect to the head
HEAD_ACCESS = {
    ("other-pod-in-namespace", 8000): True,
    ("pod-in-other-namespace", 8000): True,
    ("operator", 8265): True,
    ("operator", 8000): True,
    ("rayjob-submitter", 8265): True,
    ("prometheus", 8080): True,
    **{("other-pod-in-namespace", p): False for p in (*RAY_INTERNAL_PORTS, 8080)},
    **{("pod-in-other-namespace", p): False for p in (*RAY_INTERNAL_PORTS, 8080)},
    ("operator", 6379): False,
    ("rayjob-submitter", 6379): False,
    ("prometheus", 8265): False,
    ("prometheus", 6379): False,
}


def ray_pods() -> Iterator[tuple[str, dict[str, str]]]:
    for key, cluster in CLUSTERS.items():
        for group, labels in pod_labels(cluster):
            yield f"{key}:{group}", labels


@pytest.mark.parametrize("source, port", sorted(HEAD_ACCESS))
def test_network_policy_decides_who_reaches_the_head(source, port):
    heads = [labels for where, labels in ray_pods() if where.endswith(":head")]
    assert heads
    for head in heads:
        assert allowed(head, SOURCES[source], port) is HEAD_ACCESS[(source, port)], head


@pytest.mark.parametrize("where", [w for w, _ in ray_pods()])
def test_ray_pods_reach_each_other_and_outsiders_only_the_serve_and_metrics_ports(where):
    target = dict(ray_pods())[where]
    peers = [{"namespace": RAY_NAMESPACE, "labels": labels} for _, labels in ray_pods()]
    for peer in peers:
        for port in (*RAY_INTERNAL_PORTS, 8000, 8080):
            assert allowed(target, peer, port), (where, peer, port)
    outsider = SOURCES["other-pod-in-namespace"]
    assert allowed(target, outsider, 8000)
    assert not any(allowed(target, outsider, p) for p in (*RAY_INTERNAL_PORTS, 8080))
    assert allowed(target, SOURCES["prometheus"], 8080)


def test_without_the_policies_the_head_would_be_open():
    """The evaluator is not vacuous: with no policy every source reaches every port."""
    global POLICIES
    saved, POLICIES = POLICIES, []
    try:
        head = next(labels for where, labels in ray_pods() if where.endswith(":head"))
        assert allowed(head, SOURCES["pod-in-other-namespace"], 8265)
    finally:
        POLICIES = saved


def serve_args() -> dict[str, Any]:
    config = yaml.safe_load(only_doc("rayservice.yaml")["spec"]["serveConfigV2"])
    (app,) = config["applications"]
    return app["args"]


def test_the_api_key_secret_is_required_wherever_a_serve_replica_can_run():
    """GPU pods run the Serve replicas; each must get the key from a non-optional Secret."""
    variable = serve_args().get("api_key_env", AppArgs.model_fields["api_key_env"].default)
    assert variable
    checked = 0
    for key, cluster in CLUSTERS.items():
        for group in cluster["workerGroupSpecs"]:
            containers = group["template"]["spec"]["containers"]
            gpus = sum(int(c["resources"]["limits"].get("nvidia.com/gpu", 0)) for c in containers)
            if not gpus:
                continue
            env = {e["name"]: e for c in containers for e in c.get("env", [])}
            assert variable in env, f"{key}:{group['groupName']} lacks {variable}"
            ref = env[variable]["valueFrom"]["secretKeyRef"]
            assert ref.get("optional") is False, f"{key}:{group['groupName']}: {ref}"
            checked += 1
    assert checked >= 2


def test_the_serve_config_does_not_switch_auth_off():
    assert not serve_args().get("allow_unauthenticated", False)


def test_rayjobs_run_on_a_token_auth_cluster():
    name = only_doc("raycluster.yaml")["metadata"]["name"]
    for key, doc in RAY_MANIFESTS.items():
        if doc["kind"] == "RayJob":
            assert doc["spec"]["clusterSelector"] == {"ray.io/cluster": name}, key
    assert CLUSTERS["raycluster.yaml#0"]["authOptions"]["mode"] == "token"


def test_the_cluster_doc_says_what_is_exposed():
    text = (REPO / "docs" / "cluster.md").read_text(encoding="utf-8")
    for phrase in ("authOptions", "networkpolicy.yaml", "kubectl port-forward", "auth_token"):
        assert phrase in text, phrase


def documented(prefix: str) -> list[list[str]]:
    """The docs' shell lines (and ``$(...)`` inside them) that start with ``prefix``, split."""
    import re
    import shlex

    from test_job_entrypoints import documented_shell_lines

    found = []
    for line in documented_shell_lines():
        for part in [line, *re.findall(r"\$\(([^)]*)\)", line)]:
            part = part.split(" | ")[0].strip()
            if part.startswith(prefix):
                found.append(shlex.split(part))
    assert found, f"docs/cluster.md gives no `{prefix}` command"
    return found


def api_key_ref() -> dict[str, Any]:
    (ref,) = {
        (e["valueFrom"]["secretKeyRef"]["name"], e["valueFrom"]["secretKeyRef"]["key"])
        for cluster in CLUSTERS.values()
        for group in cluster["workerGroupSpecs"]
        for c in group["template"]["spec"]["containers"]
        for e in c.get("env", [])
        if "secretKeyRef" in e.get("valueFrom", {})
    }
    return {"name": ref[0], "key": ref[1]}


def test_documented_api_key_secret_is_the_one_the_pods_read_and_has_no_newline():
    ref = api_key_ref()
    for argv in documented("kubectl create secret"):
        assert argv[3:5] == ["generic", ref["name"]], argv
        literals = [a for a in argv if a.startswith("--from-literal=")]
        assert [lit.split("=", 2)[1] for lit in literals] == [ref["key"]], argv
        assert not any(a.startswith(("--from-file", "--from-env-file")) for a in argv), argv


def test_documented_token_secret_is_the_one_kuberay_creates():
    """KubeRay names the Secret after the RayCluster and stores the token under auth_token."""
    cluster = only_doc("raycluster.yaml")["metadata"]["name"]
    for argv in documented("kubectl get secret"):
        assert argv[3] == cluster, argv
        assert argv[argv.index("-o") + 1] == "jsonpath={.data.auth_token}", argv


def services() -> dict[str, set[int]]:
    """The Services KubeRay makes for the manifests, with their ports."""
    out = {}
    for key, doc in RAY_MANIFESTS.items():
        if doc["kind"] not in ("RayCluster", "RayService"):
            continue
        ports = {p["name"]: p["containerPort"] for p in head_container(CLUSTERS[key])["ports"]}
        if doc["kind"] == "RayCluster":
            out[f"{doc['metadata']['name']}-head-svc"] = set(ports.values())
        else:
            serve = {p for n, p in ports.items() if n == "serve" or n.startswith("serve-")}
            out[f"{doc['metadata']['name']}-serve-svc"] = serve
    return out


def test_documented_port_forwards_name_existing_services_and_ports():
    known = services()
    for argv in documented("kubectl port-forward"):
        target = argv[2]
        assert target.startswith("svc/") and target[4:] in known, (argv, sorted(known))
        for mapping in argv[3:]:
            local, _, remote = mapping.partition(":")
            assert int(remote or local) in known[target[4:]], (argv, known[target[4:]])
    dashboard = [a for a in documented("kubectl port-forward") if "8265:8265" in a]
    assert dashboard, "the docs must show how to reach the dashboard"


def test_documented_operator_namespace_is_the_one_the_policy_admits():
    (argv,) = documented("helm install")
    namespace = argv[argv.index("--namespace") + 1]
    admitted = {
        peer["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"]
        for policy in POLICIES
        for rule in policy["spec"]["ingress"]
        for peer in rule.get("from", [])
        if peer.get("podSelector", {}).get("matchLabels", {}).get("app.kubernetes.io/name")
        == "kuberay-operator"
    }
    assert admitted == {namespace}
