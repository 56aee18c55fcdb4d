"""The Helm chart, rendered offline with Helm's own Go SDK (helm-python-sdk): lint, values
schema, several values sets rendered and every object validated strictly for Kubernetes
1.29-1.33, least-privilege RBAC, the CRD copy and the dashboards ConfigMaps.

Custom resources (ServiceMonitor, PodMonitor, PrometheusRule) have no schema in
kubernetes-validate: the structural fields prometheus-operator needs are checked by hand here,
and the PrometheusRule's rules are checked with promtool in test_alerts.py.
"""

from __future__ import annotations

import functools
import json
import pathlib
from typing import Any

import helm_python
import kubernetes_validate
import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[1]
CHART = ROOT / "charts" / "understudy"
K8S_VERSIONS = ["1.29", "1.30", "1.31", "1.32", "1.33"]
NS = "understudy-system"
CUSTOM_KINDS = {"ServiceMonitor", "PodMonitor", "PrometheusRule"}

VALUE_SETS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "external-zk": {"zookeeper": {"enabled": False, "externalConnect": "zk-a:2181,zk-b:2181"}},
    "monitoring-off": {
        "monitoring": {
            "serviceMonitor": {"enabled": False},
            "podMonitor": {"enabled": False},
            "prometheusRule": {"enabled": False},
            "dashboards": {"enabled": False},
        }
    },
    "two-operators-namespaced": {
        "operator": {"replicas": 2, "watchNamespaces": ["shop", "billing"]},
        "zookeeper": {"replicas": 1},
    },
    "everything-on": {
        "monitoring": {
            "labels": {"release": "kube-prometheus-stack"},
            "serviceMonitor": {"enabled": True},
            "podMonitor": {"enabled": True},
            "prometheusRule": {"enabled": True},
            "dashboards": {"enabled": True, "namespace": "grafana"},
        }
    },
}


@functools.cache
def chart() -> helm_python.Chart:
    return helm_python.Chart.load(str(CHART))


@functools.cache
def _render(name: str) -> tuple[dict[str, Any], ...]:
    out = chart().render(VALUE_SETS[name], name="understudy", namespace=NS)
    docs = []
    for path, text in sorted(out.items()):
        if path.endswith("NOTES.txt"):
            continue
        docs.extend(d for d in yaml.safe_load_all(text) if d)
    return tuple(docs)


def render(name: str) -> list[dict[str, Any]]:
    return list(_render(name))


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


@pytest.mark.parametrize("values", sorted(VALUE_SETS))
def test_helm_lint_is_clean(values: str) -> None:
    report = helm_python.lint(
        str(CHART), VALUE_SETS[values], namespace=NS, strict=True, kube_version="v1.29.0"
    )
    assert report["errors"] == []
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert problems == []


@pytest.mark.parametrize("values", sorted(VALUE_SETS))
@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_rendered_objects_pass_strict_validation(values: str, version: str) -> None:
    docs = render(values)
    assert docs
    for doc in docs:
        if doc["kind"] in CUSTOM_KINDS:
            continue
        kubernetes_validate.validate(doc, version, strict=True)


def test_crds_are_shipped_as_a_copy_of_crds_dir() -> None:
    shipped = {p.name: p.read_bytes() for p in (CHART / "crds").iterdir()}
    source = {p.name: p.read_bytes() for p in (ROOT / "crds").glob("*.yaml")}
    assert shipped == source
    assert sorted(c["name"] for c in chart().crds) == ["crds/brokergroup.yaml",
                                                       "crds/brokertopic.yaml",
                                                       "crds/brokeruser.yaml"]


def test_defaults_install_operator_and_three_node_zookeeper() -> None:
    docs = render("defaults")
    (deploy,) = by_kind(docs, "Deployment")
    (zk,) = by_kind(docs, "StatefulSet")
    assert zk["spec"]["replicas"] == 3
    args = deploy["spec"]["template"]["spec"]["containers"][0]["args"]
    zk_arg = args[args.index("--zk") + 1]
    assert zk_arg == ",".join(
        f"understudy-zookeeper-{i}.understudy-zookeeper-headless.{NS}.svc:2181" for i in range(3)
    ) + "/understudy"
    assert "--all-namespaces" in args
    env = {e["name"]: e.get("value") for e in zk["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["ZOO_SERVERS"].split() == [
        f"server.{i + 1}=understudy-zookeeper-{i}.understudy-zookeeper-headless.{NS}.svc:2888:3888;2181"
        for i in range(3)
    ]
    # Monitoring CRs are opt-in (a plain cluster has no prometheus-operator CRDs).
    assert not [d for d in docs if d["kind"] in CUSTOM_KINDS]


def _zk_env(values: dict[str, Any]) -> dict[str, str]:
    out = chart().render(values, name="understudy", namespace=NS)
    docs = [d for path, text in out.items() if not path.endswith("NOTES.txt") for d in yaml.safe_load_all(text) if d]
    (zk,) = by_kind(docs, "StatefulSet")
    return {e["name"]: e.get("value") for e in zk["spec"]["template"]["spec"]["containers"][0]["env"]}


def _crd_session_range() -> tuple[int, int]:
    crd = yaml.safe_load((ROOT / "crds" / "brokergroup.yaml").read_text())
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    field = spec["properties"]["zookeeper"]["properties"]["sessionTimeoutMs"]
    return int(field["minimum"]), int(field["maximum"])


def test_zookeeper_grants_every_session_timeout_the_crd_allows() -> None:
    # The image's tickTime default (2000 ms) would raise a 2 s broker session to 4 s.
    env = _zk_env({})
    tick = int(env["ZOO_TICK_TIME"])
    extra = dict(kv.split("=", 1) for kv in env["ZOO_CFG_EXTRA"].split())
    lo, hi = int(extra["minSessionTimeout"]), int(extra["maxSessionTimeout"])
    crd_lo, crd_hi = _crd_session_range()
    assert tick == 200
    assert 2 * tick <= lo <= crd_lo  # no valid BrokerGroup session is raised...
    assert hi >= crd_hi  # ...or lowered
    assert extra["quorumListenOnAllIPs"] == "true"
    # quorum limits count ticks: about 10 s to join and 4 s of lag, as with the image defaults
    assert int(env["ZOO_INIT_LIMIT"]) * tick == 10_000
    assert int(env["ZOO_SYNC_LIMIT"]) * tick == 4_000


def test_zookeeper_timing_values_are_rendered() -> None:
    env = _zk_env({"zookeeper": {"tickTimeMs": 100, "minSessionTimeoutMs": 200, "maxSessionTimeoutMs": 90000}})
    assert env["ZOO_TICK_TIME"] == "100"
    assert "minSessionTimeout=200 maxSessionTimeout=90000" in env["ZOO_CFG_EXTRA"]


def test_zookeeper_session_floor_below_two_ticks_is_a_clear_error() -> None:
    # ZooKeeper itself would raise such a floor to 2 ticks; the chart says so instead.
    with pytest.raises(helm_python.HelmError, match=r"at least 2 x zookeeper\.tickTimeMs"):
        chart().render({"zookeeper": {"tickTimeMs": 600, "minSessionTimeoutMs": 1000}}, name="understudy", namespace=NS)


def test_external_zookeeper() -> None:
    docs = render("external-zk")
    assert by_kind(docs, "StatefulSet") == []
    args = by_kind(docs, "Deployment")[0]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--zk") + 1] == "zk-a:2181,zk-b:2181/understudy"


def test_external_zookeeper_without_connect_is_a_clear_error() -> None:
    with pytest.raises(helm_python.HelmError, match="externalConnect"):
        chart().render({"zookeeper": {"enabled": False}}, name="understudy", namespace=NS)


@pytest.mark.parametrize(
    ("values", "where"),
    [
        ({"operator": {"replicas": 0}}, "/operator/replicas"),
        ({"zookeeper": {"replicas": 2}}, "/zookeeper/replicas"),
        ({"operatr": {}}, "operatr"),
        ({"monitoring": {"prometheusRule": {"slaveConsumeFor": "soon"}}}, "slaveConsumeFor"),
        ({"monitoring": {"prometheusRule": {"consumerLagWindow": "10 min"}}}, "consumerLagWindow"),
        ({"operator": {"watchNamespaces": ["Bad_NS"]}}, "watchNamespaces"),
        ({"zookeeper": {"tickTimeMs": 10}}, "tickTimeMs"),
        ({"zookeeper": {"minSessionTimeoutMs": 2000}}, "minSessionTimeoutMs"),
        ({"zookeeper": {"maxSessionTimeoutMs": 30000}}, "maxSessionTimeoutMs"),
        ({"zookeeper": {"tickTimeMs": "200"}}, "tickTimeMs"),
    ],
)
def test_values_schema_rejects_bad_values(values: dict[str, Any], where: str) -> None:
    with pytest.raises(helm_python.HelmValuesError, match=where):
        chart().validate_schema(values)


def test_two_operator_replicas_get_a_pdb_and_namespaced_rbac() -> None:
    docs = render("two-operators-namespaced")
    (deploy,) = by_kind(docs, "Deployment")
    assert deploy["spec"]["replicas"] == 2
    (pdb,) = [p for p in by_kind(docs, "PodDisruptionBudget") if "operator" in p["metadata"]["name"]]
    assert pdb["spec"]["minAvailable"] == 1
    roles = [r for r in by_kind(docs, "Role") if not r["metadata"]["name"].endswith("-ca")]
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["billing", "shop"]
    # The CA Secret in the release namespace (tests/test_operator_security.py).
    (ca_role,) = [r for r in by_kind(docs, "Role") if r["metadata"]["name"].endswith("-ca")]
    assert ca_role["metadata"]["namespace"] == NS
    (cluster_role,) = by_kind(docs, "ClusterRole")
    groups = {g for rule in cluster_role["rules"] for g in rule["apiGroups"]}
    assert groups == {"apiextensions.k8s.io", ""}, "namespaced mode must not grant cluster-wide writes"
    args = deploy["spec"]["template"]["spec"]["containers"][0]["args"]
    assert [args[i + 1] for i, a in enumerate(args) if a == "--namespace"] == ["shop", "billing"]


@pytest.mark.parametrize("values", sorted(VALUE_SETS))
def test_rbac_is_least_privilege(values: str) -> None:
    docs = render(values)
    rules = [r for d in docs if d["kind"] in ("ClusterRole", "Role") for r in d["rules"]]
    assert rules
    for rule in rules:
        assert "*" not in rule["verbs"], rule
        assert "*" not in rule["resources"], rule
        assert "*" not in rule["apiGroups"], rule
        if "secrets" in rule["resources"]:
            # Certificates, group secrets and the brokers' ZooKeeper digest (security):
            # read and written by name, never listed or watched
            # (tests/test_operator_security.py checks every verb against the code).
            assert not set(rule["verbs"]) & {"list", "watch"}, rule
    writes = {"create", "update", "patch", "delete"}
    for rule in rules:
        if set(rule["resources"]) & {"pods", "persistentvolumeclaims"}:
            assert set(rule["verbs"]) & writes <= {"delete"}, rule
        if "customresourcedefinitions" in rule["resources"]:
            assert not set(rule["verbs"]) & writes, rule


@pytest.mark.parametrize("values", sorted(VALUE_SETS))
def test_every_container_runs_hardened(values: str) -> None:
    for doc in render(values):
        if doc["kind"] not in ("Deployment", "StatefulSet"):
            continue
        pod = doc["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        for c in pod["containers"]:
            sc = c["securityContext"]
            assert sc["readOnlyRootFilesystem"] is True
            assert sc["allowPrivilegeEscalation"] is False
            assert sc["capabilities"]["drop"] == ["ALL"]
            assert "livenessProbe" in c
            assert "readinessProbe" in c


def test_monitoring_resources() -> None:
    docs = render("everything-on")
    (sm,) = by_kind(docs, "ServiceMonitor")
    (pm,) = by_kind(docs, "PodMonitor")
    (rule,) = by_kind(docs, "PrometheusRule")
    for cr in (sm, pm, rule):
        assert cr["apiVersion"] == "monitoring.coreos.com/v1"
        assert cr["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    service = next(s for s in by_kind(docs, "Service") if s["metadata"]["name"].endswith("-metrics"))
    assert sm["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert sm["spec"]["endpoints"][0]["port"] == service["spec"]["ports"][0]["name"]
    assert pm["spec"]["selector"]["matchLabels"] == {"app.kubernetes.io/name": "understudy-broker"}
    assert pm["spec"]["podMetricsEndpoints"][0]["port"] == "http"
    assert {g["name"] for g in rule["spec"]["groups"]} == {
        "understudy.groups", "understudy.topics", "understudy.operator"}


def test_monitoring_off_renders_no_monitoring_objects() -> None:
    docs = render("monitoring-off")
    assert not [d for d in docs if d["kind"] in CUSTOM_KINDS]
    assert not [d for d in by_kind(docs, "ConfigMap") if "dashboard" in d["metadata"]["name"]]


def test_dashboards_ship_as_sidecar_configmaps() -> None:
    docs = render("everything-on")
    maps = [d for d in by_kind(docs, "ConfigMap") if "dashboard" in d["metadata"]["name"]]
    files = sorted((CHART / "files" / "grafana-dashboards").glob("*.json"))
    assert len(maps) == len(files) == 4
    for cm in maps:
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert cm["metadata"]["namespace"] == "grafana"
        ((key, body),) = cm["data"].items()
        assert json.loads(body) == json.loads((CHART / "files" / "grafana-dashboards" / key).read_text())
