"""ZooKeeper documents round-trip, and malformed ones give a clear LayoutError."""

from __future__ import annotations

import pytest

from understudy_broker.model import GroupState, Mode, Permission, Role
from understudy_broker.zklayout import (
    BrokerSpec,
    BrokerStatus,
    GroupConfig,
    LayoutError,
    ReplicationPolicy,
    decode_state,
    encode_state,
    status_path,
)


def _cfg(**kw: object) -> GroupConfig:
    brokers = (
        BrokerSpec("g1-0", 0, "127.0.0.1", 9000, 9001, 9002),
        BrokerSpec("g1-1", 1, "127.0.0.1", 9010, 9011, 9012, Permission.READ),
    )
    return GroupConfig(group="g1", brokers=brokers, **kw)  # type: ignore[arg-type]


def test_config_round_trip() -> None:
    cfg = _cfg()
    back = GroupConfig.from_json(cfg.to_json())
    assert back == cfg
    assert back.master.role is Role.MASTER
    assert [s.name for s in back.slaves] == ["g1-1"]
    quorum = _cfg(replication=ReplicationPolicy(min_insync=0, in_sync_replicas=2,
                                                auto_degrade=True, max_lag_bytes=1 << 20))
    assert GroupConfig.from_json(quorum.to_json()) == quorum


def test_state_and_status_round_trip() -> None:
    st = GroupState(Mode.SLAVE_CONSUME, 7, acting="g1-1", since=12.5, reason="master exited")
    assert decode_state(encode_state(st)) == st
    bs = BrokerStatus("g1-1", Permission.READ, 7, master_link=False, slave_links=("x",),
                      max_offset=123, backsync_epoch=6, ready=True, pid=42)
    assert BrokerStatus.from_json(bs.to_json()) == bs


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (b"{not json", "not JSON"),
        (b"[1,2]", "expected a JSON object"),
        (b'{"group":"g1"}', "malformed"),
        (b'{"group":"G_1","brokers":[]}', "DNS label"),
    ],
)
def test_bad_config_is_a_clear_error(data: bytes, match: str) -> None:
    with pytest.raises(LayoutError, match=match):
        GroupConfig.from_json(data)


def test_config_validation() -> None:
    with pytest.raises(LayoutError, match="minInSyncReplicas"):
        _cfg(replication=ReplicationPolicy(min_insync=2)).validate()
    with pytest.raises(LayoutError, match=r"inSyncReplicas=3 \(copies, the master included\) "
                       r"must be between minInSyncReplicas \+ 1 \(2\) and the group's 2"):
        _cfg(replication=ReplicationPolicy(in_sync_replicas=3)).validate()
    with pytest.raises(LayoutError, match="mode"):
        decode_state(b'{"mode":"PANIC","epoch":1}')
    with pytest.raises(LayoutError, match="DNS label"):
        status_path("g1", "Bad/Name")


def test_isr_record_round_trip_and_bad_records() -> None:
    from understudy_broker.zklayout import decode_isr, encode_isr, isr_path

    assert isr_path("g1") == "/groups/g1/isr"
    assert decode_isr(encode_isr(["s2", "s1"])) == frozenset({"s1", "s2"})
    assert decode_isr(encode_isr([])) == frozenset()
    for bad, match in ((b"{oops", "not JSON"), (b'{"inSync": "s1"}', "inSync"),
                       (b'{"inSync": [1]}', "inSync"), (b"[]", "inSync")):
        with pytest.raises(LayoutError, match=match):
            decode_isr(bad)
