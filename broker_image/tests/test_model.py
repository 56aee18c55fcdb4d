"""Effective permission: the rules of DESIGN.md, case by case."""

from __future__ import annotations

import re

import pytest

from understudy_broker.model import (
    GroupState,
    Health,
    Mode,
    Permission,
    Role,
    effective_permission,
    is_isolated,
    parse_address,
    parse_address_list,
    parse_zk_connect,
)

NORMAL = GroupState(Mode.NORMAL, 1)
SC_S1 = GroupState(Mode.SLAVE_CONSUME, 3, acting="s1")


def eff(role: Role, state: GroupState | None, health: Health | None = None, name: str = "s1",
        configured: Permission = Permission.FULL) -> Permission:
    return effective_permission(role=role, name=name, configured=configured, state=state,
                                health=health or Health())


def test_master_normal_gets_configured() -> None:
    assert eff(Role.MASTER, NORMAL, configured=Permission.WRITE) is Permission.WRITE


@pytest.mark.parametrize("mode", [Mode.FENCING, Mode.SLAVE_CONSUME, Mode.RECOVERING])
def test_master_outside_normal_gets_none(mode: Mode) -> None:
    assert eff(Role.MASTER, GroupState(mode, 2, acting="s1")) is Permission.NONE


def test_isolated_master_fences_itself() -> None:
    h = Health(zk_live=False, zk_lost_for=5, fence_after=2, slaves_assigned=True,
               slave_connected=False, slave_once_connected=True)
    assert is_isolated(h)
    assert eff(Role.MASTER, NORMAL, h) is Permission.NONE


@pytest.mark.parametrize(
    "override",
    [
        {"slaves_assigned": False},  # no slave configured: never fences itself
        {"slave_once_connected": False},  # slave never connected
        {"slave_connected": True},  # a slave is back
        {"zk_live": True, "zk_lost_for": 0.0},  # ZooKeeper is back
        {"zk_lost_for": 1.0},  # not yet past the fence time
    ],
)
def test_isolation_exceptions(override: dict[str, object]) -> None:
    base = dict(zk_live=False, zk_lost_for=5.0, fence_after=2.0, slaves_assigned=True,
                slave_connected=False, slave_once_connected=True)
    base.update(override)
    h = Health(**base)  # type: ignore[arg-type]
    assert not is_isolated(h)
    assert eff(Role.MASTER, NORMAL, h) is Permission.FULL


def test_slave_reads_only_when_acting_with_live_session() -> None:
    assert eff(Role.SLAVE, SC_S1, name="s1") is Permission.READ
    assert eff(Role.SLAVE, SC_S1, name="s2") is Permission.NONE
    assert eff(Role.SLAVE, SC_S1, Health(zk_live=False), name="s1") is Permission.NONE
    assert eff(Role.SLAVE, NORMAL, name="s1") is Permission.NONE
    assert eff(Role.SLAVE, SC_S1, name="s1", configured=Permission.WRITE) is Permission.NONE


def test_lapsed_lease_masks_read_only() -> None:
    lapsed = Health(lease_valid=False)
    assert eff(Role.MASTER, NORMAL, lapsed) is Permission.WRITE
    assert eff(Role.SLAVE, SC_S1, lapsed, name="s1") is Permission.NONE


def test_static_mode_without_coordination() -> None:
    assert eff(Role.MASTER, None, configured=Permission.FULL) is Permission.FULL
    assert eff(Role.SLAVE, None, configured=Permission.FULL) is Permission.READ
    assert eff(Role.SLAVE, None, configured=Permission.NONE) is Permission.NONE


def test_permission_parse() -> None:
    assert Permission.parse("full") is Permission.FULL
    assert Permission.parse("2") is Permission.WRITE
    with pytest.raises(ValueError, match="expected one of"):
        Permission.parse("admin")


def test_an_address_is_host_colon_port_with_a_port_in_1_to_65535() -> None:
    assert parse_address("127.0.0.1:9876") == ("127.0.0.1", 9876)
    assert parse_address("broker-0.g1.svc:1") == ("broker-0.g1.svc", 1)
    assert parse_address("h:65535") == ("h", 65535)
    for bad in ("nohost", "h:", ":9", "h:x", "h:-1", "h: 9", "h:\u00b2", "h:\u0663", ""):
        with pytest.raises(ValueError, match=f"expected HOST:PORT, got {bad!r}"):
            parse_address(bad)
    for bad, port in (("h:0", 0), ("h:65536", 65536)):
        with pytest.raises(ValueError, match=f"port {port} is outside 1-65535 in {bad!r}"):
            parse_address(bad)


def test_a_zookeeper_connect_string_is_servers_and_a_chroot_zookeeper_takes() -> None:
    assert parse_zk_connect("127.0.0.1:2181") == ([("127.0.0.1", 2181)], None)
    assert parse_zk_connect("zk-0.zk:2181, zk-1.zk:2182/understudy/prod") == (
        [("zk-0.zk", 2181), ("zk-1.zk", 2182)], "/understudy/prod")
    assert parse_zk_connect("[::1]:2181/a b.c-d_e") == ([("[::1]", 2181)], "/a b.c-d_e")
    for bad, says in (
        ("", "expected HOST:PORT[,HOST:PORT...][/CHROOT], got ''"),
        ("/understudy", "expected HOST:PORT[,"),
        ("a:1,,b:2", "expected HOST:PORT[,"),
        ("a:1, ", "expected HOST:PORT[,"),
        ("nohostport", "expected HOST:PORT, got 'nohostport'"),
        ("127.0.0.1:99999/understudy", "port 99999 is outside 1-65535 in '127.0.0.1:99999'"),
        ("zk:2181/", "chroot '/' has an empty part"),
        ("zk:2181/a//b", "chroot '/a//b' has an empty part"),
        ("zk:2181/a/", "chroot '/a/' has an empty part"),
        ("zk:2181/a/../b", "'.' and '..' are not path parts"),
        ("zk:2181/.", "'.' and '..' are not path parts"),
        ("zk:2181/a\tb", "does not take the character '\\t'"),
        ("zk:2181/a\x85", "does not take the character"),
        ("zk:2181/zookeeper", "/zookeeper is ZooKeeper's own"),
        ("zk:2181/zookeeper/quota", "/zookeeper is ZooKeeper's own"),
    ):
        with pytest.raises(ValueError, match=re.escape(says)):
            parse_zk_connect(bad)
    assert parse_zk_connect("zk:2181/zookeepers")[1] == "/zookeepers"  # only /zookeeper itself


def test_an_address_list_is_comma_lists_of_host_port_skipping_empty_entries() -> None:
    assert parse_address_list(["a:1, b:2", "c:3,"]) == ["a:1", "b:2", "c:3"]
    assert parse_address_list(["a:1,,b:2"]) == ["a:1", "b:2"]
    with pytest.raises(ValueError, match=re.escape("expected HOST:PORT, got 'b'")):
        parse_address_list(["a:1,b"])
    with pytest.raises(ValueError, match="port 0 is outside 1-65535"):
        parse_address_list(["a:0"])
    for empty in ([], [""], [" , ,"]):
        with pytest.raises(ValueError, match="at least one HOST:PORT is needed"):
            parse_address_list(empty)
