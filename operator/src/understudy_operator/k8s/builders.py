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
* Security (``spec.security``, on by default; docs/security-kubernetes.md): each broker gets
  its certificate, the CA bundle, the group secret and the ZooKeeper digest as files from
  Secrets mounted read-only (mode 0440, group-readable through ``fsGroup``), never as
  environment values or arguments; the argv names only the files. The pod template carries
  ``understudy.io/tls-revision`` (``k8s/security.py:tls_revision``): a renewed certificate
  or a new CA bundle changes it, and the operator's rollout restarts the brokers safely.
* A NetworkPolicy per group (``spec.networkPolicy``, on by default) admits the client port
  from the namespace (or the configured peers), every broker and the operator, the
  replication port from the group's own pods only, and the HTTP port from Prometheus.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from typing import Any, Final

from understudy_operator.k8s.certs import BROKER_COMMON_NAME
from understudy_operator.k8s.security import (
    ANNOTATION_SECURITY_MODE,
    ANNOTATION_TLS_REVISION,
    CA_CERT_KEY,
    GROUP_SECRET_DIR,
    GROUP_SECRET_KEY,
    SECRET_FILE_MODE,
    TLS_DIR,
    ZK_DIGEST_DIR,
    ZK_DIGEST_KEY,
    SecurityInputs,
    broker_tls_secret_name,
    group_secret_name,
    security_mode,
    zk_digest_secret_name,
)
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


def broker_argv(*, spec: BrokerGroupSpec, group: str, namespace: str, ordinal: int,
                zk_digest: bool = False) -> Argv:
    """The ``understudy broker`` argv of one broker (the CLI contract of the broker issue plus
    the HA issue's ``--zk`` flags and the security issue's file flags). The ``--name`` value
    is a placeholder for the pod name, rendered by :func:`render_command`. ``zk_digest``:
    the brokers authenticate to ZooKeeper with the digest Secret mounted for them."""
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
    argv += security_argv(spec=spec, group=group, ordinal=ordinal, zk_digest=zk_digest)
    return argv


def security_argv(*, spec: BrokerGroupSpec, group: str, ordinal: int, zk_digest: bool) -> Argv:
    """The broker's security flags: files only, never a secret value."""
    sec = spec.security
    argv: Argv = []
    if sec.tls:
        name = broker_name(group, ordinal)
        argv += ["--tls-cert", f"{TLS_DIR}/{name}.crt", "--tls-key", f"{TLS_DIR}/{name}.key",
                 "--tls-ca", f"{TLS_DIR}/{CA_CERT_KEY}",
                 "--tls-client-auth", sec.tls_client_auth.value]
    if sec.require_auth:
        argv.append("--require-auth")
    if sec.tls or sec.require_auth:
        # Brokers call each other's client ports with their own certificate (CN
        # understudy-broker): back-sync, peer probes, escaped messages.
        for user in (BROKER_COMMON_NAME, *sec.super_users):
            argv += ["--super-user", user]
    if sec.group_secret:
        argv += ["--group-secret-file", f"{GROUP_SECRET_DIR}/{GROUP_SECRET_KEY}"]
    if zk_digest:
        argv += ["--zk-digest-file", f"{ZK_DIGEST_DIR}/{ZK_DIGEST_KEY}"]
    return argv


def render_command(argv: Sequence[str | object]) -> str:
    """Shell-quote ``argv``; the pod-name placeholder becomes ``"$POD_NAME"``."""
    return " ".join(
        f'"${POD_NAME_ENV}"' if arg is _POD_NAME else shlex.quote(str(arg)) for arg in argv
    )


def broker_script(*, spec: BrokerGroupSpec, group: str, namespace: str,
                  zk_digest: bool = False) -> str:
    """The container's ``/bin/sh -c`` script: pick the argv by the pod's ordinal and exec it."""
    lines = ["set -eu", f'case "${{{POD_NAME_ENV}##*-}}" in']
    for ordinal in range(spec.replicas):
        argv = broker_argv(spec=spec, group=group, namespace=namespace, ordinal=ordinal,
                           zk_digest=zk_digest)
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


def _secret_volume(name: str, secret: str) -> dict[str, Any]:
    return {"name": name, "secret": {"secretName": secret, "defaultMode": SECRET_FILE_MODE}}


def security_volumes(*, spec: BrokerGroupSpec, group: str, zk_digest: bool
                     ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The Secret volumes and their read-only mounts for the security flags."""
    wanted = []
    if spec.security.tls:
        wanted.append(("tls", broker_tls_secret_name(group), TLS_DIR))
    if spec.security.group_secret:
        wanted.append(("group-secret", group_secret_name(group), GROUP_SECRET_DIR))
    if zk_digest:
        wanted.append(("zookeeper-digest", zk_digest_secret_name(group), ZK_DIGEST_DIR))
    volumes = [_secret_volume(name, secret) for name, secret, _ in wanted]
    mounts = [{"name": name, "mountPath": path, "readOnly": True} for name, _, path in wanted]
    return volumes, mounts


def build_statefulset(
    *,
    spec: BrokerGroupSpec,
    group: str,
    namespace: str,
    labels: Mapping[str, str] | None = None,
    security: SecurityInputs | None = None,
) -> dict[str, Any]:
    """The group's StatefulSet (ordinal 0 master, ``spec.slaves`` slaves). ``security``
    adds what the builders cannot know: the certificates' revision and whether the
    operator has ZooKeeper digest credentials for the brokers."""
    inputs = security or SecurityInputs()
    meta_labels = object_labels(group, labels)
    sec_volumes, sec_mounts = security_volumes(spec=spec, group=group,
                                               zk_digest=inputs.zk_digest)
    container: dict[str, Any] = {
        "name": "broker",
        "image": spec.image,
        "imagePullPolicy": spec.image_pull_policy,
        "command": ["/bin/sh", "-c", broker_script(spec=spec, group=group, namespace=namespace,
                                                   zk_digest=inputs.zk_digest)],
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
            *sec_mounts,
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
            *sec_volumes,
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
    template_meta: dict[str, Any] = {"labels": meta_labels}
    if spec.security.tls and inputs.tls_revision:
        template_meta["annotations"] = {ANNOTATION_TLS_REVISION: inputs.tls_revision}
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": group, "namespace": namespace, "labels": meta_labels,
                     "annotations": {ANNOTATION_SECURITY_MODE: security_mode(spec.security)}},
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
                "metadata": template_meta,
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
    security: SecurityInputs | None = None,
) -> dict[str, Any]:
    """The group's ConfigMap: the ZooKeeper config document, mounted read-only into the
    brokers at ``/etc/understudy/config.json`` for inspection and static fallback; with TLS,
    also ``ca.crt``, the CA bundle clients in the namespace mount to verify the brokers
    (public: certificates only)."""
    data = {"config.json": encode_zk_config(spec=spec, group=group, namespace=namespace).decode()}
    if spec.security.tls and security is not None and security.ca_bundle:
        data[CA_CERT_KEY] = security.ca_bundle
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": configmap_name(group),
            "namespace": namespace,
            "labels": object_labels(group, labels),
        },
        "data": data,
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


#: Pods of every broker group, in any namespace (cross-group calls: escaped messages,
#: the route of another group's queues).
BROKER_PEER: Final = {"namespaceSelector": {},
                      "podSelector": {"matchLabels": {"app.kubernetes.io/name":
                                                      "understudy-broker"}}}
#: The operator's pods (the chart's selector label), in any namespace: it asks brokers for
#: a topic's backlog on the client port.
OPERATOR_PEER: Final = {"namespaceSelector": {},
                        "podSelector": {"matchLabels": {"app.kubernetes.io/name":
                                                        "understudy-operator"}}}
#: Prometheus pods as prometheus-operator labels them, in any namespace.
PROMETHEUS_PEER: Final = {"namespaceSelector": {},
                          "podSelector": {"matchLabels": {"app.kubernetes.io/name":
                                                          "prometheus"}}}


def network_policy_name(group: str) -> str:
    return f"{group}-brokers"


def build_network_policy(
    *,
    spec: BrokerGroupSpec,
    group: str,
    namespace: str,
    labels: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Ingress to the group's pods: the client port from ``networkPolicy.clientFrom``
    (default every pod of the namespace) plus every broker and the operator; the
    replication port from this group's pods only; the HTTP port (metrics, ``/permissions``)
    from ``networkPolicy.metricsFrom`` (default Prometheus). Kubelet probes come from the
    pod's own node, which NetworkPolicies always admit. Egress is not restricted."""
    np = spec.network_policy
    clients = [dict(p) for p in np.client_from] if np.client_from is not None else [
        {"podSelector": {}}]
    metrics = [dict(p) for p in np.metrics_from] if np.metrics_from is not None else [
        dict(PROMETHEUS_PEER)]

    def port(number: int) -> list[dict[str, Any]]:
        return [{"protocol": "TCP", "port": number}]

    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": network_policy_name(group), "namespace": namespace,
                     "labels": object_labels(group, labels)},
        "spec": {
            "podSelector": {"matchLabels": selector_labels(group)},
            "policyTypes": ["Ingress"],
            "ingress": [
                {"from": [*clients, dict(BROKER_PEER), dict(OPERATOR_PEER)],
                 "ports": port(BROKER_PORT)},
                {"from": [{"podSelector": {"matchLabels": selector_labels(group)}}],
                 "ports": port(REPLICATION_PORT)},
                {"from": metrics, "ports": port(HTTP_PORT)},
            ],
        },
    }


def build_all(
    *,
    spec: BrokerGroupSpec,
    group: str,
    namespace: str,
    labels: Mapping[str, str] | None = None,
    security: SecurityInputs | None = None,
) -> list[dict[str, Any]]:
    """Every object of a group in apply order (ConfigMap, Services and the NetworkPolicy
    before the pods that use them); the ServiceMonitor only when monitoring is enabled. The
    Secrets the pods mount are written by the handler before these (handlers/security.py)."""
    objects = [
        build_configmap(spec=spec, group=group, namespace=namespace, labels=labels,
                        security=security),
        build_headless_service(group=group, namespace=namespace, labels=labels),
        *build_broker_services(spec=spec, group=group, namespace=namespace, labels=labels),
        build_pdb(group=group, namespace=namespace, labels=labels),
    ]
    if spec.network_policy.enabled:
        objects.append(build_network_policy(spec=spec, group=group, namespace=namespace,
                                            labels=labels))
    objects.append(build_statefulset(spec=spec, group=group, namespace=namespace, labels=labels,
                                     security=security))
    if spec.monitoring.enabled:
        objects.append(
            build_servicemonitor(spec=spec, group=group, namespace=namespace, labels=labels)
        )
    return objects
