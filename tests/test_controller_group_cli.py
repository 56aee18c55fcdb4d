"""``understudy group status`` and ``group force-mode`` against a real ZooKeeper."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from kazoo.client import KazooClient

from understudy_broker.model import GroupState, Mode, Permission
from understudy_broker.zklayout import (
    BrokerStatus,
    config_path,
    decode_state,
    encode_state,
    live_path,
    state_path,
    status_path,
)
from understudy_harness.testing import paper_group
from understudy_operator.cli.group import group as group_cmd

pytestmark = pytest.mark.integration

GROUP = "g1"


@pytest.fixture
def admin(admin: KazooClient) -> KazooClient:
    """The shared admin client, with this module's group config written."""
    admin.create(config_path(GROUP), paper_group(GROUP, "m", "s1", "s2").to_json(),
                 makepath=True)
    return admin


def put(admin: KazooClient, *, state: GroupState, live: tuple[str, ...],
        statuses: dict[str, BrokerStatus]) -> None:
    if admin.exists(state_path(GROUP)):
        admin.set(state_path(GROUP), encode_state(state))
    else:
        admin.create(state_path(GROUP), encode_state(state), makepath=True)
    for name in live:
        admin.create(live_path(GROUP, name), b"{}", ephemeral=True, makepath=True)
    for name, st in statuses.items():
        admin.create(status_path(GROUP, name), st.to_json(), makepath=True)


def run(zk: str, *args: str) -> tuple[int, str]:
    r = CliRunner().invoke(group_cmd, [args[0], "--zk", zk, "--group", GROUP, *args[1:]])
    return r.exit_code, r.output


def state(admin: KazooClient) -> GroupState:
    return decode_state(admin.get(state_path(GROUP))[0])


def test_status_json(zk: str, admin: KazooClient) -> None:
    put(admin, state=GroupState(Mode.SLAVE_CONSUME, 3, acting="s1", reason="test"), live=("s1",),
        statuses={"s1": BrokerStatus("s1", Permission.READ, 3, max_offset=7)})
    code, out = run(zk, "status", "--json")
    assert code == 0, out
    doc = json.loads(out)
    assert (doc["mode"], doc["epoch"], doc["acting"]) == ("SLAVE_CONSUME", 3, "s1")
    by_name = {b["name"]: b for b in doc["brokers"]}
    assert by_name["s1"]["live"] is True
    assert by_name["s1"]["effective"] == "READ"
    assert by_name["m"]["live"] is False
    assert doc["degraded"] is False
    code, out = run(zk, "status")
    assert code == 0
    assert "SLAVE_CONSUME" in out


def test_force_slave_consume_naming_a_dead_slave_is_refused(zk: str, admin: KazooClient) -> None:
    put(admin, state=GroupState(Mode.FENCING, 2), live=("s1",),
        statuses={"s1": BrokerStatus("s1", Permission.NONE, 2)})
    code, out = run(zk, "force-mode", "--mode", "SLAVE_CONSUME", "--acting", "s2", "--yes")
    assert code == 1
    assert "refused" in out
    assert "not a live eligible slave" in out
    assert state(admin).epoch == 2  # nothing written


def test_force_that_could_give_two_readers_is_refused(zk: str, admin: KazooClient) -> None:
    put(admin, state=GroupState(Mode.NORMAL, 1), live=("m", "s1"),
        statuses={"m": BrokerStatus("m", Permission.FULL, 1),
                  "s1": BrokerStatus("s1", Permission.NONE, 1)})
    code, out = run(zk, "force-mode", "--mode", "slave_consume", "--acting", "s1", "--yes")
    assert code == 1
    assert "two brokers READ" in out
    assert "Force FENCING first" in out
    assert state(admin).epoch == 1


def test_force_normal_before_backsync_is_refused(zk: str, admin: KazooClient) -> None:
    put(admin, state=GroupState(Mode.SLAVE_CONSUME, 3, acting="s1"), live=("m",),
        statuses={"m": BrokerStatus("m", Permission.NONE, 3, backsync_epoch=None)})
    code, out = run(zk, "force-mode", "--mode", "NORMAL", "--yes")
    assert code == 1
    assert "has not persisted back-synced offsets for epoch 3" in out


def test_force_fencing_then_slave_consume(zk: str, admin: KazooClient) -> None:
    put(admin, state=GroupState(Mode.NORMAL, 1), live=("m", "s1"),
        statuses={"m": BrokerStatus("m", Permission.FULL, 1),
                  "s1": BrokerStatus("s1", Permission.NONE, 1, max_offset=5)})
    code, out = run(zk, "force-mode", "--mode", "FENCING", "--reason", "maintenance", "--yes")
    assert code == 0, out
    st = state(admin)
    assert (st.mode, st.epoch, st.acting) == (Mode.FENCING, 2, None)
    assert "maintenance" in st.reason
    # The master acknowledges NONE at epoch 2: now a slave may be named.
    admin.set(status_path(GROUP, "m"), BrokerStatus("m", Permission.NONE, 2).to_json())
    code, out = run(zk, "force-mode", "--mode", "SLAVE_CONSUME", "--acting", "s1", "--yes")
    assert code == 0, out
    st = state(admin)
    assert (st.mode, st.epoch, st.acting) == (Mode.SLAVE_CONSUME, 3, "s1")


def test_unconfirmed_force_writes_nothing(zk: str, admin: KazooClient) -> None:
    put(admin, state=GroupState(Mode.NORMAL, 1), live=("m",), statuses={})
    r = CliRunner().invoke(group_cmd, ["force-mode", "--zk", zk, "--group", GROUP,
                                       "--mode", "FENCING"], input="n\n")
    assert r.exit_code == 1
    assert "nothing written" in r.output
    assert state(admin).epoch == 1


def test_malformed_state_can_be_overwritten_above_every_applied_epoch(
        zk: str, admin: KazooClient) -> None:
    admin.create(state_path(GROUP), b"\x00garbage", makepath=True)
    admin.create(status_path(GROUP, "s1"), BrokerStatus("s1", Permission.NONE, 9).to_json(),
                 makepath=True)
    code, out = run(zk, "force-mode", "--mode", "FENCING", "--yes")
    assert code == 0, out
    assert state(admin).epoch == 10


def test_bad_input_is_a_clear_error(zk: str, admin: KazooClient) -> None:
    r = CliRunner().invoke(group_cmd, ["status", "--zk", zk, "--group", "Not_A_Label"])
    assert r.exit_code == 2
    assert "DNS label" in r.output
    r = CliRunner().invoke(group_cmd, ["status", "--zk", zk, "--group", "absent"])
    assert r.exit_code == 1
    assert "has no config" in r.output
    code, out = run(zk, "force-mode", "--mode", "SIDEWAYS")
    assert code == 2
    code, out = run(zk, "force-mode", "--mode", "NORMAL", "--yes")
    assert code == 1
    assert "no state yet" in out


@pytest.mark.parametrize(("connect", "says"), [
    ("127.0.0.1:99999/understudy", "port 99999 is outside 1-65535"),
    ("nohostport", "expected HOST:PORT, got 'nohostport'"),
    ("127.0.0.1:2181/bad//chroot", "has an empty part"),
])
def test_a_bad_zk_connect_string_is_a_usage_error_before_any_connection(
        connect: str, says: str) -> None:
    """Before: a port out of range ended in kazoo's traceback, and a host without a port or
    a chroot ZooKeeper refuses waited 5 s and said ZooKeeper could not be reached."""
    from understudy_operator.cli.controller import controller as controller_cmd

    for cmd, args in ((group_cmd, ["status", "--zk", connect, "--group", "g1"]),
                      (controller_cmd, ["--zk", connect, "--group", "g1", "--http-port", "0",
                                        "--liveness", "none"])):
        r = CliRunner().invoke(cmd, args)
        assert r.exit_code == 2, r.output
        assert "Invalid value for '--zk'" in r.output
        assert says in r.output
        assert "Traceback" not in r.output
        assert r.exception is None or isinstance(r.exception, SystemExit)
