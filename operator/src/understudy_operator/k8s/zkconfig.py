"""Map a BrokerGroup spec to the document the operator writes to ``/groups/<group>/config``.

Why this module exists: brokers and the failover controller learn the group's shape — which
brokers exist, where they listen, their configured permissions and the replication and failover
policy — from this znode, not from Kubernetes (brokers never talk to the API server, and the same
brokers run in local mode without it). The document itself is defined once, in
:mod:`understudy_broker.zklayout` (``GroupConfig``); this module is only the pure mapping from
the Kubernetes spec to it, plus the stable in-cluster addresses of the brokers. The operator
compares encoded bytes, so an unchanged spec never causes a ZooKeeper write.
"""

from __future__ import annotations

from typing import Final

from understudy_broker.zklayout import (
    BrokerSpec,
    FailoverPolicy,
    GroupConfig,
    ReplicationPolicy,
    config_path,
)
from understudy_operator.k8s.spec import BrokerGroupSpec, ReplicationMode

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
    return config_path(group)


def build_group_config(*, spec: BrokerGroupSpec, group: str, namespace: str) -> GroupConfig:
    """The validated ``GroupConfig`` for one group (raises ``LayoutError`` only on a name
    that :func:`understudy_operator.k8s.spec.validate_group_name` would also reject)."""
    brokers = tuple(
        BrokerSpec(
            name=broker_name(group, ordinal),
            ordinal=ordinal,
            host=broker_host(group=group, namespace=namespace, ordinal=ordinal),
            port=BROKER_PORT,
            replication_port=REPLICATION_PORT,
            http_port=HTTP_PORT,
            permission=spec.permission_of(ordinal),
        )
        for ordinal in range(spec.replicas)
    )
    sync = spec.replication.mode is ReplicationMode.SYNC
    # minInSyncReplicas only means something with sync replication; an async group may have
    # fewer slaves than the (defaulted) value, and the shared document forbids that.
    repl = spec.replication
    min_insync = repl.min_in_sync_replicas if sync else 0
    return GroupConfig(
        group=group,
        brokers=brokers,
        failover=FailoverPolicy(
            enabled=spec.failover.enabled,
            check_interval_ms=spec.failover.check_interval_ms,
            detection_checks=spec.failover.detection_checks,
            backsync_timeout_s=float(spec.failover.back_sync_timeout_seconds),
        ),
        replication=ReplicationPolicy(
            sync=sync, min_insync=min_insync, auto_degrade=repl.auto_degrade,
            in_sync_replicas=repl.in_sync_replicas if sync else None,
            max_lag_bytes=repl.max_lag_bytes,
        ),
        session_timeout_ms=spec.zookeeper.session_timeout_ms,
    ).validate()


def encode_zk_config(*, spec: BrokerGroupSpec, group: str, namespace: str) -> bytes:
    """The canonical bytes to store at :func:`zk_config_path`."""
    return build_group_config(spec=spec, group=group, namespace=namespace).to_json()
