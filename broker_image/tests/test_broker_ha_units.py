"""Pure parts of the broker's coordination: the permission log, the back-sync decision and
codec, the group-config port check and the ``--zk`` flag checks. No sockets, no ZooKeeper."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from understudy_broker import protocol as p
from understudy_broker.config import BrokerConfig, ConfigError, spec_mismatch, validate
from understudy_broker.ha.backsync import backsync_epoch_due
from understudy_broker.ha.permlog import (
    PermissionChange,
    PermissionLog,
    PermissionLogError,
    lapse_time_ns,
    read_changes,
)
from understudy_broker.model import GroupState, Mode, Permission, Role
from understudy_broker.server.http import BrokerHttpPort
from understudy_broker.storage.durability import GroupCommit
from understudy_broker.storage.offsets import OffsetStore
from understudy_broker.zkclient import parse_digest
from understudy_broker.zklayout import BrokerSpec, GroupConfig


class FakeClock:
    def __init__(self, t: int) -> None:
        self.t = t

    def __call__(self) -> int:
        return self.t


def test_permission_log_appends_changes_only_and_keeps_time_ordered(tmp_path: Path) -> None:
    clock = FakeClock(1_000)
    log = PermissionLog(tmp_path / "permissions.jsonl", group="g1", broker="m", clock_ns=clock)
    log.open()
    try:
        assert log.record(Permission.NONE, 0) is not None
        clock.t = 2_000
        assert log.record(Permission.NONE, 0) is None  # no change, no line
        assert log.record(Permission.FULL, 1) is not None
        clock.t = 3_000
        assert log.record(Permission.FULL, 2) is not None  # the epoch moved
        # A backdated line never goes before the previous one.
        change = log.record(Permission.WRITE, 2, t_ns=2_500)
        assert change is not None
        assert change.t_ns == 3_000
        assert log.record(Permission.WRITE, 2, force=True) is not None
    finally:
        log.close()
    lines = (tmp_path / "permissions.jsonl").read_text().splitlines()
    docs = [json.loads(x) for x in lines]
    assert [(d["effective"], d["epoch"], d["t_ns"]) for d in docs] == [
        ("NONE", 0, 1_000), ("FULL", 1, 2_000), ("FULL", 2, 3_000), ("WRITE", 2, 3_000),
        ("WRITE", 2, 3_000)]
    assert {(d["group"], d["broker"]) for d in docs} == {("g1", "m")}
    assert all(isinstance(d["pid"], int) for d in docs)


def test_each_process_marks_its_first_line_as_its_start(tmp_path: Path) -> None:
    # In a container every incarnation is PID 1: the mark is what tells them apart.
    path = tmp_path / "permissions.jsonl"
    for incarnation in range(2):
        log = PermissionLog(path, group="g1", broker="m", clock_ns=FakeClock(1_000 * (incarnation + 1)))
        log.open()
        try:
            log.record(Permission.NONE, 0)
            log.record(Permission.FULL, 1)
        finally:
            log.close()
    docs = [json.loads(x) for x in path.read_text().splitlines()]
    assert [d.get("start") for d in docs] == [True, None, True, None]  # no key on other lines
    assert [c.start for c in read_changes(path)] == [True, False, True, False]
    # A log written before the mark reads as lines without it; a mark that is not a
    # boolean is not a permission change.
    old = '{"t_ns": 1, "group": "g", "broker": "b", "effective": "READ", "epoch": 1, "pid": 1}'
    assert PermissionChange.from_json(old).start is False
    with pytest.raises(PermissionLogError, match="start must be true or false"):
        PermissionChange.from_json(old[:-1] + ', "start": "yes"}')


def test_reading_the_log_skips_a_torn_or_foreign_line_and_keeps_the_rest(tmp_path: Path) -> None:
    path = tmp_path / "permissions.jsonl"
    good = PermissionChange(5, "g1", "m", Permission.READ, 3, 42)
    later = PermissionChange(9, "g1", "m", Permission.NONE, 4, 42)
    path.write_text(good.to_json() + "\n" + '{"t_ns": "x"}\n' + "garbage\n\n" + later.to_json()
                    + "\n" + '{"t_ns": 10, "gro')
    assert list(read_changes(path)) == [good, later]
    assert list(read_changes(tmp_path / "absent.jsonl")) == []
    with pytest.raises(PermissionLogError):
        PermissionChange.from_json('{"t_ns": 1, "group": "g", "broker": "b", "effective": '
                                   '"SOME", "epoch": 1}')
    with pytest.raises(PermissionLogError):
        PermissionChange.from_json('{"t_ns": true, "group": "g", "broker": "b", "effective": '
                                   '"READ", "epoch": 1}')


def test_lapse_time_is_now_minus_how_long_ago_the_lease_ran_out() -> None:
    assert lapse_time_ns(now_ns=10_000_000_000, now_clock=50.0, lapsed_at_clock=48.5) == \
        8_500_000_000
    # A lapse "in the future" (clock jitter) is clamped to now.
    assert lapse_time_ns(now_ns=10, now_clock=1.0, lapsed_at_clock=2.0) == 10


def test_http_port_serves_the_permission_log_as_json_lines(tmp_path: Path) -> None:
    path = tmp_path / "permissions.jsonl"
    change = PermissionChange(5, "g1", "m", Permission.FULL, 1, 7)
    path.write_text(change.to_json() + "\nnot json\n")
    port = BrokerHttpPort(registry=CollectorRegistry(), ready=lambda: (True, "ok"),
                          host="127.0.0.1", port=0, permissions=path)
    status, ctype, body = port.respond("GET", "/permissions?x=1")
    assert (status, ctype) == (200, "application/x-ndjson")
    assert body.decode() == change.to_json() + "\n"
    assert port.respond("GET", "/readyz")[0] == 200
    assert port.respond("POST", "/permissions")[0] == 405
    assert port.respond("GET", "/nope")[0] == 404


@pytest.mark.parametrize(
    ("role", "state", "due"),
    [
        (Role.SLAVE, GroupState(Mode.RECOVERING, 7, acting="s"), 7),
        (Role.SLAVE, GroupState(Mode.RECOVERING, 7, acting="other"), None),
        (Role.SLAVE, GroupState(Mode.SLAVE_CONSUME, 6, acting="s"), None),
        (Role.SLAVE, None, None),
        (Role.MASTER, GroupState(Mode.RECOVERING, 7, acting="s"), None),
    ],
)
def test_only_the_acting_slave_of_a_recovering_group_pushes(
        role: Role, state: GroupState | None, due: int | None) -> None:
    assert backsync_epoch_due(role=role, name="s", state=state) == due


def test_backsync_request_round_trips_and_rejects_bad_bodies() -> None:
    req = p.BackSyncRequest("g1", "s", 4, {"cg": {"t": {0: 10, 3: 2}}})
    assert p.BackSyncRequest.decode(req.encode()) == req
    resp = p.BackSyncResponse(4, 2, 4)
    assert p.BackSyncResponse.decode(resp.encode()) == resp
    for body, status in [
        (b"[]", p.Status.BAD_FRAME),
        (b'{"group": "g1", "sender": "s", "offsets": {}}', p.Status.BAD_FRAME),
        (b'{"group": "g1", "sender": "s", "epoch": "4", "offsets": {}}', p.Status.BAD_FRAME),
        (b'{"group": "g1", "sender": "s", "epoch": -1, "offsets": {}}', p.Status.BAD_REQUEST),
        (b'{"group": "g1", "sender": "s", "epoch": 4, "offsets": {"cg": []}}',
         p.Status.BAD_REQUEST),
        (b'{"group": "g1", "sender": "s", "epoch": 4, "offsets": {"cg": {"t": {"0": 1.5}}}}',
         p.Status.BAD_REQUEST),
    ]:
        with pytest.raises(p.FrameError) as err:
            p.BackSyncRequest.decode(body)
        assert err.value.code == status, body


def _group() -> GroupConfig:
    return GroupConfig(group="g1", brokers=(
        BrokerSpec("m", 0, "127.0.0.1", 9000, 9200, 9100, Permission.FULL),
        BrokerSpec("s", 1, "127.0.0.1", 9001, 9201, 9101, Permission.READ),
    )).validate()


def test_flags_must_match_the_brokerspec_in_the_group_config(tmp_path: Path) -> None:
    master = BrokerConfig(data_dir=tmp_path, port=9000, http_port=9100, replication_port=9200,
                          name="m", group="g1")
    assert spec_mismatch(master, _group()) is None
    slave = BrokerConfig(data_dir=tmp_path, port=9001, http_port=9101, role=Role.SLAVE,
                         master=("127.0.0.1", 9200), name="s", group="g1",
                         permission=Permission.READ)
    assert spec_mismatch(slave, _group()) is None
    wrong = BrokerConfig(data_dir=tmp_path, port=9999, http_port=9100, replication_port=9201,
                         name="m", group="g1")
    problem = spec_mismatch(wrong, _group())
    assert problem is not None
    assert "--port 9000, flags say 9999" in problem
    assert "--replication-port 9200, flags say 9201" in problem
    role = BrokerConfig(data_dir=tmp_path, port=9001, http_port=9101, replication_port=9300,
                        name="s", group="g1")
    assert "role slave" in (spec_mismatch(role, _group()) or "")
    unknown = BrokerConfig(data_dir=tmp_path, port=1, replication_port=2, name="x", group="g1")
    assert "no broker 'x'" in (spec_mismatch(unknown, _group()) or "")


@pytest.mark.parametrize(
    ("changes", "needle"),
    [
        ({"zk": ""}, "--zk"),
        ({"zk": "127.0.0.1"}, "--zk"),
        ({"zk": "127.0.0.1:2181,"}, "--zk"),
        ({"zk": "127.0.0.1:2181//x"}, "--zk"),
        ({"zk": "127.0.0.1:2181", "group": "G_1"}, "--group"),
        ({"zk": "127.0.0.1:2181", "port": 0}, "--port 0"),
        ({"zk": "127.0.0.1:2181", "zk_session_timeout_ms": 100}, "--zk-session-timeout-ms"),
        ({"link_timeout_s": 0.0}, "--link-timeout-ms"),
    ],
)
def test_bad_coordination_settings_name_the_flag(
        tmp_path: Path, changes: dict[str, object], needle: str) -> None:
    base: dict[str, object] = {"data_dir": tmp_path, "port": 9000, "replication_port": 9200,
                               "name": "m", "group": "g1"}
    cfg = BrokerConfig(**{**base, **changes})  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=needle):
        validate(cfg)


def test_good_coordination_settings_pass(tmp_path: Path) -> None:
    cfg = BrokerConfig(data_dir=tmp_path, port=9000, replication_port=9200, name="m",
                       group="g1", zk="127.0.0.1:2181,127.0.0.1:2182/understudy",
                       zk_digest=parse_digest("u:p:w"))
    validate(cfg)
    assert cfg.coordinated
    assert cfg.zk_digest == ("u", "p:w")
    with pytest.raises(ValueError, match="USER:PASSWORD"):
        parse_digest(":pw")


async def test_offsets_group_commit_writes_every_change_before_returning_and_shares_writes(
        tmp_path: Path) -> None:
    store = OffsetStore.open(tmp_path / "offsets.json")
    persister = GroupCommit(store.persist_async, mark=lambda: store.version,
                            flushed=store.version)
    await persister.durable()  # nothing changed: nothing written
    assert persister.flushes == 0
    assert not (tmp_path / "offsets.json").exists()

    async def commit(q: int) -> None:
        store.commit("cg", "t", q, q + 100)
        await persister.durable()
        # Returned: this commit is in the file.
        on_disk = OffsetStore.open(tmp_path / "offsets.json")
        assert on_disk.get("cg", "t", q) == q + 100

    await asyncio.gather(*(commit(q) for q in range(40)))
    assert not persister.pending
    assert 1 <= persister.flushes < 40  # commits made during a write share the next one
    store.merge({}, epoch=9)
    await persister.durable()
    assert OffsetStore.open(tmp_path / "offsets.json").backsync_epoch == 9


def test_an_acting_slave_relinks_at_once_only_when_the_failback_waits_for_it() -> None:
    from understudy_broker.ha.zkauthority import failback_waits_for_me

    g = _group()
    acting = GroupState(Mode.SLAVE_CONSUME, 3, acting="s")
    assert failback_waits_for_me(acting, frozenset({"s", "m"}), g, "s")
    assert not failback_waits_for_me(acting, frozenset({"s"}), g, "s")  # master not back
    assert not failback_waits_for_me(acting, frozenset({"s", "m"}), g, "s2")  # not acting
    # FENCING: linking to a master that just came back would make this slave ineligible,
    # and the controller would skip SLAVE_CONSUME (a planned handoff's reads).
    assert not failback_waits_for_me(GroupState(Mode.FENCING, 2), frozenset({"s", "m"}), g, "s")
    assert not failback_waits_for_me(acting, frozenset({"s", "m"}), None, "s")
    assert not failback_waits_for_me(None, frozenset({"s", "m"}), g, "s")
