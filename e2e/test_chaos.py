"""Chaos against a BrokerGroup in kind: delete the master pod, kill -9 its broker, cut it off
the network; the group must fail over to its slave, come back to NORMAL, and the run must pass
the same checker as the drill (``understudy_harness.checker.check``).

One history per run, on one clock (``time.time_ns``: kind nodes are containers on this host's
kernel, so the test, the workload pod and the brokers read the same clock):
- the workload Job's produce_ack/deliver/commit events (``understudy workload``, the drill's
  traffic code), printed by the Job as a gzip+base64 block and decoded here;
- every broker's permission changes, from ``GET /permissions`` on its HTTP port (the log is on
  the broker's PersistentVolume, so it spans restarts and pod deletions); a ``kill-9`` ends the
  killed incarnation's READ at the kill, as the drill does for its kills;
- the fault/restart events this test records, and mode events from polling the BrokerGroup's
  status (every 0.5-1 s: mode times carry that error; READ times come from the brokers' logs).
The merged history is written to ``$E2E_ARTIFACTS`` (default ``e2e/.artifacts``) for inspection.

The chaos runs use a group with its broker ports in plain TCP (``spec.security`` off): the
recorded workload (``understudy workload``) has no TLS or SCRAM options yet. ZooKeeper still
requires the chart's digest credentials and the NetworkPolicies are on.
``test_secure_group_serves_authenticated_clients_through_a_failover`` runs the Kubernetes
default instead — operator certificates, TLS, SCRAM users and ACLs, the group secret — with
the CLI's clients (docs/security-kubernetes.md).
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from understudy_harness.checker import Report, check
from understudy_harness.history import Event, Fault, iter_jsonl, parse_events
from understudy_harness.permevents import broker_perm_events, parse_permission_log
from understudy_harness.testing import wait_until
from understudy_harness.workload_history import merge_events, parse_workload_logs
from understudy_operator.k8s.zkconfig import HTTP_PORT

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "e2e" / "scripts"
CLUSTER = os.environ.get("KIND_CLUSTER", "understudy-e2e")
SYSTEM_NS = "understudy-system"
TAG = "e2e"

pytestmark = pytest.mark.e2e
GROUP = "orders"
RATE = 100  # messages per second
DURATION_S = 90  # producing time: covers the fault, slave-consume and the failback
FAILOVER_TIMEOUT_S = 120
RECOVERY_TIMEOUT_S = 300


def sh(*args: str, timeout: float = 600, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run a command, echo what it does, fail with its output."""
    print("+", " ".join(args), flush=True)
    proc = subprocess.run(list(args), capture_output=True, text=True, timeout=timeout, check=False)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc


def kubectl_json(*args: str) -> Any:
    return json.loads(sh("kubectl", *args, "-o", "json").stdout)


def wait_for(what: str, predicate: Any, *, timeout: float, interval: float = 1.0) -> Any:
    """Poll ``predicate`` until it returns a truthy value; fail naming ``what``."""
    return wait_until(predicate, what, timeout, interval_s=interval)


@pytest.fixture(scope="session")
def kind_cluster() -> Iterator[str]:
    sh(str(SCRIPTS / "cluster.sh"), "create", CLUSTER, timeout=600)
    try:
        sh(str(SCRIPTS / "images.sh"), CLUSTER, TAG, timeout=1800)
        sh(str(SCRIPTS / "install.sh"), SYSTEM_NS, TAG, timeout=900)
        yield CLUSTER
    finally:
        if os.environ.get("E2E_KEEP_CLUSTER") != "1":
            sh(str(SCRIPTS / "cluster.sh"), "delete", CLUSTER, timeout=300, check=False)


@pytest.fixture
def namespace(kind_cluster: str, request: pytest.FixtureRequest) -> Iterator[str]:
    name = f"e2e-{request.node.name.replace('_', '-')[:40].strip('-').lower()}"
    sh("kubectl", "create", "namespace", name)
    try:
        yield name
    finally:
        sh("kubectl", "delete", "namespace", name, "--wait=false", check=False)


#: The HTTP port's NetworkPolicy peers: Prometheus (the default) and the API server, through
#: whose pod proxy the test reads every broker's /permissions (it is not on the pod's node).
METRICS_FROM = [
    {"namespaceSelector": {}, "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}},
    {"ipBlock": {"cidr": "0.0.0.0/0"}},
]
PLAIN = {"tls": False, "requireAuth": False, "groupSecret": False}


def apply(doc: dict[str, Any]) -> None:
    subprocess.run(["kubectl", "apply", "-f", "-"], input=yaml.safe_dump(doc), text=True, check=True, timeout=60)


def apply_group(namespace: str, *, secure: bool = False) -> None:
    doc = yaml.safe_load((ROOT / "crds" / "samples" / "minimal.yaml").read_text())
    doc["metadata"] = {"name": GROUP, "namespace": namespace}
    doc["spec"]["image"] = f"understudy/broker:{TAG}"
    doc["spec"]["imagePullPolicy"] = "Never"
    doc["spec"]["failover"] = {"checkIntervalMs": 250, "detectionChecks": 2}
    doc["spec"]["networkPolicy"] = {"metricsFrom": METRICS_FROM}
    if not secure:
        doc["spec"]["security"] = PLAIN
    apply(doc)


def status(namespace: str) -> dict[str, Any]:
    obj = kubectl_json("-n", namespace, "get", "brokergroup", GROUP)
    result: dict[str, Any] = obj.get("status") or {}
    return result


def condition(st: dict[str, Any], kind: str) -> str | None:
    return next((c["status"] for c in st.get("conditions", []) if c["type"] == kind), None)


def wait_ready(namespace: str, timeout: float) -> dict[str, Any]:
    def ready() -> dict[str, Any] | None:
        st = status(namespace)
        return st if condition(st, "Ready") == "True" and st.get("mode") == "NORMAL" else None

    result: dict[str, Any] = wait_for(f"BrokerGroup {namespace}/{GROUP} Ready", ready, timeout=timeout)
    return result


class History:
    """Fault, restart and mode events in the checker's shape (understudy_harness.history),
    stamped with ``time.time_ns`` like the workload's and the brokers' events."""

    def __init__(self) -> None:
        self.docs: list[dict[str, Any]] = []

    def add(self, event_type: str, /, **fields: Any) -> None:
        self.docs.append({"type": event_type, "t": time.time_ns(), **fields})

    def events(self) -> list[Event]:
        return parse_events(self.docs)


def start_workload(namespace: str, run: str) -> str:
    text = (ROOT / "e2e" / "manifests" / "workload.yaml").read_text()
    for key, value in {
        "GROUP": GROUP,
        "NAMESPACE": namespace,
        "IMAGE": f"understudy/broker:{TAG}",
        "RATE": str(RATE),
        "DURATION": str(DURATION_S),
        "RUN": run,
    }.items():
        text = text.replace(f"@{key}@", value)
    subprocess.run(["kubectl", "apply", "-f", "-"], input=text, text=True, check=True, timeout=60)
    return f"workload-{run}"


def workload_logs(namespace: str, job: str) -> str:
    """The Job's log once it has finished; a failed Job fails the test with its log."""
    wait = sh("kubectl", "-n", namespace, "wait", f"job/{job}", "--for=condition=complete",
              f"--timeout={DURATION_S + 400}s", timeout=DURATION_S + 420, check=False)  # fmt: skip
    logs = sh("kubectl", "-n", namespace, "logs", f"job/{job}", timeout=120).stdout
    if wait.returncode != 0:
        raise AssertionError(f"workload Job {job} did not complete:\n{wait.stderr}\n{logs[-4000:]}")
    return logs


def permission_events(namespace: str, st: dict[str, Any], faults: list[Fault]) -> list[Event]:
    """Every broker's permission-change log (``GET /permissions`` through the API server's pod
    proxy) as ``perm`` events."""
    out: list[Event] = []
    for b in st["brokers"]:
        name = b["name"]
        text = sh("kubectl", "get", "--raw",
                  f"/api/v1/namespaces/{namespace}/pods/{name}:{HTTP_PORT}/proxy/permissions").stdout  # fmt: skip
        changes = parse_permission_log(text, source=f"{namespace}/{name} /permissions")
        out.extend(broker_perm_events(group=GROUP, broker=name, role=b["role"], changes=changes, faults=faults))
    return out


def judge(namespace: str, history: History, workload: list[Event], st: dict[str, Any], run: str) -> Report:
    """Merge the three sources, save the history, run the shared checker, print its figures."""
    own = history.events()
    faults = [e for e in own if isinstance(e, Fault)]
    merged = merge_events(own, workload, permission_events(namespace, st, faults))
    artifacts = Path(os.environ.get("E2E_ARTIFACTS") or ROOT / "e2e" / ".artifacts")
    artifacts.mkdir(parents=True, exist_ok=True)
    saved = artifacts / f"history-{run}.jsonl"
    saved.write_text("".join(line + "\n" for line in iter_jsonl(merged)))
    report = check(merged)
    print(f"history: {saved} ({len(merged)} events)")
    print(json.dumps(report.to_json(), indent=2))
    return report


@pytest.mark.parametrize("fault", ["delete-pod", "kill-9", "partition"])
def test_master_fault_fails_over_and_back(namespace: str, fault: str) -> None:
    apply_group(namespace)
    before = wait_ready(namespace, RECOVERY_TIMEOUT_S)
    master = before["master"]
    history = History()
    history.add("mode", group=GROUP, mode="NORMAL", epoch=before["epoch"])

    job = start_workload(namespace, fault)
    time.sleep(5)  # let the workload get going before the fault
    history.add("fault", cycle=1, kind=fault, broker=master, group=GROUP)
    sh(str(SCRIPTS / "chaos.sh"), fault, namespace, master)

    def slave_consume() -> dict[str, Any] | None:
        st = status(namespace)
        return st if st.get("mode") == "SLAVE_CONSUME" and st.get("acting") else None

    during = wait_for("SLAVE_CONSUME with an acting slave", slave_consume, timeout=FAILOVER_TIMEOUT_S, interval=0.5)
    history.add("mode", group=GROUP, mode="SLAVE_CONSUME", epoch=during["epoch"])
    assert during["readable"] is True
    assert condition(during, "ReadAvailable") == "True"
    assert condition(during, "FailoverInProgress") == "True"

    if fault == "partition":
        time.sleep(10)
        sh(str(SCRIPTS / "chaos.sh"), "heal", namespace, master)
    history.add("restart", cycle=1, broker=master, group=GROUP)

    after = wait_ready(namespace, RECOVERY_TIMEOUT_S)
    history.add("mode", group=GROUP, mode="NORMAL", epoch=after["epoch"])
    assert after["epoch"] > before["epoch"]
    assert condition(after, "BackSyncComplete") == "True"
    assert after["lastFailover"]["normalAgain"] is not None

    output = parse_workload_logs(workload_logs(namespace, job))
    print("workload:", json.dumps(output.summary))
    assert output.summary["acked"] > 0
    assert output.summary["drained"] is True, "some consumer group never received every acknowledged message"

    report = judge(namespace, history, output.events, status(namespace), fault)
    assert report.ok, report.violations
    assert report.acked == output.summary["acked"]
    assert report.lost_acked == 0
    assert report.duplicates_rewind == 0
    assert report.one_reader_violations == 0
    assert len(report.cycles) == 1


# --------------------------------------------------------------------------- the secure default


def run_client(namespace: str, name: str, command: str, *, timeout: float = 240) -> tuple[bool, str]:
    """Run ``command`` in a Job in ``namespace`` with the group's CA bundle at /ca/ca.crt
    (the group's ConfigMap) and the user's password at /pw/password; (succeeded, log)."""
    job = {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"backoffLimit": 0, "activeDeadlineSeconds": int(timeout), "template": {
            "metadata": {"labels": {"app.kubernetes.io/name": "understudy-e2e-client"}},
            "spec": {
                "restartPolicy": "Never",
                "securityContext": {"runAsNonRoot": True, "runAsUser": 10001, "fsGroup": 10001,
                                    "seccompProfile": {"type": "RuntimeDefault"}},
                "containers": [{
                    "name": "client", "image": f"understudy/broker:{TAG}", "imagePullPolicy": "Never",
                    "command": ["/bin/sh", "-ec", command],
                    "securityContext": {"readOnlyRootFilesystem": True, "allowPrivilegeEscalation": False,
                                        "capabilities": {"drop": ["ALL"]}},
                    "volumeMounts": [{"name": "ca", "mountPath": "/ca", "readOnly": True},
                                     {"name": "pw", "mountPath": "/pw", "readOnly": True},
                                     {"name": "tmp", "mountPath": "/tmp"}]}],
                "volumes": [
                    {"name": "ca", "configMap": {"name": f"{GROUP}-config", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                    {"name": "pw", "secret": {"secretName": "app-password", "defaultMode": 0o440}},
                    {"name": "tmp", "emptyDir": {}}]}}},
    }
    apply(job)

    def finished() -> tuple[bool, bool] | None:
        st = kubectl_json("-n", namespace, "get", "job", name).get("status") or {}
        if st.get("succeeded"):
            return (True, True)
        if st.get("failed"):
            return (True, False)
        return None

    _, ok = wait_for(f"Job {name} finished", finished, timeout=timeout + 60)
    logs = sh("kubectl", "-n", namespace, "logs", f"job/{name}", timeout=120, check=False).stdout
    return ok, logs


def test_secure_group_serves_authenticated_clients_through_a_failover(namespace: str) -> None:
    apply_group(namespace, secure=True)
    before = wait_ready(namespace, RECOVERY_TIMEOUT_S)
    sts = kubectl_json("-n", namespace, "get", "statefulset", GROUP)
    script = sts["spec"]["template"]["spec"]["containers"][0]["command"][2]
    for flag in ("--tls-cert", "--require-auth", "--group-secret-file", "--zk-digest-file"):
        assert flag in script
    for secret in (f"{GROUP}-broker-tls", f"{GROUP}-group-secret", f"{GROUP}-zookeeper-digest"):
        kubectl_json("-n", namespace, "get", "secret", secret)

    topic = "secure-orders"
    apply({"apiVersion": "understudy.io/v1alpha1", "kind": "BrokerTopic",
           "metadata": {"name": topic, "namespace": namespace},
           "spec": {"groups": [GROUP], "queuesPerGroup": 2}})
    password = os.urandom(18).hex()
    sh("kubectl", "-n", namespace, "create", "secret", "generic", "app-password",
       f"--from-literal=password={password}")
    apply({"apiVersion": "understudy.io/v1alpha1", "kind": "BrokerUser",
           "metadata": {"name": "app", "namespace": namespace},
           "spec": {"authentication": {"type": "scram-sha-512", "passwordSecret": {"name": "app-password"}},
                    "acls": [{"resource": "topic", "name": topic, "operations": ["produce", "consume"]},
                             {"resource": "group", "name": "e2e-*", "operations": ["join", "commit"]}]}})

    def ready(kind: str, name: str) -> bool:
        st = kubectl_json("-n", namespace, "get", kind, name).get("status") or {}
        return condition(st, "Ready") == "True"

    wait_for("BrokerTopic Ready", lambda: ready("brokertopic", topic), timeout=120)
    wait_for("BrokerUser Ready", lambda: ready("brokeruser", "app"), timeout=120)

    brokers = f"{GROUP}-0.{namespace}.svc:9876,{GROUP}-1.{namespace}.svc:9876"
    creds = "--tls-ca /ca/ca.crt --user app --password-file /pw/password"
    ok, logs = run_client(namespace, "produce-ok", f"understudy produce -b {brokers} {creds} -t {topic} -n 200 --send-timeout 30")
    assert ok, logs
    ok, logs = run_client(namespace, "produce-anonymous", f"understudy produce -b {brokers} --tls-ca /ca/ca.crt -t {topic} -n 1 --send-timeout 10 --retries 0")
    assert not ok, logs
    assert "AUTHENTICATION_FAILED" in logs or "NOT_AUTHORIZED" in logs, logs
    ok, logs = run_client(namespace, "produce-denied", f"understudy produce -b {brokers} {creds} -t other-topic -n 1 --send-timeout 10 --retries 0")
    assert not ok, logs
    assert "NOT_AUTHORIZED" in logs, logs
    ok, logs = run_client(namespace, "produce-plaintext", f"understudy produce -b {brokers} -t {topic} -n 1 --send-timeout 10 --retries 0")
    assert not ok, logs

    # The master's pod goes: reads move to the slave, over TLS, for the authenticated user.
    sh(str(SCRIPTS / "chaos.sh"), "delete-pod", namespace, before["master"])
    ok, logs = run_client(namespace, "consume-through-failover", f"understudy consume -b {brokers} {creds} -t {topic} -g e2e-readers -n 200 --idle-timeout 60")
    assert ok, logs
    after = wait_ready(namespace, RECOVERY_TIMEOUT_S)
    assert after["epoch"] > before["epoch"]
    assert condition(after, "BackSyncComplete") == "True"

    # Nothing the operator wrote holds the password.
    for kind in ("secrets", "configmaps", "statefulsets", "brokerusers", "events"):
        text = sh("kubectl", "-n", namespace, "get", kind, "-o", "json").stdout
        own = json.loads(text)
        own["items"] = [i for i in own["items"] if i["metadata"]["name"] != "app-password"]
        dumped = json.dumps(own)
        assert password not in dumped, kind
        assert base64.b64encode(password.encode()).decode() not in dumped, kind
