"""Spec -> ZooKeeper ``config`` document, through the shared zklayout codec."""

from __future__ import annotations

from typing import Any

from understudy_broker.model import Permission, Role
from understudy_broker.zklayout import GroupConfig
from understudy_operator.k8s.spec import BrokerGroupSpec, parse_spec
from understudy_operator.k8s.zkconfig import build_group_config, encode_zk_config, zk_config_path


def spec_of(**raw: Any) -> BrokerGroupSpec:
    return parse_spec({"image": "i", **raw}, default_zk_connect="zk:2181")


def test_config_round_trips_through_the_shared_codec() -> None:
    spec = spec_of(
        slaves=2,
        brokers=[{"ordinal": 2, "permission": "NONE"}],
        replication={"minInSyncReplicas": 1, "inSyncReplicas": 3, "autoDegrade": True,
                     "maxLagBytes": 8 << 20},
        failover={"checkIntervalMs": 100, "detectionChecks": 3, "backSyncTimeoutSeconds": 9},
        zookeeper={"sessionTimeoutMs": 6000},
    )
    data = encode_zk_config(spec=spec, group="orders", namespace="shop")
    config = GroupConfig.from_json(data)
    assert [b.name for b in config.brokers] == ["orders-0", "orders-1", "orders-2"]
    assert [b.role for b in config.brokers] == [Role.MASTER, Role.SLAVE, Role.SLAVE]
    assert [b.permission for b in config.brokers] == [Permission.FULL, Permission.FULL, Permission.NONE]
    assert config.master.address == "orders-0.shop.svc:9876"
    assert config.master.replication_port == 10912
    assert config.master.http_port == 9100
    assert config.replication.sync is True
    assert config.replication.min_insync == 1
    assert config.replication.in_sync_replicas == 3
    assert config.replication.auto_degrade is True
    assert config.replication.max_lag_bytes == 8 << 20
    assert (config.failover.check_interval_ms, config.failover.detection_checks) == (100, 3)
    assert config.failover.backsync_timeout_s == 9.0
    assert config.session_timeout_ms == 6000


def test_encoding_is_canonical() -> None:
    a = encode_zk_config(spec=spec_of(slaves=1), group="g", namespace="n")
    b = encode_zk_config(spec=spec_of(slaves=1), group="g", namespace="n")
    c = encode_zk_config(spec=spec_of(slaves=2), group="g", namespace="n")
    assert a == b
    assert a != c


def test_async_group_without_slaves() -> None:
    config = build_group_config(
        spec=spec_of(slaves=0, replication={"mode": "async"}), group="solo", namespace="n"
    )
    assert config.replication.sync is False
    assert config.replication.min_insync == 0
    assert config.slaves == ()


def test_path() -> None:
    assert zk_config_path("orders") == "/groups/orders/config"
