"""Pure Kubernetes builders: shape, safety settings, the broker command per ordinal (run through
a real /bin/sh), and every object valid for Kubernetes 1.29-1.33 with strict validation."""

from __future__ import annotations

import json
import pathlib
import subprocess
from typing import Any

import kubernetes_validate
import pytest
import yaml

from understudy_broker.zklayout import GroupConfig
from understudy_operator.k8s.builders import (
    broker_script,
    build_all,
    build_broker_services,
    build_headless_service,
    build_servicemonitor,
    build_statefulset,
    render_command,
)
from understudy_operator.k8s.spec import BrokerGroupSpec, parse_spec
from understudy_operator.k8s.zkconfig import build_group_config

ROOT = pathlib.Path(__file__).resolve().parents[1]
SAMPLES = sorted(p for p in (ROOT / "crds" / "samples").glob("*.yaml")
                 if not p.name.startswith(("topic-", "user-")))  # tests/test_k8s_topic.py, test_operator_security.py
K8S_VERSIONS = ["1.29", "1.30", "1.31", "1.32", "1.33"]
NS = "shop"
# Kinds kubernetes-validate has no schema for; checked by hand in the tests below.
CUSTOM_KINDS = {"ServiceMonitor"}


def sample(name: str) -> tuple[str, BrokerGroupSpec]:
    doc = yaml.safe_load((ROOT / "crds" / "samples" / name).read_text())
    return doc["metadata"]["name"], parse_spec(doc["spec"], default_zk_connect="zk:2181")


def spec_of(**raw: Any) -> BrokerGroupSpec:
    return parse_spec({"image": "understudy/broker:t", **raw}, default_zk_connect="zk:2181")


@pytest.mark.parametrize("path", SAMPLES, ids=lambda p: p.name)
@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_every_built_object_passes_strict_validation(path: pathlib.Path, version: str) -> None:
    group, spec = sample(path.name)
    objects = build_all(spec=spec, group=group, namespace=NS, labels={"team": "payments"})
    assert objects
    for obj in objects:
        if obj["kind"] in CUSTOM_KINDS:
            continue
        kubernetes_validate.validate(obj, version, strict=True)


def test_objects_of_a_group() -> None:
    group, spec = sample("production.yaml")
    objects = build_all(spec=spec, group=group, namespace=NS)
    names = [(o["kind"], o["metadata"]["name"]) for o in objects]
    assert names == [
        ("ConfigMap", "payments-config"),
        ("Service", "payments-headless"),
        ("Service", "payments-0"),
        ("Service", "payments-1"),
        ("Service", "payments-2"),
        ("PodDisruptionBudget", "payments"),
        ("NetworkPolicy", "payments-brokers"),  # security default: tests/test_operator_security.py
        ("StatefulSet", "payments"),
        ("ServiceMonitor", "payments"),
    ]
    assert all(o["metadata"]["namespace"] == NS for o in objects)
    assert all("ownerReferences" not in o["metadata"] for o in objects)


def test_monitoring_off_means_no_servicemonitor() -> None:
    group, spec = sample("async-overrides.yaml")
    kinds = [o["kind"] for o in build_all(spec=spec, group=group, namespace=NS)]
    assert "ServiceMonitor" not in kinds


def test_statefulset_shape_and_safety() -> None:
    group, spec = sample("production.yaml")
    sts = build_statefulset(spec=spec, group=group, namespace=NS, labels={"team": "x"})
    s = sts["spec"]
    assert s["replicas"] == 3
    assert s["podManagementPolicy"] == "Parallel"
    assert s["updateStrategy"] == {"type": "OnDelete"}
    assert s["serviceName"] == "payments-headless"
    template_labels = s["template"]["metadata"]["labels"]
    assert s["selector"]["matchLabels"].items() <= template_labels.items()
    assert template_labels["team"] == "x"
    pod = s["template"]["spec"]
    (container,) = pod["containers"]
    sc = container["securityContext"]
    assert sc["runAsNonRoot"] is True
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["resources"] == {"requests": {"cpu": "500m", "memory": "512Mi"}, "limits": {"memory": "1Gi"}}
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert {"/data", "/tmp"} <= mounts
    assert pod["nodeSelector"] == {"understudy.io/broker-pool": "true"}
    assert pod["tolerations"][0]["key"] == "understudy.io/dedicated"
    (claim,) = s["volumeClaimTemplates"]
    assert claim["spec"]["resources"]["requests"]["storage"] == "20Gi"
    assert claim["spec"]["storageClassName"] == "standard"
    assert s["persistentVolumeClaimRetentionPolicy"]["whenDeleted"] == "Retain"


def test_caller_labels_cannot_change_the_selector() -> None:
    spec = spec_of()
    sts = build_statefulset(
        spec=spec, group="g", namespace=NS, labels={"understudy.io/group": "other"}
    )
    assert sts["spec"]["template"]["metadata"]["labels"]["understudy.io/group"] == "g"


def test_pvc_retention_and_default_anti_affinity() -> None:
    spec = spec_of(storage={"retentionOnDelete": "Delete"})
    sts = build_statefulset(spec=spec, group="g", namespace=NS)
    assert sts["spec"]["persistentVolumeClaimRetentionPolicy"]["whenDeleted"] == "Delete"
    affinity = sts["spec"]["template"]["spec"]["affinity"]
    assert "podAntiAffinity" in affinity
    custom = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}]}}}
    sts2 = build_statefulset(spec=spec_of(podTemplate={"affinity": custom}), group="g", namespace=NS)
    assert sts2["spec"]["template"]["spec"]["affinity"] == custom


def run_script(script: str, pod_name: str, tmp_path: pathlib.Path) -> tuple[int, list[str], str]:
    """Run the container script with a fake ``understudy`` that records its argv."""
    fake = tmp_path / "understudy"
    fake.write_text('#!/bin/sh\nfor a in "$@"; do printf "%s\\n" "$a"; done\n')
    fake.chmod(0o755)
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin", "POD_NAME": pod_name}
    proc = subprocess.run(
        ["/bin/sh", "-c", script], env=env, capture_output=True, text=True, timeout=10, check=False
    )
    return proc.returncode, proc.stdout.splitlines(), proc.stderr


def flag(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


def test_master_command(tmp_path: pathlib.Path) -> None:
    spec = spec_of(slaves=2, brokers=[{"ordinal": 0, "permission": "WRITE"}])
    code, argv, _ = run_script(broker_script(spec=spec, group="orders", namespace=NS), "orders-0", tmp_path)
    assert code == 0
    assert argv[:1] == ["broker"]
    assert flag(argv, "--data-dir") == "/data"
    assert flag(argv, "--port") == "9876"
    assert flag(argv, "--http-port") == "9100"
    assert flag(argv, "--replication-port") == "10912"
    assert flag(argv, "--host") == "0.0.0.0"
    assert "--role" not in argv
    assert "--master" not in argv
    assert "--sync" in argv
    assert flag(argv, "--min-insync-replicas") == "1"
    assert "--no-auto-degrade" in argv
    assert flag(argv, "--name") == "orders-0"
    assert flag(argv, "--group") == "orders"
    assert flag(argv, "--permission") == "WRITE"
    assert flag(argv, "--zk") == "zk:2181/understudy"
    assert flag(argv, "--zk-session-timeout-ms") == "4000"
    peers = [argv[i + 1] for i, a in enumerate(argv) if a == "--peer"]
    assert peers == ["orders-1=orders-1.shop.svc:9876", "orders-2=orders-2.shop.svc:9876"]


def test_quorum_write_knobs_reach_the_master_command(tmp_path: pathlib.Path) -> None:
    spec = spec_of(slaves=2, replication={"minInSyncReplicas": 1, "inSyncReplicas": 3,
                                          "autoDegrade": True, "maxLagBytes": 8 << 20})
    code, argv, _ = run_script(broker_script(spec=spec, group="orders", namespace=NS), "orders-0", tmp_path)
    assert code == 0
    assert flag(argv, "--min-insync-replicas") == "1"
    assert flag(argv, "--in-sync-replicas") == "3"
    assert flag(argv, "--max-lag-bytes") == str(8 << 20)
    assert "--auto-degrade" in argv
    # Without inSyncReplicas the broker's own default (the floor + 1) applies.
    code, argv, _ = run_script(broker_script(spec=spec_of(slaves=2), group="orders", namespace=NS),
                               "orders-0", tmp_path)
    assert code == 0
    assert "--in-sync-replicas" not in argv


def test_slave_command(tmp_path: pathlib.Path) -> None:
    spec = spec_of(slaves=2, replication={"mode": "async"}, permission="READ")
    code, argv, _ = run_script(broker_script(spec=spec, group="orders", namespace=NS), "orders-2", tmp_path)
    assert code == 0
    assert flag(argv, "--role") == "slave"
    assert flag(argv, "--master") == "orders-0.shop.svc:10912"
    assert "--async" in argv
    assert "--sync" not in argv
    assert "--min-insync-replicas" not in argv
    assert flag(argv, "--name") == "orders-2"
    assert flag(argv, "--permission") == "READ"


def test_pod_outside_the_group_exits_with_a_clear_error(tmp_path: pathlib.Path) -> None:
    spec = spec_of(slaves=1)
    code, argv, err = run_script(broker_script(spec=spec, group="orders", namespace=NS), "orders-5", tmp_path)
    assert code == 64
    assert argv == []
    assert "pod orders-5 has no broker ordinal in group orders" in err


def test_rendered_command_quotes_shell_metacharacters(tmp_path: pathlib.Path) -> None:
    # Every value reaching the script is validated by spec.py already; quoting is the second
    # line of defence, so check it with hostile values directly.
    nasty = ["$(touch pwned)", "a b", "`id`", "it's", ";exit 3"]
    script = render_command(["printf", "%s\\n", *nasty])
    proc = subprocess.run(
        ["/bin/sh", "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=10, check=False
    )
    assert proc.returncode == 0
    assert proc.stdout.splitlines() == nasty
    assert not (tmp_path / "pwned").exists()


def test_services() -> None:
    spec = spec_of(slaves=1)
    headless = build_headless_service(group="g", namespace=NS)
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["publishNotReadyAddresses"] is True
    brokers = build_broker_services(spec=spec, group="g", namespace=NS)
    assert [s["spec"]["selector"]["statefulset.kubernetes.io/pod-name"] for s in brokers] == ["g-0", "g-1"]
    assert [s["metadata"]["labels"]["understudy.io/role"] for s in brokers] == ["master", "slave"]
    ports = {p["name"]: p["port"] for p in headless["spec"]["ports"]}
    assert ports == {"broker": 9876, "replication": 10912, "http": 9100}


def test_servicemonitor_scrapes_each_broker_once() -> None:
    spec = spec_of(slaves=2, monitoring={"interval": "30s"})
    sm = build_servicemonitor(spec=spec, group="g", namespace=NS)
    selector = sm["spec"]["selector"]["matchLabels"]
    services = [build_headless_service(group="g", namespace=NS), *build_broker_services(spec=spec, group="g", namespace=NS)]
    selected = [s["metadata"]["name"] for s in services if selector.items() <= s["metadata"]["labels"].items()]
    assert selected == ["g-headless"]
    # ServiceMonitor is a custom resource: no schema in kubernetes-validate; check the fields
    # prometheus-operator requires.
    assert sm["apiVersion"] == "monitoring.coreos.com/v1"
    (endpoint,) = sm["spec"]["endpoints"]
    assert endpoint == {"port": "http", "path": "/metrics", "interval": "30s"}
    assert sm["spec"]["namespaceSelector"] == {"matchNames": [NS]}


def test_configmap_holds_the_zk_config() -> None:
    group, spec = sample("production.yaml")
    cm = build_all(spec=spec, group=group, namespace=NS)[0]
    assert cm["kind"] == "ConfigMap"
    decoded = GroupConfig.from_json(cm["data"]["config.json"].encode())
    assert decoded == build_group_config(spec=spec, group=group, namespace=NS)
    assert json.loads(cm["data"]["config.json"])["group"] == "payments"


def test_pdb_allows_one_broker_down() -> None:
    spec = spec_of()
    pdb = next(o for o in build_all(spec=spec, group="g", namespace=NS) if o["kind"] == "PodDisruptionBudget")
    assert pdb["spec"]["maxUnavailable"] == 1
