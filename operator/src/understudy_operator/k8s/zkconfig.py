"""The document the operator writes to ZooKeeper ``/groups/<group>/config``.

Why this module exists: brokers and the failover controller learn the group's shape —
which brokers exist, where they listen, their configured permissions and the replication and
failover policy — from this znode, not from Kubernetes (brokers never talk to the API server and
the same brokers run in local mode without it). Mapping a BrokerGroup spec to that document is a
pure function so the operator, the local cluster and the tests produce byte-identical configs,
and an unchanged spec never causes a ZooKeeper write (the operator compares encoded bytes).

Shape (version 1; keys are camelCase like the CRD)::

    {"version": 1, "group": "orders", "namespace": "shop",
     "brokers": [{"name": "orders-0", "ordinal": 0, "role": "master", "permission": "FULL",
                  "address": "orders-0.shop.svc:9876",
                  "replicationAddress": "orders-0.shop.svc:10912",
                  "httpAddress": "orders-0.shop.svc:9100"}, ...],
     "replication": {"mode": "sync", "minInSyncReplicas": 1, "autoDegrade": false},
     "failover": {"enabled": true, "checkIntervalMs": 250, "detectionChecks": 2,
                  "backSyncTimeoutSeconds": 30},
     "zookeeper": {"sessionTimeoutMs": 4000}}
"""

from __future__ import annotations

import json
from typing import Any, Final

from understudy_operator.k8s.spec import BrokerGroupSpec

CONFIG_VERSION: Final = 1
BROKER_PORT: Final = 9876
HTTP_PORT: Final = 9100
REPLICATION_PORT: Final = 10912


def broker_name(group: str, ordinal: int) -> str:
    """The broker's name: its StatefulSet pod name and its per-broker Service name."""
    return f"{group}-{ordinal}"


def broker_host(*, group: str, namespace: str, ordinal: int) -> str:
    """The stable DNS name of one broker: its per-broker Service."""
    return f"{broker_name(group, ordinal)}.{namespace}.svc"


def zk_config_path(group: str) -> str:
    """The znode path, relative to the chroot in ``spec.zookeeper.chroot``."""
    return f"/groups/{group}/config"


def build_zk_config(*, spec: BrokerGroupSpec, group: str, namespace: str) -> dict[str, Any]:
    """The ``config`` document for one group (see the module docstring for the shape)."""
    brokers = []
    for ordinal in range(spec.replicas):
        host = broker_host(group=group, namespace=namespace, ordinal=ordinal)
        brokers.append(
            {
                "name": broker_name(group, ordinal),
                "ordinal": ordinal,
                "role": spec.role_of(ordinal).value,
                "permission": spec.permission_of(ordinal).label,
                "address": f"{host}:{BROKER_PORT}",
                "replicationAddress": f"{host}:{REPLICATION_PORT}",
                "httpAddress": f"{host}:{HTTP_PORT}",
            }
        )
    return {
        "version": CONFIG_VERSION,
        "group": group,
        "namespace": namespace,
        "brokers": brokers,
        "replication": {
            "mode": spec.replication.mode.value,
            "minInSyncReplicas": spec.replication.min_in_sync_replicas,
            "autoDegrade": spec.replication.auto_degrade,
        },
        "failover": {
            "enabled": spec.failover.enabled,
            "checkIntervalMs": spec.failover.check_interval_ms,
            "detectionChecks": spec.failover.detection_checks,
            "backSyncTimeoutSeconds": spec.failover.back_sync_timeout_seconds,
        },
        "zookeeper": {"sessionTimeoutMs": spec.zookeeper.session_timeout_ms},
    }


def encode_zk_config(config: dict[str, Any]) -> bytes:
    """Canonical bytes (sorted keys, no whitespace) so equal configs compare equal."""
    return json.dumps(config, sort_keys=True, separators=(",", ":")).encode()
