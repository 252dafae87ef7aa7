"""Issue 23.1: the Grafana dashboard, the alert rules and the PodMonitor in infra/ read only
metrics the app exports (names from :mod:`acare_ray.online.metrics`, checked against a real
Ray scrape in ``tests/online/test_metrics_cluster.py``), with labels those metrics have; and
the Kubernetes commands docs/online.md gives for them run (client side) or name valid files."""

from __future__ import annotations

import json
import re
import subprocess

import pytest
import yaml
from infra_support import INFRA, KUBERAY, REPO, load_yaml_documents

from acare_ray.online.metrics import METRICS, SERVE_METRICS, exported_names

DASHBOARD = INFRA / "grafana" / "acare-dashboard.json"
ALERTS = INFRA / "prometheus" / "alerts.yaml"
PODMONITOR = INFRA / "prometheus" / "podmonitor.yaml"
SERVE_LABELS = {"le", "deployment", "replica", "application", "route"}
NAME = re.compile(r"\b(ray_[a-zA-Z0-9_:]+)")
GROUPING = re.compile(r"\b(?:by|on|without|ignoring)\s*\(([^)]*)\)")
MATCHER = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)\s*\"")


def labels_of(name: str) -> set[str]:
    for spec in METRICS:
        if name in spec.exported():
            return set(spec.labels)
    return set()


def problems(expr: str) -> list[str]:
    """What is wrong with one PromQL expression: no metric, a metric the app does not
    export, or a label none of its metrics has."""
    names = set(NAME.findall(expr))
    if not names:
        return [f"no ray_ metric in {expr!r}"]
    found = [f"unknown metric {n}" for n in sorted(names - exported_names() - SERVE_METRICS)]
    allowed = SERVE_LABELS.union(*(labels_of(n) for n in names))
    used = {label.strip() for group in GROUPING.findall(expr) for label in group.split(",")}
    used |= set(MATCHER.findall(expr))
    found += [f"unknown label {label}" for label in sorted(used - allowed - {""})]
    return found


def dashboard_exprs(dashboard: dict) -> list[str]:
    return [t["expr"] for panel in dashboard["panels"] for t in panel.get("targets", [])]


def test_the_check_catches_a_misspelled_metric_and_label():
    assert problems("rate(ray_acare_request_total[5m])") == [
        "unknown metric ray_acare_request_total"
    ]
    assert problems("sum by (user) (rate(ray_acare_tokens_total[5m]))") == ["unknown label user"]
    assert problems("vector(1)") == ["no ray_ metric in 'vector(1)'"]


def test_the_dashboard_is_a_grafana_model_whose_queries_use_exported_metrics():
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] and dashboard["title"] and isinstance(dashboard["schemaVersion"], int)
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        assert set(panel["gridPos"]) == {"x", "y", "w", "h"}, panel["title"]
        assert panel["targets"], panel["title"]
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs)), panel["title"]
        for target in panel["targets"]:
            assert problems(target["expr"]) == [], (panel["title"], target["expr"])
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            assert problems(variable["definition"]) == [], variable


@pytest.mark.parametrize(
    "what, metric",
    [
        ("throughput", "ray_acare_requests_total"),
        ("latency percentiles", "ray_acare_request_seconds_bucket"),
        ("scoring latency", "ray_acare_batch_seconds_bucket"),
        ("queue wait", "ray_acare_queue_wait_seconds_bucket"),
        ("refusals", "ray_acare_refusals_total"),
        ("batch fill", "ray_acare_batch_fill_bucket"),
        ("tokens/s", "ray_acare_tokens_total"),
        ("replica count", "ray_serve_deployment_replica_healthy"),
    ],
)
def test_the_dashboard_shows(what, metric):
    exprs = dashboard_exprs(json.loads(DASHBOARD.read_text()))
    assert any(metric in expr for expr in exprs), f"no panel for {what}"


def test_the_alert_rules_parse_and_use_exported_metrics():
    (rules_file,) = load_yaml_documents(ALERTS)
    rules = [rule for group in rules_file["groups"] for rule in group["rules"]]
    assert rules and all(group["name"] for group in rules_file["groups"])
    names = [rule["alert"] for rule in rules]
    assert len(names) == len(set(names))
    for rule in rules:
        assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}, rule["alert"]
        assert re.fullmatch(r"\d+[smh]", rule["for"]), rule["alert"]
        assert rule["labels"]["severity"] in ("page", "warning")
        assert rule["annotations"]["summary"]
        assert rule["expr"].count("(") == rule["expr"].count(")"), rule["alert"]
        assert problems(rule["expr"]) == [], (rule["alert"], problems(rule["expr"]))


def test_the_podmonitor_selects_ray_pods_on_their_metrics_port():
    (monitor,) = load_yaml_documents(PODMONITOR)
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1" and monitor["kind"] == "PodMonitor"
    spec = monitor["spec"]
    assert spec["selector"]["matchLabels"] == {"ray.io/is-ray-node": "yes"}
    (endpoint,) = spec["podMetricsEndpoints"]
    assert endpoint["port"] == "metrics" and endpoint["path"] == "/metrics"
    # The RayService's head names the port KubeRay would add (8080, `metrics`) itself.
    (service,) = load_yaml_documents(KUBERAY / "rayservice.yaml")[-1:]
    head = service["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]
    ports = {p["name"]: p["containerPort"] for c in head["containers"] for p in c.get("ports", [])}
    assert ports.get("metrics") == 8080
    namespace = service["metadata"].get("namespace", "default")
    assert namespace in spec["namespaceSelector"]["matchNames"]


def documented_kubernetes_commands() -> list[str]:
    text = (REPO / "docs" / "online.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", text, flags=re.S)
    joined = [re.sub(r"\\\n\s*", " ", block) for block in blocks]  # continuations
    lines = [line.strip() for block in joined for line in block.splitlines()]
    return [line for line in lines if line.startswith("kubectl ")]


def test_the_documented_kubernetes_commands_run():
    """docs/online.md's kubectl lines: ``apply -f`` names the PodMonitor (checked above); the
    dashboard's ConfigMap pipeline runs up to its final ``kubectl apply -f -`` (client side,
    no cluster) and yields a ConfigMap, labelled for Grafana's sidecar, holding the JSON."""
    commands = documented_kubernetes_commands()
    assert "kubectl apply -f infra/prometheus/podmonitor.yaml" in commands
    (pipeline,) = [c for c in commands if c.startswith("kubectl create configmap ")]
    stages = [stage.strip() for stage in pipeline.split("|")]
    assert stages[-1] == "kubectl apply -f -"
    done = subprocess.run(
        " | ".join(stages[:-1]), shell=True, capture_output=True, text=True, timeout=60, cwd=REPO
    )
    assert done.returncode == 0, done.stderr
    configmap = yaml.safe_load(done.stdout)
    assert configmap["metadata"]["labels"] == {"grafana_dashboard": "1"}
    assert configmap["data"] == {DASHBOARD.name: DASHBOARD.read_text()}
    assert set(commands) == {"kubectl apply -f infra/prometheus/podmonitor.yaml", pipeline}
