"""BrokerGroup spec parsing: defaults, samples, and every kind of bad spec gets a clear,
path-prefixed message (and all problems are reported at once)."""

from __future__ import annotations

import copy
import pathlib
from typing import Any

import pytest
import yaml

from understudy_broker.model import Permission
from understudy_operator.k8s.spec import (
    PvcRetention,
    ReplicationMode,
    SpecError,
    parse_spec,
    validate_group_name,
)

ROOT = pathlib.Path(__file__).resolve().parents[1]
SAMPLES = sorted(p for p in (ROOT / "crds" / "samples").glob("*.yaml")
                 if not p.name.startswith(("topic-", "user-")))  # tests/test_k8s_topic.py, test_operator_security.py
ZK = "zk-0.zk:2181"


def good() -> dict[str, Any]:
    return {"image": "understudy/broker:1", "slaves": 2}


def problems(spec: Any, **kw: Any) -> tuple[str, ...]:
    with pytest.raises(SpecError) as info:
        parse_spec(spec, default_zk_connect=ZK, **kw)
    assert str(info.value).startswith("invalid BrokerGroup: ")
    return info.value.problems


def test_minimal_spec_gets_the_crd_defaults() -> None:
    spec = parse_spec({"image": "img:1"}, default_zk_connect=ZK)
    assert spec.slaves == 1
    assert spec.replicas == 2
    assert spec.permission is Permission.FULL
    assert spec.replication.mode is ReplicationMode.SYNC
    assert spec.replication.min_in_sync_replicas == 1
    assert spec.replication.auto_degrade is False
    assert spec.zookeeper.url == f"{ZK}/understudy"
    assert spec.zookeeper.session_timeout_ms == 4000
    assert (spec.failover.check_interval_ms, spec.failover.detection_checks) == (250, 2)
    assert spec.failover.back_sync_timeout_seconds == 30
    assert spec.storage.size == "1Gi"
    assert spec.storage.retention_on_delete is PvcRetention.RETAIN
    assert spec.monitoring.enabled
    assert spec.monitoring.interval == "15s"


def test_spec_connect_wins_over_operator_default() -> None:
    spec = parse_spec(
        {"image": "i", "zookeeper": {"connect": "a:1,b:2", "chroot": "/x/y"}},
        default_zk_connect=ZK,
    )
    assert spec.zookeeper.url == "a:1,b:2/x/y"


@pytest.mark.parametrize("path", SAMPLES, ids=lambda p: p.name)
def test_every_sample_parses(path: pathlib.Path) -> None:
    doc = yaml.safe_load(path.read_text())
    spec = parse_spec(doc["spec"], name=doc["metadata"]["name"], default_zk_connect=ZK)
    assert spec.image == doc["spec"]["image"]


def test_overrides_set_configured_permission_per_ordinal() -> None:
    raw = good() | {"permission": "WRITE", "brokers": [{"ordinal": 2, "permission": "NONE"}]}
    spec = parse_spec(raw, default_zk_connect=ZK)
    assert [spec.permission_of(i) for i in range(3)] == [
        Permission.WRITE,
        Permission.WRITE,
        Permission.NONE,
    ]


def test_async_group_without_slaves_is_valid() -> None:
    spec = parse_spec(
        {"image": "i", "slaves": 0, "replication": {"mode": "async"}}, default_zk_connect=ZK
    )
    assert spec.replicas == 1


@pytest.mark.parametrize(
    ("patch", "expected"),
    [
        ({"permission": "ALL"}, "spec.permission: 'ALL' is not one of FULL, WRITE, READ, NONE"),
        ({"replication": {"mode": "semi"}}, "spec.replication.mode: 'semi' is not one of sync, async"),
        ({"slaves": -1}, "spec.slaves: -1 is out of range [0, 15]"),
        ({"slaves": "2"}, "spec.slaves: must be an integer"),
        ({"slaves": True}, "spec.slaves: must be an integer"),
        (
            {"replication": {"minInSyncReplicas": 3}},
            "spec.replication.minInSyncReplicas: 3 is more than spec.slaves (2)",
        ),
        ({"slaves": 0}, "spec.replication.mode: sync replication needs at least one slave"),
        (
            {"replication": {"inSyncReplicas": 4}},
            "spec.replication.inSyncReplicas: 4 (copies, the master included) must be between "
            "minInSyncReplicas + 1 (2) and spec.slaves + 1 (3)",
        ),
        (
            {"replication": {"inSyncReplicas": 1}},
            "spec.replication.inSyncReplicas: 1 (copies, the master included) must be between "
            "minInSyncReplicas + 1 (2) and spec.slaves + 1 (3)",
        ),
        (
            {"replication": {"maxLagBytes": 1000}},
            "spec.replication.maxLagBytes: 1000 is out of range [1048576, 1099511627776]",
        ),
        (
            {"brokers": [{"ordinal": 3, "permission": "READ"}]},
            "spec.brokers[0].ordinal: 3 names no broker (the group has ordinals 0..2)",
        ),
        (
            {"brokers": [{"ordinal": 1, "permission": "READ"}, {"ordinal": 1, "permission": "NONE"}]},
            "spec.brokers[1].ordinal: 1 is listed twice",
        ),
        ({"brokers": [{"ordinal": 1}]}, "spec.brokers[0].permission: required"),
        ({"storage": {"size": "ten gigs"}}, "spec.storage.size: 'ten gigs' is not a resource quantity"),
        ({"storage": {"retentionOnDelete": "Keep"}}, "spec.storage.retentionOnDelete: 'Keep'"),
        ({"resources": {"limits": {"memory": "lots"}}}, "spec.resources.limits.memory: 'lots'"),
        (
            {"zookeeper": {"connect": "zk:2181/understudy"}},
            "spec.zookeeper.connect: 'zk:2181/understudy' must be host:port",
        ),
        ({"zookeeper": {"chroot": "understudy"}}, "spec.zookeeper.chroot: 'understudy' must be an absolute path"),
        # Ports past 65535 and paths ZooKeeper refuses passed the patterns and failed only
        # when the brokers and the controller tried to connect.
        ({"zookeeper": {"connect": "a:1,zk:99999"}},
         "spec.zookeeper.connect: port 99999 is outside 1-65535 in 'zk:99999'"),
        ({"zookeeper": {"connect": "zk-0.zk"}},  # the brokers' --zk refused it: pods crashed
         "spec.zookeeper.connect: expected HOST:PORT, got 'zk-0.zk' (every server with its port"),
        ({"zookeeper": {"chroot": "/a/../b"}}, "spec.zookeeper.chroot: chroot '/a/../b': '.' and '..'"),
        ({"zookeeper": {"chroot": "/zookeeper"}}, "spec.zookeeper.chroot: chroot '/zookeeper': /zookeeper is"),
        ({"zookeeper": {"sessionTimeoutMs": 10}}, "spec.zookeeper.sessionTimeoutMs: 10 is out of range"),
        ({"failover": {"detectionChecks": 0}}, "spec.failover.detectionChecks: 0 is out of range"),
        ({"failover": {"enabled": "yes"}}, "spec.failover.enabled: must be true or false"),
        ({"monitoring": {"interval": "often"}}, "spec.monitoring.interval: 'often' is not a duration"),
        ({"podTemplate": {"tolerations": "all"}}, "spec.podTemplate.tolerations: must be a list"),
        ({"podTemplate": {"nodeSelector": {"a": 1}}}, "spec.podTemplate.nodeSelector: must map"),
        ({"replicas": 3}, "spec.replicas: unknown field"),
        ({"failover": {"checkInterval": 5}}, "spec.failover.checkInterval: unknown field"),
        ({"storage": "big"}, "spec.storage: must be an object"),
        ({"image": ""}, "spec.image: must not be empty"),
    ],
)
def test_bad_spec_is_rejected_with_a_clear_message(patch: dict[str, Any], expected: str) -> None:
    raw = copy.deepcopy(good())
    raw.update(patch)
    found = problems(raw)
    assert any(expected in p for p in found), found


def test_missing_image_and_connect_are_both_reported() -> None:
    with pytest.raises(SpecError) as info:
        parse_spec({"slaves": 1}, default_zk_connect=None)
    assert info.value.problems == (
        "spec.image: required",
        "spec.zookeeper.connect: required (the operator was started without a default "
        "ZooKeeper connect string)",
    )


def test_every_problem_is_reported_at_once() -> None:
    found = problems({"image": "i", "slaves": -4, "permission": "X", "monitoring": {"interval": "?"}})
    assert len(found) == 3, found


def test_spec_that_is_not_an_object_is_rejected() -> None:
    assert problems([]) == ("spec: must be an object, got list",)


@pytest.mark.parametrize(
    ("name", "ok"),
    [("orders", True), ("a1-b2", True), ("Orders", False), ("1abc", False), ("x" * 41, False)],
)
def test_group_names(name: str, ok: bool) -> None:
    assert (validate_group_name(name) == []) is ok
    if not ok:
        assert problems(good(), name=name)[0].startswith("metadata.name: ")
