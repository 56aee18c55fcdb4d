"""The controller end to end against a real ZooKeeper and real (fake) broker processes.

The brokers here are small Python processes, spawned per test, that hold a real
``BrokerCoordinator`` session (live node, watches, lease, status) and compute their
effective permission with ``model.effective_permission``. They simulate only the data
plane: a slave's "link to the master" is whether the master's process is running, a
returning master reports itself ready for back-sync and, in RECOVERING, "persists" the
back-synced offsets after a moment (unless told never to). Liveness by pid is real.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import signal
import sys
import time
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from understudy_broker.model import GroupState, Mode, Permission
from understudy_broker.zklayout import (
    BrokerSpec,
    BrokerStatus,
    FailoverPolicy,
    GroupConfig,
    config_path,
    decode_state,
    encode_state,
    state_path,
    status_dir,
)
from understudy_harness.testing import UNDERSTUDY, Process, eventually
from understudy_operator import zk as zkio
from understudy_operator.controller.driver import Controller
from understudy_operator.controller.liveness import ProcessTableLiveness
from understudy_operator.controller.machine import Decision
from understudy_operator.local.ports import free_port

pytestmark = pytest.mark.integration

GROUP = "g1"

FAKE_BROKER = r'''
import asyncio, os, sys, time, signal
from pathlib import Path
from understudy_broker.ha.coordinator import BrokerCoordinator
from understudy_broker.model import Health, Mode, Permission, Role, effective_permission
from understudy_broker.zklayout import BrokerStatus

connect, group, name, pid_dir, backsync = sys.argv[1:6]
pid_dir = Path(pid_dir)

def alive(broker):
    try:
        pid = int((pid_dir / f"{broker}.pid").read_text())
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except (OSError, ValueError):
        return False
    return stat[stat.rfind(b")") + 2:stat.rfind(b")") + 3] not in (b"T", b"t", b"Z", b"X")

async def main():
    loop = asyncio.get_running_loop()
    wake = asyncio.Event()
    coord = BrokerCoordinator(connect, group=group, name=name, session_timeout_s=1.0,
                              loop=loop, on_change=wake.set, address="127.0.0.1:1")
    await coord.start()
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    persisted = None
    recovering_seen = None
    while not stop.is_set():
        cfg, st = coord.config, coord.state
        if cfg is not None:
            spec = cfg.broker(name)
            slaves = [s.name for s in cfg.slaves]
            links = [s for s in slaves if alive(s)] if spec.ordinal == 0 else []
            health = Health(zk_live=coord.zk_live, zk_lost_for=coord.zk_lost_for(),
                            fence_after=1.0, slaves_assigned=bool(slaves),
                            slave_connected=bool(links), slave_once_connected=True,
                            lease_valid=coord.lease_valid())
            eff = effective_permission(role=spec.role, name=name, configured=spec.permission,
                                       state=st, health=health)
            ready = spec.ordinal == 0 and st is not None and st.mode is not Mode.NORMAL \
                and not eff & Permission.READ
            if spec.ordinal == 0 and st is not None and st.mode is Mode.RECOVERING \
                    and backsync == "auto":
                if recovering_seen != st.epoch:
                    recovering_seen = st.epoch
                    recovering_at = time.monotonic()
                elif time.monotonic() - recovering_at > 0.2:
                    persisted = st.epoch
            status = BrokerStatus(
                broker=name, effective=eff, epoch_applied=st.epoch if st else 0,
                master_link=spec.ordinal != 0 and alive(cfg.master.name),
                slave_links=tuple(links), max_offset=100 + spec.ordinal,
                ready=ready, backsync_epoch=persisted, pid=os.getpid(),
                updated_ms=int(time.time() * 1000))
            try:
                await coord.publish_status(status)
            except Exception as exc:
                print("status:", exc, file=sys.stderr)
        wake.clear()
        try:
            async with asyncio.timeout(0.1):
                await wake.wait()
        except asyncio.TimeoutError:
            pass
    await coord.stop()

asyncio.run(main())
'''


class Cluster:
    """Fake broker processes with pid files, started and stopped by PID."""

    def __init__(self, connect: str, root: Path, *, backsync: str = "auto") -> None:
        self.connect = connect
        self.root = root
        self.pid_dir = root / "pids"
        self.pid_dir.mkdir()
        self.script = root / "fake_broker.py"
        self.script.write_text(FAKE_BROKER)
        self.backsync = backsync
        self.procs: dict[str, Process] = {}

    def start(self, name: str) -> None:
        argv = [sys.executable, str(self.script), self.connect, GROUP, name, str(self.pid_dir),
                self.backsync]
        self.procs[name] = Process(name, argv, self.root / f"{name}.log",
                                   pid_file=self.pid_dir / f"{name}.pid").start()

    def signal(self, name: str, sig: signal.Signals) -> None:
        os.kill(self.procs[name].pid, sig)

    def kill(self, name: str) -> None:
        self.procs[name].kill9()

    def stop_all(self) -> None:
        for proc in self.procs.values():
            proc.kill9()


def config(slaves: int = 2, *, backsync_timeout: float = 5.0) -> GroupConfig:
    return GroupConfig(
        group=GROUP,
        brokers=tuple(
            BrokerSpec(f"b{i}", i, "127.0.0.1", 1 + i, 2, 3,
                       Permission.FULL if i == 0 else Permission.READ)
            for i in range(slaves + 1)
        ),
        failover=FailoverPolicy(check_interval_ms=100, detection_checks=2,
                                backsync_timeout_s=backsync_timeout),
        session_timeout_ms=1000,
    ).validate()


@pytest.fixture
def cluster(zk: str, tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(zk, tmp_path)
    try:
        yield c
    finally:
        c.stop_all()


def children(admin: KazooClient, kind: str) -> list[str]:
    """The group's ``live`` or ``status`` children; none while the parent is not created yet."""
    try:
        return list(admin.get_children(f"/groups/{GROUP}/{kind}"))
    except NoNodeError:
        return []


def live(admin: KazooClient) -> list[str]:
    return children(admin, "live")


def read_state(admin: KazooClient) -> GroupState | None:
    if admin.exists(state_path(GROUP)) is None:
        return None
    return decode_state(admin.get(state_path(GROUP))[0])


@pytest.fixture
async def controller(zk: str, cluster: Cluster) -> AsyncIterator[tuple[Controller, list[GroupState]]]:
    loop = asyncio.get_running_loop()
    written: list[GroupState] = []
    ctl = Controller(zk, groups=[GROUP], liveness=ProcessTableLiveness(cluster.pid_dir, loop),
                     loop=loop, session_timeout_s=2.0,
                     on_transition=lambda g, old, new: written.append(new))
    await ctl.start()
    try:
        yield ctl, written
    finally:
        await ctl.stop()


def mode_is(admin: KazooClient, mode: Mode, acting: str | None = None) -> Callable[[], bool]:
    def check() -> bool:
        st = read_state(admin)
        return st is not None and st.mode is mode and (acting is None or st.acting == acting)
    return check


async def master_and_slave_normal(admin: KazooClient, cluster: Cluster) -> None:
    """A group of b0 and b1, both live, NORMAL."""
    admin.create(config_path(GROUP), config(slaves=1).to_json(), makepath=True)
    for name in ("b0", "b1"):
        cluster.start(name)
    await eventually(lambda: len(live(admin)) == 2, "2 live brokers")
    await eventually(mode_is(admin, Mode.NORMAL), "NORMAL")


async def test_kill_master_fails_over_and_back(
        admin: KazooClient, cluster: Cluster, controller: tuple[Controller, list[GroupState]]) -> None:
    ctl, written = controller
    admin.create(config_path(GROUP), config().to_json(), makepath=True)
    await eventually(mode_is(admin, Mode.NORMAL), "the initial state")
    for name in ("b0", "b1", "b2"):
        cluster.start(name)
    await eventually(lambda: len(live(admin)) == 3, "3 live brokers")
    cluster.kill("b0")  # certain death: acts on the pidfd event
    await eventually(lambda: len(written) == 2, "slave-consume")
    st = read_state(admin)
    assert st is not None
    # Either slave may act: the controller picks among the slaves *eligible at that moment*
    # (link to the master reported down), and the fakes notice the kill up to a poll apart.
    # Ranking by offset is covered purely in test_controller_machine.py.
    assert st.acting in ("b1", "b2")
    assert [s.mode for s in written[:2]] == [Mode.FENCING, Mode.SLAVE_CONSUME]
    assert "process exited" in written[0].reason
    cluster.start("b0")
    await eventually(lambda: len(written) == 4, "back to NORMAL after back-sync")
    assert [s.mode for s in written] == [Mode.FENCING, Mode.SLAVE_CONSUME, Mode.RECOVERING,
                                         Mode.NORMAL]
    assert [s.epoch for s in written] == [2, 3, 4, 5]
    reg = ctl.metrics.registry
    assert reg.get_sample_value("understudy_failover_total", {"group": GROUP}) == 1.0
    assert reg.get_sample_value("understudy_group_epoch", {"group": GROUP}) == 5.0
    assert reg.get_sample_value("understudy_group_mode", {"group": GROUP}) == 0.0
    for phase in ("detect", "fence", "switch", "backsync"):
        count = reg.get_sample_value("understudy_failover_phase_seconds_count",
                                     {"group": GROUP, "phase": phase})
        assert count == 1.0, phase


async def test_stopped_master_is_fenced_after_session_expiry(
        admin: KazooClient, cluster: Cluster, controller: tuple[Controller, list[GroupState]]) -> None:
    _, written = controller
    await master_and_slave_normal(admin, cluster)
    cluster.signal("b0", signal.SIGSTOP)
    try:
        await eventually(mode_is(admin, Mode.FENCING), "fencing a stopped master")
        # Not proof: the session is still alive. Proof arrives with the session expiry.
        await eventually(lambda: len(written) == 2, "slave-consume")
        assert (written[1].mode, written[1].acting) == (Mode.SLAVE_CONSUME, "b1")
        assert "session is gone" in written[1].reason
    finally:
        cluster.signal("b0", signal.SIGCONT)
    # The resumed master re-registers, acks NONE, is ready, back-syncs: NORMAL again.
    await eventually(lambda: len(written) == 4, "NORMAL after SIGCONT")
    assert [s.mode for s in written] == [Mode.FENCING, Mode.SLAVE_CONSUME, Mode.RECOVERING,
                                         Mode.NORMAL]


async def test_acting_slave_death_moves_reads_through_fencing(
        admin: KazooClient, cluster: Cluster, controller: tuple[Controller, list[GroupState]]) -> None:
    _, written = controller
    admin.create(config_path(GROUP), config().to_json(), makepath=True)
    for name in ("b0", "b1", "b2"):
        cluster.start(name)
    await eventually(lambda: len(live(admin)) == 3, "3 live brokers")
    # b2 (the higher offset) is chosen only once the controller has seen both slaves'
    # statuses; live nodes come first, and under load a status can lag them.
    await eventually(lambda: slaves_linked(admin, "b1", "b2"), "both slaves' statuses")
    cluster.kill("b0")
    await eventually(mode_is(admin, Mode.SLAVE_CONSUME, "b2"), "b2 acting")
    cluster.kill("b2")
    await eventually(lambda: len(written) == 4, "b1 acting")
    modes = [(s.mode, s.acting) for s in written]
    assert modes == [(Mode.FENCING, None), (Mode.SLAVE_CONSUME, "b2"), (Mode.FENCING, "b2"),
                     (Mode.SLAVE_CONSUME, "b1")]
    # Everyone down: degraded, and nothing moves.
    cluster.kill("b1")
    await eventually(lambda: _gauge(controller[0], "understudy_group_degraded") == 1.0, "degraded")
    before = read_state(admin)
    await asyncio.sleep(0.5)
    assert read_state(admin) == before
    # The master returns while every slave is down: it must not be given READ (b1's
    # offsets are not back-synced), so the group stays in SLAVE_CONSUME.
    cluster.start("b0")
    await eventually(lambda: "b0" in live(admin), "b0 live")
    await asyncio.sleep(0.5)
    st = read_state(admin)
    assert st is not None
    assert st.mode is Mode.SLAVE_CONSUME


def slaves_linked(admin: KazooClient, *names: str) -> bool:
    """Every named slave has published a status with its master link up."""
    for name in names:
        try:
            data, _ = admin.get(f"{status_dir(GROUP)}/{name}")
        except NoNodeError:
            return False
        if not BrokerStatus.from_json(data).master_link:
            return False
    return True


def _written_by(written: list[tuple[str, GroupState]], ident: str, _group: str,
                _old: GroupState, new: GroupState) -> None:
    written.append((ident, new))


def _gauge(ctl: Controller, name: str) -> float | None:
    value = ctl.metrics.registry.get_sample_value(name, {"group": GROUP})
    return value


async def test_backsync_timeout_returns_to_slave_consume(
        admin: KazooClient, zk: str, tmp_path: Path) -> None:
    cluster = Cluster(zk, tmp_path, backsync="never")
    loop = asyncio.get_running_loop()
    written: list[GroupState] = []
    ctl = Controller(zk, groups=[GROUP], liveness=ProcessTableLiveness(cluster.pid_dir, loop),
                     loop=loop, on_transition=lambda g, old, new: written.append(new))
    try:
        admin.create(config_path(GROUP), config(slaves=1, backsync_timeout=0.5).to_json(),
                     makepath=True)
        await ctl.start()
        for name in ("b0", "b1"):
            cluster.start(name)
        await eventually(lambda: len(live(admin)) == 2, "2 live")
        cluster.kill("b0")
        await eventually(mode_is(admin, Mode.SLAVE_CONSUME), "slave-consume")
        cluster.start("b0")
        await eventually(lambda: any(s.mode is Mode.RECOVERING for s in written), "recovering")
        await eventually(lambda: len(written) >= 4, "the timeout")
        assert written[3].mode is Mode.SLAVE_CONSUME
        assert "not persisted within 0.5s" in written[3].reason
    finally:
        await ctl.stop()
        cluster.stop_all()


async def test_a_stop_during_a_transition_write_still_records_it(
        admin: KazooClient, cluster: Cluster, zk: str) -> None:
    """ZooKeeper applies a write whose answer the controller has not processed yet; a
    stop (SIGTERM) landing in that moment must not leave a state in ZooKeeper that the
    journal never saw. The answer is held back here to make the moment wide."""
    loop = asyncio.get_running_loop()
    written: list[GroupState] = []
    ctl = Controller(zk, groups=[GROUP], liveness=ProcessTableLiveness(cluster.pid_dir, loop),
                     loop=loop, session_timeout_s=2.0,
                     on_transition=lambda g, old, new: written.append(new))
    applied = asyncio.Event()
    answer = asyncio.Event()
    write_state = ctl.zk.write_state

    async def answered_late(group: str, new: GroupState, *, version: int) -> bool:
        ok = await write_state(group, new, version=version)
        applied.set()
        await answer.wait()
        return ok

    ctl.zk.write_state = answered_late  # type: ignore[method-assign]
    stopping: asyncio.Task[None] | None = None
    try:
        admin.create(config_path(GROUP), config(slaves=1).to_json(), makepath=True)
        await ctl.start()
        for name in ("b0", "b1"):
            cluster.start(name)
        await eventually(lambda: len(live(admin)) == 2, "2 live")
        await eventually(mode_is(admin, Mode.NORMAL), "NORMAL")
        cluster.kill("b0")
        async with asyncio.timeout(20):
            await applied.wait()
        in_zk = read_state(admin)
        assert in_zk is not None
        assert in_zk.mode is Mode.FENCING
        assert written == []  # the answer is not back yet
        stopping = loop.create_task(ctl.stop())
        await asyncio.sleep(0.3)
        assert not stopping.done()  # the stop waits for the write in flight
        answer.set()
        async with asyncio.timeout(10):
            await stopping
        assert written == [in_zk]
        assert read_state(admin) == in_zk  # and nothing was started after the stop
    finally:
        answer.set()
        if stopping is None:
            await ctl.stop()
        cluster.stop_all()


async def test_a_quiet_groups_checks_send_no_request_to_zookeeper(
        admin: KazooClient, cluster: Cluster, controller: tuple[Controller, list[GroupState]]) -> None:
    """Watches keep the config, the state, the live set, the statuses and the in-sync
    record; a group at rest is checked every 100 ms without reading any of them again.
    A change still moves it at once: the move is decided again on fresh reads."""
    ctl, written = controller
    await master_and_slave_normal(admin, cluster)
    await eventually(lambda: slaves_linked(admin, "b1"), "b1's status")
    # The fakes keep no in-sync record; a real master does (watched as the rest).
    admin.create(f"/groups/{GROUP}/isr", json.dumps({"inSync": ["b1"]}).encode())
    driver = ctl.drivers[0]
    reads: list[str] = []
    stays: list[float] = []
    zk = ctl.zk
    for method in ("read_group", "observe_group", "read_isr", "read_state", "read_config"):
        real = getattr(zk, method)

        def spy(*args: object, _real: Callable[..., object] = real, _m: str = method,
                **kwargs: object) -> object:
            reads.append(_m)
            return _real(*args, **kwargs)
        setattr(zk, method, spy)
    stay = driver._stay

    def counted(decision: Decision, interval: float) -> float:
        stays.append(time.monotonic())
        return stay(decision, interval)
    driver._stay = counted  # type: ignore[method-assign]
    await asyncio.sleep(1.0)
    assert len(stays) >= 5, stays  # checked every 100 ms (some time lost to a busy machine)
    assert reads == []
    cluster.kill("b0")
    await eventually(lambda: len(written) == 2, "slave-consume")
    assert [s.mode for s in written] == [Mode.FENCING, Mode.SLAVE_CONSUME]
    # Each move was decided on fresh reads: FENCING on one, SLAVE_CONSUME on the one sent
    # with FENCING's write (answered after it).
    assert reads.count("read_group") >= 2, reads


async def test_racing_drivers_write_each_epoch_once(
        admin: KazooClient, cluster: Cluster, zk: str) -> None:
    """Two controllers that both believe they lead (election bypassed on purpose) decide
    on the same events at the same moments: the versioned write lets exactly one win."""
    loop = asyncio.get_running_loop()
    written: list[tuple[str, GroupState]] = []
    ctls = [
        Controller(zk, groups=[GROUP], liveness=ProcessTableLiveness(cluster.pid_dir, loop),
                   loop=loop, identity=ident,
                   on_transition=functools.partial(_written_by, written, ident))
        for ident in ("c1", "c2")
    ]
    for c in ctls:
        await c.zk.start(timeout_s=10)
    try:
        admin.create(config_path(GROUP), config(slaves=1).to_json(), makepath=True)
        drivers = [c.drivers[0] for c in ctls]
        await asyncio.gather(*(d.check_once() for d in drivers))
        assert read_state(admin) == GroupState(Mode.NORMAL, 1, since=read_state(admin).since,  # type: ignore[union-attr]
                                               reason="initial state")
        for name in ("b0", "b1"):
            cluster.start(name)
        await eventually(lambda: len(live(admin)) == 2, "2 live")
        cluster.kill("b0")
        for _ in range(40):
            await asyncio.gather(*(d.check_once() for d in drivers))
        cluster.start("b0")
        deadline = time.monotonic() + 20
        while not mode_is(admin, Mode.NORMAL)() or len(written) < 4:
            assert time.monotonic() < deadline, written
            await asyncio.gather(*(d.check_once() for d in drivers))
            await asyncio.sleep(0.05)
        epochs = [s.epoch for _, s in written]
        assert epochs == sorted(set(epochs)), written  # no epoch written twice
        assert epochs == [2, 3, 4, 5]
        assert read_state(admin).epoch == 5  # type: ignore[union-attr]
    finally:
        for c in ctls:
            c.liveness.close()
            await c.zk.stop()


async def test_election_one_leader_and_handover(admin: KazooClient, zk: str, tmp_path: Path) -> None:
    loop = asyncio.get_running_loop()
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    admin.create(config_path(GROUP), config().to_json(), makepath=True)
    a = Controller(zk, groups=[GROUP], liveness=ProcessTableLiveness(pid_dir, loop), loop=loop,
                   identity="a")
    b = Controller(zk, groups=[GROUP], liveness=ProcessTableLiveness(pid_dir, loop), loop=loop,
                   identity="b")
    await a.start()
    try:
        await eventually(lambda: a.leading(GROUP), "a leading")
        await b.start()
        try:
            await asyncio.sleep(0.3)
            assert not b.leading(GROUP)
            assert b.metrics.registry.get_sample_value("understudy_group_mode", {"group": GROUP}) is None
            assert a.metrics.registry.get_sample_value("understudy_group_mode", {"group": GROUP}) == 0
            await a.stop()
            await eventually(lambda: b.leading(GROUP), "b taking over")
            await eventually(lambda: b.metrics.registry.get_sample_value(
                "understudy_group_epoch", {"group": GROUP}) == 1.0, "b exporting the group")
        finally:
            await b.stop()
    finally:
        await a.stop()


def test_cli_controller_runs_and_resigns_on_sigterm(admin: KazooClient, zk: str, tmp_path: Path) -> None:
    admin.create(config_path(GROUP), config().to_json(), makepath=True)
    port = free_port()
    proc = Process("controller", [*UNDERSTUDY, "controller", "--zk", zk, "--group", GROUP,
                                  "--pid-dir", str(tmp_path), "--http-port", str(port)],
                   tmp_path / "controller.log").start(wait_port=False)
    try:
        deadline = time.monotonic() + 20
        while read_state(admin) is None:
            assert proc.poll() is None, proc.log()
            assert time.monotonic() < deadline
            time.sleep(0.05)
        body = ""
        while "understudy_group_mode{" not in body:
            assert time.monotonic() < deadline
            with contextlib.suppress(OSError):
                body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
            time.sleep(0.05)
        assert admin.get_children(f"/controllers/{GROUP}")
        assert proc.stop(timeout_s=15) == 0  # SIGTERM: resign and exit cleanly
        assert admin.get_children(f"/controllers/{GROUP}") == []  # resigned at once
        assert "resigning" in proc.log()
    finally:
        proc.kill9()


def test_cli_controller_rejects_bad_flags(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from understudy_operator.cli.controller import controller as cmd

    r = CliRunner().invoke(cmd, ["--zk", "127.0.0.1:1", "--group", "Bad_Name", "--http-port", "0",
                                 "--pid-dir", str(tmp_path)])
    assert r.exit_code == 2
    assert "DNS label" in r.output
    r = CliRunner().invoke(cmd, ["--zk", "127.0.0.1:1", "--group", "g", "--http-port", "0"])
    assert r.exit_code == 2
    assert "needs --pid-dir" in r.output
    r = CliRunner().invoke(cmd, ["--zk", "127.0.0.1:1", "--group", "g", "--http-port", "0",
                                 "--liveness", "none", "--digest", "nocolon"])
    assert r.exit_code == 2
    assert "USER:PASSWORD" in r.output


def test_malformed_state_is_reported_not_fatal(admin: KazooClient, zk: str, tmp_path: Path) -> None:
    admin.create(config_path(GROUP), config().to_json(), makepath=True)
    admin.create(state_path(GROUP), b"garbage", makepath=True)

    async def go() -> None:
        loop = asyncio.get_running_loop()
        ctl = Controller(zk, groups=[GROUP], liveness=ProcessTableLiveness(tmp_path, loop), loop=loop)
        await ctl.zk.start(timeout_s=10)
        try:
            assert await ctl.drivers[0].check_once() > 0
            assert admin.get(state_path(GROUP))[0] == b"garbage"  # untouched
            admin.set(state_path(GROUP), encode_state(GroupState(Mode.NORMAL, 7)))
            await ctl.drivers[0].check_once()
            assert ctl.drivers[0].last_decision is not None
        finally:
            ctl.liveness.close()
            await ctl.zk.stop()

    asyncio.run(go())
    assert json.loads(admin.get(state_path(GROUP))[0])["epoch"] == 7


async def test_recorded_in_sync_set_limits_the_acting_choice(
        admin: KazooClient, cluster: Cluster, controller: tuple[Controller, list[GroupState]]) -> None:
    from understudy_broker.zklayout import isr_path

    _, written = controller
    admin.create(config_path(GROUP), config().to_json(), makepath=True)
    admin.create(isr_path(GROUP), json.dumps({"inSync": ["b1"]}).encode(), makepath=True)
    for name in ("b0", "b1", "b2"):
        cluster.start(name)
    await eventually(lambda: len(live(admin)) == 3, "3 live brokers")
    await eventually(lambda: len(children(admin, "status")) == 3, "statuses")
    cluster.kill("b0")
    await eventually(lambda: len(written) == 2, "slave-consume")
    assert written[1].acting == "b1"  # b2 has the higher offset but is not in sync


async def test_malformed_in_sync_record_trusts_no_slave(
        admin: KazooClient, cluster: Cluster, controller: tuple[Controller, list[GroupState]]) -> None:
    from understudy_broker.zklayout import isr_path

    ctl, written = controller
    admin.create(config_path(GROUP), config(slaves=1).to_json(), makepath=True)
    admin.create(isr_path(GROUP), b"{oops", makepath=True)
    for name in ("b0", "b1"):
        cluster.start(name)
    await eventually(lambda: len(live(admin)) == 2, "2 live brokers")
    await eventually(lambda: read_state(admin) is not None, "initial state")
    cluster.kill("b0")
    await eventually(lambda: ctl.drivers[0].last_decision is not None
                   and "no eligible slave" in ctl.drivers[0].last_decision.reason, "a decision")
    assert written == []


def test_malformed_config_and_status_are_reported_not_fatal(
        admin: KazooClient, zk: str, tmp_path: Path) -> None:
    admin.create(config_path(GROUP), b'{"group": "g1", "brokers": "nope"}', makepath=True)

    async def go() -> None:
        loop = asyncio.get_running_loop()
        ctl = Controller(zk, groups=[GROUP], liveness=ProcessTableLiveness(tmp_path, loop), loop=loop)
        await ctl.zk.start(timeout_s=10)
        try:
            driver = ctl.drivers[0]
            assert await driver.check_once() > 0  # not deciding, not crashing
            assert read_state(admin) is None  # nothing created from a broken config
            admin.set(config_path(GROUP), config(slaves=1).to_json())
            admin.create(f"/groups/{GROUP}/status/b1", b"\xff not json", makepath=True)
            assert await driver.check_once() == 0  # creates the initial state
            await driver.check_once()
            decision = driver.last_decision
            assert decision is not None
            assert decision.target is None  # b1's unreadable status makes it ineligible
        finally:
            ctl.liveness.close()
            await ctl.zk.stop()

    asyncio.run(go())
    st = read_state(admin)
    assert st is not None
    assert (st.mode, st.epoch) == (Mode.NORMAL, 1)


async def test_read_group_reads_after_the_write_sent_with_it(admin: KazooClient, zk: str) -> None:
    """``ZkGateway.read_group``: config, state and observation in one call; with a write,
    the reads are answered after it (the driver decides its next move on them), a write
    over a stale version does not take and the reads show who moved the state; an
    observation asked for other brokers than the config names is not handed out."""
    admin.create(config_path(GROUP), config(slaves=1).to_json(), makepath=True)
    first = GroupState(Mode.NORMAL, 1, since=1.0, reason="initial state")
    admin.create(state_path(GROUP), encode_state(first))
    admin.create(f"/groups/{GROUP}/status/b1", BrokerStatus(
        broker="b1", effective=Permission.NONE, epoch_applied=1).to_json(), makepath=True)
    gw = zkio.gateway(zk, timeout_s=5.0)
    await gw.start(timeout_s=10)
    try:
        found = await gw.read_group(GROUP, ["b0", "b1"])
        assert found.config == config(slaves=1)
        assert found.state == first
        assert found.version == 0
        assert found.observation is not None
        assert found.written is None
        assert found.observation.view("b1").status is not None
        assert not found.observation.view("b0").zk_live

        fencing = GroupState(Mode.FENCING, 2, since=2.0, reason="test")
        after = await gw.read_group(GROUP, ["b0", "b1"], write=(fencing, 0))
        assert after.written is True
        assert after.written_at is not None
        assert (after.state, after.version) == (fencing, 1)  # read after the write

        stale = GroupState(Mode.NORMAL, 2, since=3.0, reason="stale")
        lost = await gw.read_group(GROUP, ["b0", "b1"], write=(stale, 0))
        assert lost.written is False
        assert (lost.state, lost.version) == (fencing, 1)
        assert read_state(admin) == fencing

        # A read that fails after the write was answered (a lost connection, here a read
        # made to fail): the write's outcome still comes back, so it can be recorded.
        recovering = GroupState(Mode.RECOVERING, 3, since=4.0, reason="test")

        async def broken(*_args: object, **_kwargs: object) -> None:
            raise zkio.ZkError("connection lost after the write's answer")
        gw.read_isr = broken  # type: ignore[method-assign]
        cut = await gw.read_group(GROUP, ["b0", "b1"], write=(recovering, 1))
        assert cut.written is True
        assert isinstance(cut.failed, zkio.ZkError)
        assert cut.state is None
        assert read_state(admin) == recovering
        with pytest.raises(zkio.ZkError):
            await gw.read_group(GROUP, ["b0", "b1"])  # no write: the failure is raised
        del gw.read_isr

        other = await gw.read_group(GROUP, ["b0", "b9"])
        assert other.config is not None
        assert other.observation is None
    finally:
        await gw.stop()
