"""Pure builders for the Kubernetes objects of one BrokerGroup.

Why this module exists: kopf handlers should only parse, plan, apply and patch status. The
objects themselves are computed here from a validated :class:`BrokerGroupSpec`, as plain dicts
(the dask-kubernetes ``build_*_spec`` style), so they can be unit-tested and checked with
``kubernetes-validate --strict`` without a cluster. Owner references are added by the caller
(``kopf.adopt``); builders take names and labels only.

Choices worth knowing:

* One StatefulSet per group; ordinal 0 is the master. Pods share one template, so the broker
  command is a tiny ``/bin/sh`` ``case`` on the pod's ordinal that ``exec``s the right
  ``understudy broker`` argv (no shell stays around; signals reach the broker).
* ``podManagementPolicy: Parallel``: with ``OrderedReady`` a dead master (ordinal 0) would block
  a restarted slave from starting — exactly when the group needs it.
* ``updateStrategy: OnDelete``: the operator rolls pods itself (slaves first, the master last
  through a planned handoff); a StatefulSet rolling update would restart the master while it is
  the only reader.
* Services publish not-ready addresses: replication and the route protocol must reach a broker
  that has no READ (and is therefore not ready for consumers).
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from typing import Any, Final

from understudy_operator.k8s.spec import BrokerGroupSpec, PvcRetention, ReplicationMode
from understudy_operator.k8s.zkconfig import (
    BROKER_PORT,
    HTTP_PORT,
    REPLICATION_PORT,
    broker_host,
    broker_name,
    encode_zk_config,
)

DATA_DIR: Final = "/data"
CONFIG_DIR: Final = "/etc/understudy"
RUN_AS_USER: Final = 10001
POD_NAME_ENV: Final = "POD_NAME"
LABEL_GROUP: Final = "understudy.io/group"
LABEL_SERVICE: Final = "understudy.io/service"
_POD_NAME: Final = object()  # placeholder in an argv: the pod's own name, from the downward API

Argv = list[str | object]


def selector_labels(group: str) -> dict[str, str]:
    """Labels that select the pods of one group (immutable: part of the StatefulSet selector)."""
    return {
        "app.kubernetes.io/name": "understudy-broker",
        "app.kubernetes.io/instance": group,
        LABEL_GROUP: group,
    }


def object_labels(group: str, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """Labels for every object of a group: the selector labels, component and manager, plus
    the caller's ``extra`` labels (which may not override the selector labels)."""
    labels = dict(extra or {})
    labels.update(
        {
            "app.kubernetes.io/component": "broker",
            "app.kubernetes.io/part-of": "understudy",
            "app.kubernetes.io/managed-by": "understudy-operator",
        }
    )
    labels.update(selector_labels(group))
    return labels


def headless_service_name(group: str) -> str:
    return f"{group}-headless"


def configmap_name(group: str) -> str:
    return f"{group}-config"


def broker_argv(*, spec: BrokerGroupSpec, group: str, namespace: str, ordinal: int) -> Argv:
    """The ``understudy broker`` argv of one broker (the CLI contract of the broker issue plus
    the HA issue's ``--zk`` flags). The ``--name`` value is a placeholder for the pod name,
    rendered by :func:`render_command`."""
    argv: Argv = [
        "understudy",
        "broker",
        "--data-dir",
        DATA_DIR,
        "--host",
        "0.0.0.0",
        "--port",
        str(BROKER_PORT),
        "--http-port",
        str(HTTP_PORT),
        "--replication-port",
        str(REPLICATION_PORT),
    ]
    if ordinal != 0:
        master = broker_host(group=group, namespace=namespace, ordinal=0)
        argv += ["--role", "slave", "--master", f"{master}:{REPLICATION_PORT}"]
    sync = spec.replication.mode is ReplicationMode.SYNC
    argv.append("--sync" if sync else "--async")
    if ordinal == 0 and sync:
        argv += [
            "--min-insync-replicas",
            str(spec.replication.min_in_sync_replicas),
            "--auto-degrade" if spec.replication.auto_degrade else "--no-auto-degrade",
            "--max-lag-bytes",
            str(spec.replication.max_lag_bytes),
        ]
        if spec.replication.in_sync_replicas is not None:
            argv += ["--in-sync-replicas", str(spec.replication.in_sync_replicas)]
    argv += [
        "--name",
        _POD_NAME,
        "--group",
        group,
        "--permission",
        spec.permission_of(ordinal).label,
    ]
    for peer in range(spec.replicas):
        if peer != ordinal:
            host = broker_host(group=group, namespace=namespace, ordinal=peer)
            argv += ["--peer", f"{broker_name(group, peer)}={host}:{BROKER_PORT}"]
    argv += [
        "--zk",
        spec.zookeeper.url,
        "--zk-session-timeout-ms",
        str(spec.zookeeper.session_timeout_ms),
    ]
    return argv


def render_command(argv: Sequence[str | object]) -> str:
    """Shell-quote ``argv``; the pod-name placeholder becomes ``"$POD_NAME"``."""
    return " ".join(
        f'"${POD_NAME_ENV}"' if arg is _POD_NAME else shlex.quote(str(arg)) for arg in argv
    )


def broker_script(*, spec: BrokerGroupSpec, group: str, namespace: str) -> str:
    """The container's ``/bin/sh -c`` script: pick the argv by the pod's ordinal and exec it."""
    lines = ["set -eu", f'case "${{{POD_NAME_ENV}##*-}}" in']
    for ordinal in range(spec.replicas):
        argv = broker_argv(spec=spec, group=group, namespace=namespace, ordinal=ordinal)
        lines.append(f"  {ordinal}) exec {render_command(argv)} ;;")
    lines.append(
        f'  *) echo "understudy: pod ${POD_NAME_ENV} has no broker ordinal in group '
        f'{group} (slaves={spec.slaves})" >&2; exit 64 ;;'
    )
    lines.append("esac")
    return "\n".join(lines) + "\n"


def _default_affinity(group: str) -> dict[str, Any]:
    """Prefer spreading a group's brokers over nodes: a node loss should not take the master
    and its slave together."""
    return {
        "podAntiAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": 100,
                    "podAffinityTerm": {
                        "topologyKey": "kubernetes.io/hostname",
                        "labelSelector": {"matchLabels": selector_labels(group)},
                    },
                }
            ]
        }
    }


def _probe(path: str, *, period: int, failures: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": "http"},
        "periodSeconds": period,
        "timeoutSeconds": 2,
        "failureThreshold": failures,
    }


def build_statefulset(
    *,
    spec: BrokerGroupSpec,
    group: str,
    namespace: str,
    labels: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The group's StatefulSet (ordinal 0 master, ``spec.slaves`` slaves)."""
    meta_labels = object_labels(group, labels)
    container: dict[str, Any] = {
        "name": "broker",
        "image": spec.image,
        "imagePullPolicy": spec.image_pull_policy,
        "command": ["/bin/sh", "-c", broker_script(spec=spec, group=group, namespace=namespace)],
        "env": [
            {"name": POD_NAME_ENV, "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {
                "name": "POD_NAMESPACE",
                "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}},
            },
            {"name": "PYTHONUNBUFFERED", "value": "1"},
            {"name": "PYTHONDONTWRITEBYTECODE", "value": "1"},
        ],
        "ports": [
            {"name": "broker", "containerPort": BROKER_PORT, "protocol": "TCP"},
            {"name": "replication", "containerPort": REPLICATION_PORT, "protocol": "TCP"},
            {"name": "http", "containerPort": HTTP_PORT, "protocol": "TCP"},
        ],
        "startupProbe": _probe("/healthz", period=2, failures=90),
        "livenessProbe": _probe("/healthz", period=10, failures=3),
        "readinessProbe": _probe("/readyz", period=2, failures=2),
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": RUN_AS_USER,
            "runAsGroup": RUN_AS_USER,
            "readOnlyRootFilesystem": True,
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": [
            {"name": "data", "mountPath": DATA_DIR},
            {"name": "tmp", "mountPath": "/tmp"},
            {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
        ],
    }
    if spec.resources:
        container["resources"] = {k: dict(v) for k, v in spec.resources.items()}
    pod_spec: dict[str, Any] = {
        "containers": [container],
        "terminationGracePeriodSeconds": 30,
        "enableServiceLinks": False,
        "automountServiceAccountToken": False,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": RUN_AS_USER,
            "runAsGroup": RUN_AS_USER,
            "fsGroup": RUN_AS_USER,
            "fsGroupChangePolicy": "OnRootMismatch",
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "affinity": dict(spec.pod_template.affinity or _default_affinity(group)),
        "volumes": [
            {"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}},
            {"name": "config", "configMap": {"name": configmap_name(group)}},
        ],
    }
    if spec.pod_template.tolerations:
        pod_spec["tolerations"] = [dict(t) for t in spec.pod_template.tolerations]
    if spec.pod_template.node_selector:
        pod_spec["nodeSelector"] = dict(spec.pod_template.node_selector)
    if spec.pod_template.priority_class_name:
        pod_spec["priorityClassName"] = spec.pod_template.priority_class_name

    claim_spec: dict[str, Any] = {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": spec.storage.size}},
    }
    if spec.storage.storage_class_name:
        claim_spec["storageClassName"] = spec.storage.storage_class_name
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": group, "namespace": namespace, "labels": meta_labels},
        "spec": {
            "serviceName": headless_service_name(group),
            "replicas": spec.replicas,
            "podManagementPolicy": "Parallel",
            "updateStrategy": {"type": "OnDelete"},
            "selector": {"matchLabels": selector_labels(group)},
            "persistentVolumeClaimRetentionPolicy": {
                "whenDeleted": spec.storage.retention_on_delete.value,
                # A scaled-away slave's log is stale; keep it anyway so scaling back up is a
                # catch-up, not a full copy. Deleting the group honours retentionOnDelete.
                "whenScaled": PvcRetention.RETAIN.value,
            },
            "template": {
                "metadata": {"labels": meta_labels},
                "spec": pod_spec,
            },
            "volumeClaimTemplates": [
                {
                    "apiVersion": "v1",
                    "kind": "PersistentVolumeClaim",
                    "metadata": {"name": "data", "labels": selector_labels(group)},
                    "spec": claim_spec,
                }
            ],
        },
    }


def _service_ports() -> list[dict[str, Any]]:
    return [
        {"name": "broker", "port": BROKER_PORT, "targetPort": "broker", "protocol": "TCP"},
        {
            "name": "replication",
            "port": REPLICATION_PORT,
            "targetPort": "replication",
            "protocol": "TCP",
        },
        {"name": "http", "port": HTTP_PORT, "targetPort": "http", "protocol": "TCP"},
    ]


def build_headless_service(
    *,
    group: str,
    namespace: str,
    labels: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The StatefulSet's governing Service (pod DNS) and the ServiceMonitor's scrape target."""
    meta_labels = object_labels(group, labels) | {LABEL_SERVICE: "headless"}
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": headless_service_name(group),
            "namespace": namespace,
            "labels": meta_labels,
        },
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": selector_labels(group),
            "ports": _service_ports(),
        },
    }


def build_broker_services(
    *,
    spec: BrokerGroupSpec,
    group: str,
    namespace: str,
    labels: Mapping[str, str] | None = None,
) -> list[dict[str, Any]]:
    """One ClusterIP Service per broker, named like its pod: the stable address in the ZK
    config, the route and a slave's ``--master``."""
    services = []
    for ordinal in range(spec.replicas):
        name = broker_name(group, ordinal)
        services.append(
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {
                    "name": name,
                    "namespace": namespace,
                    "labels": object_labels(group, labels)
                    | {LABEL_SERVICE: "broker", "understudy.io/role": spec.role_of(ordinal).value},
                },
                "spec": {
                    "type": "ClusterIP",
                    "publishNotReadyAddresses": True,
                    "selector": selector_labels(group)
                    | {"statefulset.kubernetes.io/pod-name": name},
                    "ports": _service_ports(),
                },
            }
        )
    return services


def build_configmap(
    *,
    spec: BrokerGroupSpec,
    group: str,
    namespace: str,
    labels: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The group's ConfigMap: the ZooKeeper config document, mounted read-only into the
    brokers at ``/etc/understudy/config.json`` for inspection and static fallback."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": configmap_name(group),
            "namespace": namespace,
            "labels": object_labels(group, labels),
        },
        "data": {"config.json": encode_zk_config(spec=spec, group=group, namespace=namespace).decode()},
    }


def build_pdb(
    *,
    group: str,
    namespace: str,
    labels: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """At most one broker of a group voluntarily down at a time (drains, node upgrades)."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": group, "namespace": namespace, "labels": object_labels(group, labels)},
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector_labels(group)}},
    }


def build_servicemonitor(
    *,
    spec: BrokerGroupSpec,
    group: str,
    namespace: str,
    labels: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A prometheus-operator ServiceMonitor scraping every broker once, through the headless
    Service (selecting the per-broker Services too would scrape each broker twice). The caller
    creates it only when ``spec.monitoring.enabled`` and the CRD exists."""
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": {"name": group, "namespace": namespace, "labels": object_labels(group, labels)},
        "spec": {
            "selector": {"matchLabels": selector_labels(group) | {LABEL_SERVICE: "headless"}},
            "namespaceSelector": {"matchNames": [namespace]},
            "endpoints": [
                {"port": "http", "path": "/metrics", "interval": spec.monitoring.interval}
            ],
        },
    }


def build_all(
    *,
    spec: BrokerGroupSpec,
    group: str,
    namespace: str,
    labels: Mapping[str, str] | None = None,
) -> list[dict[str, Any]]:
    """Every object of a group in apply order (ConfigMap and Services before the pods that
    use them); the ServiceMonitor only when monitoring is enabled."""
    objects = [
        build_configmap(spec=spec, group=group, namespace=namespace, labels=labels),
        build_headless_service(group=group, namespace=namespace, labels=labels),
        *build_broker_services(spec=spec, group=group, namespace=namespace, labels=labels),
        build_pdb(group=group, namespace=namespace, labels=labels),
        build_statefulset(spec=spec, group=group, namespace=namespace, labels=labels),
    ]
    if spec.monitoring.enabled:
        objects.append(
            build_servicemonitor(spec=spec, group=group, namespace=namespace, labels=labels)
        )
    return objects
