"""Real ``understudy broker --zk`` processes against a real ZooKeeper (and, for failover,
the real ``understudy controller``): permission from the group state, the permission log,
back-sync, and what a broker does when it loses READ.

Every process is started in its own process group and stopped by PID in a ``finally``
(SIGTERM, then SIGKILL of the group), and dies with pytest (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError

from understudy_broker import protocol as p
from understudy_broker.client import Consumer, Producer, create_topic
from understudy_broker.ha.permlog import PermissionChange
from understudy_broker.model import GroupState, Mode, Permission
from understudy_broker.zklayout import (
    BrokerSpec,
    FailoverPolicy,
    GroupConfig,
    config_path,
    decode_isr,
    decode_state,
    encode_state,
    isr_path,
    state_path,
    status_path,
)
from understudy_harness import testing
from understudy_harness.testing import UNDERSTUDY, Process, eventually, raw_request
from understudy_operator.local.ports import free_port

pytestmark = pytest.mark.integration

GROUP = "g1"
SESSION_MS = 2000


@dataclass
class Group:
    """A master ``m`` and a slave ``s`` with ``--zk``; the config is written to ZooKeeper."""

    zk: str
    root: Path
    sync: bool = False
    procs: list[Process] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.pid_dir = self.root / "pids"
        self.pid_dir.mkdir(exist_ok=True)
        self.m = BrokerSpec("m", 0, "127.0.0.1", free_port(), free_port(), free_port(),
                            Permission.FULL)
        self.s = BrokerSpec("s", 1, "127.0.0.1", free_port(), free_port(), free_port(),
                            Permission.READ)
        self.config = GroupConfig(
            group=GROUP, brokers=(self.m, self.s),
            failover=FailoverPolicy(check_interval_ms=100, detection_checks=2,
                                    backsync_timeout_s=10.0),
            session_timeout_ms=SESSION_MS,
        ).validate()

    def broker(self, spec: BrokerSpec, *, extra: list[str] | None = None) -> Process:
        argv = [*UNDERSTUDY, "broker", "--data-dir", str(self.root / spec.name),
                "--port", str(spec.port), "--http-port", str(spec.http_port),
                "--name", spec.name, "--group", GROUP, "--log-level", "INFO",
                "--zk", self.zk, "--zk-session-timeout-ms", str(SESSION_MS),
                "--link-timeout-ms", "1000"]
        if spec.ordinal == 0:
            argv += ["--replication-port", str(spec.replication_port)]
            argv += ["--sync", "--min-insync-replicas", "1"] if self.sync else ["--async"]
        else:
            argv += ["--role", "slave", "--permission", "READ",
                     "--master", f"127.0.0.1:{self.m.replication_port}"]
        proc = Process(spec.name, argv + (extra or []), self.root / f"{spec.name}.log",
                       port=spec.port, pid_file=self.pid_dir / f"{spec.name}.pid")
        self.procs.append(proc)
        return proc

    def controller(self) -> Process:
        argv = [*UNDERSTUDY, "controller", "--zk", self.zk, "--group", GROUP,
                "--pid-dir", str(self.pid_dir), "--http-port", str(free_port()),
                "--session-timeout", "2"]
        proc = Process("controller", argv, self.root / "controller.log",
                       pid_file=self.root / "controller.pid")
        self.procs.append(proc)
        return proc

    def stop_all(self) -> None:
        for proc in reversed(self.procs):
            proc.stop()


@pytest.fixture
def group(zk: str, tmp_path: Path, admin: KazooClient) -> Iterator[Group]:
    g = Group(zk, tmp_path)
    admin.create(config_path(GROUP), g.config.to_json(), makepath=True)
    try:
        yield g
    finally:
        g.stop_all()


def set_state(admin: KazooClient, state: GroupState) -> None:
    if admin.exists(state_path(GROUP)) is None:
        admin.create(state_path(GROUP), encode_state(state), makepath=True)
    else:
        admin.set(state_path(GROUP), encode_state(state))


def recorded_in_sync(admin: KazooClient) -> frozenset[str]:
    """The slaves the group's in-sync record names (what the controller may pick from)."""
    if admin.exists(isr_path(GROUP)) is None:
        return frozenset()
    return decode_isr(admin.get(isr_path(GROUP))[0])


def read_state(admin: KazooClient) -> GroupState | None:
    if admin.exists(state_path(GROUP)) is None:
        return None
    return decode_state(admin.get(state_path(GROUP))[0])


async def request(spec: BrokerSpec, op: p.Op, body: bytes, *, epoch: int = 0,
                  timeout_s: float = 5.0) -> p.Frame:
    return await raw_request(spec.address, op, body, epoch=epoch, timeout_s=timeout_s)


async def heartbeat(spec: BrokerSpec) -> p.HeartbeatResponse:
    return await testing.heartbeat(spec.address)


async def perm_is(spec: BrokerSpec, perm: Permission, epoch: int | None = None) -> bool:
    try:
        hb = await heartbeat(spec)
    except (OSError, TimeoutError):
        return False
    return hb.permission == perm and (epoch is None or hb.epoch == epoch)


def http_get(spec: BrokerSpec, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{spec.http_port}{path}", timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def permission_log(spec: BrokerSpec) -> list[PermissionChange]:
    status, body = http_get(spec, "/permissions")
    assert status == 200
    return [PermissionChange.from_json(line) for line in body.splitlines() if line.strip()]


def read_intervals(changes: list[PermissionChange], *, deaths: list[int]) -> list[tuple[int, int]]:
    """[start, end) intervals (ns) with READ. An incarnation's READ ends at its next line,
    at the process's death (``deaths``: times taken after a SIGKILL completed), or now."""
    out: list[tuple[int, int]] = []
    now = time.time_ns()
    for i, c in enumerate(changes):
        if not c.effective & Permission.READ:
            continue
        end = changes[i + 1].t_ns if i + 1 < len(changes) else now
        later_deaths = [d for d in deaths if d >= c.t_ns]
        if later_deaths and (i + 1 == len(changes) or changes[i + 1].pid != c.pid):
            end = min(end, min(later_deaths))
        out.append((c.t_ns, end))
    return out


def overlaps(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> list[tuple[int, int]]:
    return [(max(x0, y0), min(x1, y1)) for x0, x1 in a for y0, y1 in b if max(x0, y0) < min(x1, y1)]


# --------------------------------------------------------------------------- tests


async def test_permission_follows_the_group_state_in_zookeeper(
        group: Group, admin: KazooClient) -> None:
    m = group.broker(group.m).start()
    s = group.broker(group.s).start()
    # No state yet: a coordinated broker enforces NONE and is not ready.
    assert (await heartbeat(group.m)).permission == Permission.NONE
    assert http_get(group.m, "/readyz")[0] == 503
    set_state(admin, GroupState(Mode.NORMAL, 1))
    await eventually(lambda: perm_is(group.m, Permission.FULL, 1), "master FULL at epoch 1")
    await eventually(lambda: perm_is(group.s, Permission.NONE, 1), "slave NONE at epoch 1")
    assert http_get(group.m, "/readyz")[0] == 200
    assert http_get(group.s, "/readyz")[0] == 200
    _, metrics = http_get(group.m, "/metrics")
    assert 'understudy_broker_permission{broker="m",group="g1",role="master"} 3.0' in metrics

    set_state(admin, GroupState(Mode.FENCING, 2, reason="test"))
    await eventually(lambda: perm_is(group.m, Permission.NONE, 2), "master fenced")
    # Writes are refused once WRITE is gone.
    frame = await request(group.m, p.Op.CREATE_TOPIC, p.CreateTopicRequest("t", 1).encode())
    assert frame.status == p.Status.NO_PERMISSION
    batch = p.ProduceRequest("t", [p.ProduceMessage(0, None, b"x")]).encode()
    frame = await request(group.m, p.Op.PRODUCE, batch)
    assert frame.status == p.Status.NO_PERMISSION
    frame = await request(group.s, p.Op.PRODUCE, batch)
    assert frame.status == p.Status.NOT_MASTER
    set_state(admin, GroupState(Mode.SLAVE_CONSUME, 3, acting="s", reason="test"))
    await eventually(lambda: perm_is(group.s, Permission.READ, 3), "slave READ")
    await eventually(lambda: perm_is(group.m, Permission.NONE, 3), "master at epoch 3")
    _, metrics = http_get(group.s, "/metrics")
    assert 'understudy_broker_permission{broker="s",group="g1",role="slave"} 1.0' in metrics

    mlog = [(c.effective, c.epoch) for c in permission_log(group.m)]
    # Applying NORMAL gives WRITE at once and READ when the lease is confirmed a moment
    # later (a broker never reads on an unconfirmed view): WRITE may show in between.
    assert mlog[0] == (Permission.NONE, 0)
    assert (Permission.FULL, 1) in mlog
    assert {e for e, epoch in mlog if epoch >= 2} == {Permission.NONE}
    assert mlog[-1] == (Permission.NONE, 3)
    slog = [(c.effective, c.epoch) for c in permission_log(group.s)]
    assert slog[-1] == (Permission.READ, 3)
    # The file on disk holds the same lines, and a clean stop appends NONE.
    s.stop()
    lines = (group.root / "s" / "permissions.jsonl").read_text().splitlines()
    last = json.loads(lines[-1])
    assert (last["effective"], last["group"], last["broker"]) == ("NONE", GROUP, "s")
    assert json.loads(lines[-2])["effective"] == "READ"
    assert m.proc is not None
    assert m.proc.poll() is None


async def test_broker_whose_ports_contradict_the_group_config_refuses_to_start(
        group: Group) -> None:
    wrong = BrokerSpec("m", 0, "127.0.0.1", free_port(), group.m.replication_port,
                       group.m.http_port, Permission.FULL)
    proc = group.broker(wrong).start(wait_port=False)
    assert proc.proc is not None
    code = proc.proc.wait(20)
    assert code != 0
    assert f"--port {group.m.port}, flags say {wrong.port}" in proc.log()


def test_bad_zk_flags_exit_2_naming_the_flag(tmp_path: Path) -> None:
    base = [*UNDERSTUDY, "broker", "--data-dir", str(tmp_path / "d"), "--port", "9",
            "--replication-port", "10"]
    for extra, needle in [
        (["--zk", "nohost"], "--zk"),
        (["--zk", "127.0.0.1:1", "--name", "Bad_Name"], "--name"),
        (["--zk", "127.0.0.1:1", "--zk-session-timeout-ms", "10"], "--zk-session-timeout-ms"),
        (["--zk", "127.0.0.1:1", "--zk-digest", "nocolon"], "--zk-digest"),
    ]:
        out = subprocess.run(base + extra, capture_output=True, timeout=30, check=False)
        assert out.returncode == 2, out
        assert needle in out.stderr.decode(), out.stderr


async def slave_knows_topic(spec: BrokerSpec, topic: str) -> bool:
    frame = await request(spec, p.Op.GET_ROUTE, p.GetRouteRequest(topic).encode())
    return topic in p.RouteResponse.decode(frame.body).topics


def zk_status(admin: KazooClient, broker: str) -> dict[str, object]:
    doc = json.loads(admin.get(status_path(GROUP, broker))[0])
    assert isinstance(doc, dict)
    return doc


async def test_losing_read_answers_a_waiting_long_poll_and_closes_the_session(
        group: Group, admin: KazooClient) -> None:
    group.broker(group.m).start()
    set_state(admin, GroupState(Mode.NORMAL, 1))
    await eventually(lambda: perm_is(group.m, Permission.FULL, 1), "master FULL")
    await create_topic([f"127.0.0.1:{group.m.port}"], topic="t", queues=1)
    reader, writer = await asyncio.open_connection("127.0.0.1", group.m.port)
    try:
        # A long-poll at the end of an empty queue, allowed to wait 30 s.
        writer.write(p.encode_frame(request_id=11, op=p.Op.PULL,
                                    body=p.PullRequest("t", 0, 0, 65536, 30_000).encode()))
        await writer.drain()
        await asyncio.sleep(0.3)  # the poll is parked on the broker
        set_state(admin, GroupState(Mode.FENCING, 2, reason="test"))
        dec = p.FrameDecoder()
        frame: p.Frame | None = None
        while frame is None:
            # Far less than the poll's 30 s: the answer comes from losing READ.
            async with asyncio.timeout(10):
                data = await reader.read(65536)
            assert data, "closed before answering the poll"
            dec.feed(data)
            nxt = dec.next_frame()
            frame = nxt if isinstance(nxt, p.Frame) else None
        assert frame.request_id == 11
        assert frame.status == p.Status.NO_PERMISSION, p.error_message(frame)
        # Then the consumer session is closed, so the client re-routes.
        async with asyncio.timeout(10):
            assert await reader.read(65536) == b""
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()
    # The broker keeps serving other connections.
    assert (await heartbeat(group.m)).epoch == 2


async def test_backsync_refuses_stale_and_malformed_pushes_and_persists_a_good_one(
        group: Group, admin: KazooClient) -> None:
    m = group.broker(group.m).start()
    group.broker(group.s).start()
    set_state(admin, GroupState(Mode.NORMAL, 5))
    await eventually(lambda: perm_is(group.m, Permission.FULL, 5), "master at epoch 5")
    await eventually(lambda: perm_is(group.s, Permission.NONE, 5), "slave at epoch 5")
    offsets = {"cg": {"t": {0: 42, 1: 7}}}
    stale = p.BackSyncRequest(GROUP, "s", 4, offsets).encode()
    frame = await request(group.m, p.Op.BACKSYNC_OFFSETS, stale, epoch=4)
    assert frame.status == p.Status.STALE_EPOCH, p.error_message(frame)
    for body, status in [
        (b"not json", p.Status.BAD_FRAME),
        (b'{"group": "g1", "sender": "s", "epoch": 5}', p.Status.BAD_FRAME),
        (b'{"group": "g1", "sender": "s", "epoch": 0, "offsets": {}}', p.Status.BAD_REQUEST),
        (b'{"group": "g1", "sender": "s", "epoch": 5, "offsets": {"cg": {"t": {"0": -1}}}}',
         p.Status.BAD_REQUEST),
        (b'{"group": "g1", "sender": "s", "epoch": 5, "offsets": {"cg": {"t": {"x": 1}}}}',
         p.Status.BAD_REQUEST),
        (p.BackSyncRequest("other", "s", 5, offsets).encode(), p.Status.BAD_REQUEST),
    ]:
        frame = await request(group.m, p.Op.BACKSYNC_OFFSETS, body, epoch=5)
        assert frame.status == status, (body, p.error_message(frame))
    frame = await request(group.s, p.Op.BACKSYNC_OFFSETS,
                          p.BackSyncRequest(GROUP, "s", 5, offsets).encode(), epoch=5)
    assert frame.status == p.Status.NOT_MASTER
    # Nothing was merged by the refused pushes.
    fetched = await request(group.m, p.Op.FETCH_OFFSET,
                            p.FetchOffsetRequest("cg", "t", [0, 1]).encode())
    assert fetched.status == p.Status.UNKNOWN_TOPIC  # the topic does not exist on the master
    await create_topic([f"127.0.0.1:{group.m.port}"], topic="t", queues=2)
    fetched = await request(group.m, p.Op.FETCH_OFFSET,
                            p.FetchOffsetRequest("cg", "t", [0, 1]).encode())
    assert p.OffsetsResponse.decode(fetched.body).offsets == {0: None, 1: None}

    good = p.BackSyncRequest(GROUP, "s", 5, offsets).encode()
    frame = await request(group.m, p.Op.BACKSYNC_OFFSETS, good, epoch=5)
    assert frame.status == p.Status.OK, p.error_message(frame)
    answer = p.BackSyncResponse.decode(frame.body)
    assert (answer.epoch, answer.moved, answer.backsync_epoch) == (5, 2, 5)
    # Durable before the answer: the offsets file already says so.
    stored = json.loads((group.root / "m" / "offsets.json").read_text())
    assert stored["backsync_epoch"] == 5
    assert stored["offsets"]["cg"]["t"] == {"0": 42, "1": 7}
    await eventually(lambda: zk_status(admin, "m").get("backSyncEpoch") == 5,
                   "backSyncEpoch 5 in the master's ZooKeeper status")
    # An older offset never moves a newer one back.
    lower = p.BackSyncRequest(GROUP, "s", 5, {"cg": {"t": {0: 3}}}).encode()
    frame = await request(group.m, p.Op.BACKSYNC_OFFSETS, lower, epoch=5)
    assert p.BackSyncResponse.decode(frame.body).moved == 0
    fetched = await request(group.m, p.Op.FETCH_OFFSET,
                            p.FetchOffsetRequest("cg", "t", [0, 1]).encode())
    assert p.OffsetsResponse.decode(fetched.body).offsets == {0: 42, 1: 7}
    assert m.proc is not None
    assert m.proc.poll() is None


async def test_kill9_master_slave_reads_then_backsync_returns_reads_without_rewind(
        zk: str, tmp_path: Path, admin: KazooClient) -> None:
    group = Group(zk, tmp_path, sync=True)
    admin.create(config_path(GROUP), group.config.to_json(), makepath=True)
    try:
        await _failover_and_back(group, admin)
    finally:
        group.stop_all()


async def _failover_and_back(group: Group, admin: KazooClient) -> None:
    ctl = group.controller().start(wait_port=False)
    m = group.broker(group.m).start()
    group.broker(group.s).start()
    await eventually(lambda: perm_is(group.m, Permission.FULL), "master FULL", 30)
    await eventually(lambda: perm_is(group.s, Permission.NONE), "slave NONE")
    bootstrap = [f"127.0.0.1:{group.m.port}", f"127.0.0.1:{group.s.port}"]
    await create_topic(bootstrap, topic="t", queues=2)
    await eventually(lambda: zk_status(admin, "m").get("slaveLinks") == ["s"], "slave linked")
    async with Producer(bootstrap) as producer:
        acks = [await producer.send("t", f"a{i}".encode(), queue=i % 2) for i in range(200)]
        await asyncio.gather(*acks)

    consumer = Consumer(bootstrap, group="cg", topic="t", max_wait_ms=200)
    seen: set[bytes] = set()
    committed: dict[int, int | None] = {}

    async def consume_until(n: int, what: str) -> None:
        deadline = time.monotonic() + 40
        while len(seen) < n:
            if time.monotonic() > deadline:
                pytest.fail(f"consumed {len(seen)} of {n} ({what})")
            for rec in await consumer.getmany(timeout_s=0.5):
                seen.add(rec.body)
            committed.update(await consumer.commit())

    try:
        await consume_until(100, "from the master")
        await asyncio.sleep(0.6)  # committed offsets reach the slave (metadata, every 0.25 s)
        death = m.kill9()
        await eventually(lambda: perm_is(group.s, Permission.READ), "slave READ after kill -9")
        state = read_state(admin)
        assert state is not None
        assert (state.mode, state.acting) == (Mode.SLAVE_CONSUME, "s")
        await consume_until(200, "from the acting slave")
        slave_committed = dict(committed)
        assert sum(v or 0 for v in slave_committed.values()) == 200

        m.start()
        await eventually(lambda: (st := read_state(admin)) is not None and st.mode is Mode.NORMAL
                       and st.epoch > state.epoch, "NORMAL again after back-sync", 40)
        await eventually(lambda: perm_is(group.m, Permission.FULL), "master FULL again")
        final = read_state(admin)
        assert final is not None
        assert "back-sync" in final.reason or "persisted" in final.reason
        # No rewind: the master holds exactly what the consumers committed on the slave.
        fetched = await request(group.m, p.Op.FETCH_OFFSET,
                                p.FetchOffsetRequest("cg", "t", [0, 1]).encode())
        assert fetched.status == p.Status.OK, p.error_message(fetched)
        assert p.OffsetsResponse.decode(fetched.body).offsets == slave_committed
        assert zk_status(admin, "m")["backSyncEpoch"] == final.epoch - 1

        # The same consumer follows reads back to the master.
        async with Producer(bootstrap) as producer:
            acks = [await producer.send("t", f"b{i}".encode(), queue=i % 2) for i in range(20)]
            await asyncio.gather(*acks)
        await consume_until(220, "from the master after failback")
    finally:
        await consumer.close()

    # One reader: the permission logs never show m and s holding READ at the same time.
    mlog, slog = permission_log(group.m), permission_log(group.s)
    m_read = read_intervals(mlog, deaths=[death])
    s_read = read_intervals(slog, deaths=[])
    assert len(m_read) >= 2  # before the kill and after failback
    assert len(s_read) == 1  # slave-consume
    assert overlaps(m_read, s_read) == []
    assert ctl.proc is not None
    assert ctl.proc.poll() is None


async def test_lease_lapse_while_stopped_is_logged_at_the_lapse_not_at_the_wakeup(
        group: Group, admin: KazooClient) -> None:
    m = group.broker(group.m).start()
    set_state(admin, GroupState(Mode.NORMAL, 1))
    await eventually(lambda: perm_is(group.m, Permission.FULL, 1), "master FULL")
    assert m.proc is not None
    stopped_at = time.time_ns()
    os.kill(m.proc.pid, signal.SIGSTOP)
    try:
        # Longer than the read lease (0.85 s here), shorter than the session timeout.
        await asyncio.sleep(1.5)
    finally:
        resumed_at = time.time_ns()
        os.kill(m.proc.pid, signal.SIGCONT)
    await eventually(lambda: perm_is(group.m, Permission.FULL, 1), "master FULL again")
    log = permission_log(group.m)
    lost = [c for c in log if c.t_ns > stopped_at and not c.effective & Permission.READ]
    assert lost, log
    # READ ended when the lease ran out, inside the stop, not when the process woke up.
    assert stopped_at < lost[0].t_ns < resumed_at
    assert lost[0].effective == Permission.WRITE
    assert log[-1].effective == Permission.FULL


async def started_with_topic(group: Group, admin: KazooClient) -> tuple[Process, list[str]]:
    """The controller, the master and the slave started, the master FULL, topic ``t``
    (one queue) created and the slave linked: the master's process and the bootstrap."""
    group.controller().start(wait_port=False)
    m = group.broker(group.m).start()
    group.broker(group.s).start()
    await eventually(lambda: perm_is(group.m, Permission.FULL), "master FULL", 30)
    bootstrap = [f"127.0.0.1:{group.m.port}", f"127.0.0.1:{group.s.port}"]
    await create_topic(bootstrap, topic="t", queues=1)
    await eventually(lambda: zk_status(admin, "m").get("slaveLinks") == ["s"], "slave linked")
    return m, bootstrap


async def test_master_stopped_past_its_session_comes_back_fenced_and_rejoins_by_backsync(
        zk: str, tmp_path: Path, admin: KazooClient) -> None:
    group = Group(zk, tmp_path, sync=True)
    admin.create(config_path(GROUP), group.config.to_json(), makepath=True)
    try:
        m, bootstrap = await started_with_topic(group, admin)
        async with Producer(bootstrap) as producer:
            await asyncio.gather(*[await producer.send("t", b"x%d" % i) for i in range(50)])
        # Topics reach a slave with the replication metadata (every 0.25 s).
        await eventually(lambda: slave_knows_topic(group.s, "t"), "the slave knows topic t")
        before = read_state(admin)
        assert before is not None
        assert m.proc is not None
        os.kill(m.proc.pid, signal.SIGSTOP)
        try:
            # The controller fences the frozen master once its session expires, and the
            # slave takes reads; consumers commit there.
            await eventually(lambda: perm_is(group.s, Permission.READ), "slave READ", 30)
            consumer = Consumer([f"127.0.0.1:{group.s.port}"], group="cg", topic="t",
                                max_wait_ms=200, request_timeout_s=2)
            try:
                got = 0
                while got < 50:
                    got += len(await consumer.getmany(timeout_s=1))
                committed = await consumer.commit()
            finally:
                await consumer.close()
        finally:
            os.kill(m.proc.pid, signal.SIGCONT)
        assert committed == {0: 50}
        await eventually(lambda: (st := read_state(admin)) is not None and st.mode is Mode.NORMAL
                       and st.epoch > before.epoch, "NORMAL after back-sync", 40)
        await eventually(lambda: perm_is(group.m, Permission.FULL), "master FULL again")
        fetched = await request(group.m, p.Op.FETCH_OFFSET,
                                p.FetchOffsetRequest("cg", "t", [0]).encode())
        assert p.OffsetsResponse.decode(fetched.body).offsets == {0: 50}
        # Never two readers, even across the freeze (the master's READ ends at its lease
        # lapse, recorded as such when it woke up).
        m_read = read_intervals(permission_log(group.m), deaths=[])
        s_read = read_intervals(permission_log(group.s), deaths=[])
        assert len(s_read) == 1
        assert overlaps(m_read, s_read) == []
    finally:
        group.stop_all()


async def test_digest_identity_authenticates_and_protects_the_brokers_nodes(
        group: Group, admin: KazooClient, zk: str) -> None:
    group.broker(group.m, extra=["--zk-digest", "understudy:s3cret"]).start()
    set_state(admin, GroupState(Mode.NORMAL, 1))
    await eventually(lambda: perm_is(group.m, Permission.FULL, 1), "master FULL")
    await eventually(lambda: admin.exists(status_path(GROUP, "m")) is not None, "status node")
    with pytest.raises(NoAuthError):
        admin.get(status_path(GROUP, "m"))  # no identity: refused
    authed = KazooClient(hosts=zk, timeout=2.0, auth_data=[("digest", "understudy:s3cret")])
    authed.start(timeout=10)
    try:
        assert json.loads(authed.get(status_path(GROUP, "m"))[0])["effective"] == "FULL"
        acls, _ = authed.get_acls(status_path(GROUP, "m"))
        assert [(a.id.scheme, a.id.id.split(":")[0]) for a in acls] == [("digest", "understudy")]
    finally:
        authed.stop()
        authed.close()


async def test_route_advertises_the_address_from_the_group_config(
        group: Group, admin: KazooClient) -> None:
    # The broker listens on 127.0.0.1, but the group config names it "localhost" (as a
    # Kubernetes pod listens on 0.0.0.0 and is known by its DNS name).
    named = GroupConfig(group=GROUP, brokers=(
        BrokerSpec("m", 0, "localhost", group.m.port, group.m.replication_port,
                   group.m.http_port, Permission.FULL), group.s),
        session_timeout_ms=SESSION_MS).validate()
    admin.set(config_path(GROUP), named.to_json())
    group.broker(group.m).start()
    set_state(admin, GroupState(Mode.NORMAL, 1))
    await eventually(lambda: perm_is(group.m, Permission.FULL, 1), "master FULL")
    frame = await request(group.m, p.Op.GET_ROUTE, p.GetRouteRequest().encode())
    route = p.RouteResponse.decode(frame.body)
    brokers = {b.name: b for g in route.groups for b in g.brokers}
    assert brokers["m"].address == f"localhost:{group.m.port}"
    assert brokers["m"].permission == Permission.FULL
    assert brokers["s"].address == f"127.0.0.1:{group.s.port}"
    assert not brokers["s"].reachable  # never started


async def test_a_commit_acknowledged_just_before_kill9_survives_failover_and_failback(
        zk: str, tmp_path: Path, admin: KazooClient) -> None:
    """The commit never reached the slave (the master died at once) and no consumer
    commits during slave-consume: only the master's own disk can keep it."""
    group = Group(zk, tmp_path, sync=True)
    admin.create(config_path(GROUP), group.config.to_json(), makepath=True)
    try:
        group.controller().start(wait_port=False)
        m = group.broker(group.m).start()
        group.broker(group.s).start()
        await eventually(lambda: perm_is(group.m, Permission.FULL), "master FULL", 30)
        await create_topic([f"127.0.0.1:{group.m.port}"], topic="t", queues=2)
        commit = p.CommitOffsetRequest("cg", "t", {0: 17, 1: 5}).encode()
        # FULL comes before the slave is in sync, and a commit needs both copies
        # (inSyncReplicas 2): a refusal until then is the quorum rule, not the bug.
        async def committed() -> bool:
            frame = await request(group.m, p.Op.COMMIT_OFFSET, commit)
            return frame.status == p.Status.OK

        await eventually(committed, "commit acknowledged once the slave is in sync", 30)
        # A joining slave's copy counts for the commit before the in-sync record names it
        # (replication/isr.py); only a named slave may act, so wait for the record (the
        # kill once fell in between: the controller rightly kept the group unreadable).
        await eventually(lambda: group.s.name in recorded_in_sync(admin),
                         "the in-sync record names the slave", 30)
        m.kill9()  # at once: no metadata push, no periodic persist in between
        await eventually(lambda: perm_is(group.s, Permission.READ), "slave READ")
        before = read_state(admin)
        assert before is not None
        m.start()
        await eventually(lambda: (st := read_state(admin)) is not None and st.mode is Mode.NORMAL
                       and st.epoch > before.epoch, "NORMAL after back-sync", 40)
        await eventually(lambda: perm_is(group.m, Permission.FULL), "master FULL again")
        fetched = await request(group.m, p.Op.FETCH_OFFSET,
                                p.FetchOffsetRequest("cg", "t", [0, 1]).encode())
        assert p.OffsetsResponse.decode(fetched.body).offsets == {0: 17, 1: 5}
    finally:
        group.stop_all()


async def test_a_queue_with_no_pull_out_at_the_kill_reports_its_reads_restored_on_the_slave(
        zk: str, tmp_path: Path, admin: KazooClient) -> None:
    """A queue's pull loop that had no pull out when the master died (its next records
    waiting for the application) goes straight to the acting slave: none of its pulls
    fails. Its first pull answered there is still reported (``on_read_restored``, what the
    drill measures consumer-seen failover with: such a cycle had no figure)."""
    group = Group(zk, tmp_path, sync=True)
    admin.create(config_path(GROUP), group.config.to_json(), makepath=True)
    try:
        m, bootstrap = await started_with_topic(group, admin)
        # One message a request, so one a stored batch: a pull answer (whole batches)
        # holds a few of them.
        async with Producer(bootstrap, batch_size=1) as producer:
            await asyncio.gather(*[await producer.send("t", b"r%d" % i + b"." * 300, queue=0)
                                   for i in range(60)])
        # One batch buffered at most, and small pulls: the loop soon holds a pull's answer
        # it cannot hand over, and waits with no pull out.
        consumer = Consumer(bootstrap, group="cg", topic="t", max_wait_ms=200,
                            max_bytes=2048, prefetch_batches=1)
        restored: list[str] = []
        consumer.on_read_restored = lambda _q, address, _ns: restored.append(address)
        seen = {r.body for r in await consumer.getmany(timeout_s=5)}
        try:
            await eventually(lambda: consumer._buffer.full(), "the buffer full")
            m.kill9()
            await eventually(lambda: perm_is(group.s, Permission.READ), "slave READ after kill")
            await eventually(lambda: any(b.holds(Permission.READ) for b in (
                consumer.router.route.brokers_of(GROUP) if consumer.router.route else ())),
                "the consumer's route names the acting slave")
            deadline = time.monotonic() + 30
            while len(seen) < 60 and time.monotonic() < deadline:
                seen |= {r.body for r in await consumer.getmany(timeout_s=0.5)}
        finally:
            await consumer.close()
        assert len(seen) == 60
        assert restored == [f"127.0.0.1:{group.s.port}"]
    finally:
        group.stop_all()
