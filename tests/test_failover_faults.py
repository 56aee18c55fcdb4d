"""HA faults on a real local cluster: real ZooKeeper, real ``understudy broker --zk``
processes, the real ``understudy controller`` (``understudy_operator.local.cluster``).

What the other HA tests do not cover: the acting slave dying during slave-consume (with a
second slave, and without one), the master returning while every slave is down, two
controllers racing on real brokers, and the master's ZooKeeper session expiring while its
process lives (a partition between the master and ZooKeeper only).

Invariants are judged by the shared checker over the brokers' permission-change logs
(``drill.merge_permission_logs``). Every process a test starts is stopped by PID in a
``finally``: ``local down`` (by recorded PID), then anything still mentioning the test's
directory in its command line is SIGKILLed, and the partition proxy thread is closed.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from understudy_broker import protocol as p
from understudy_broker.client import request_once
from understudy_broker.model import Mode, Permission
from understudy_broker.zkclient import make_client
from understudy_broker.zklayout import decode_state, state_path
from understudy_harness.checker import Report, check
from understudy_harness.drill import merge_permission_logs
from understudy_harness.history import HistoryWriter, read_history
from understudy_harness.testing import PartitionProxy, isr_record, wait_until, zk_session
from understudy_operator.controller.journal import read_transitions
from understudy_operator.local import cluster as lc
from understudy_operator.local import procs
from understudy_operator.local.plan import CONTROLLER, ClusterPlan, transitions_log
from understudy_operator.local.ports import free_port

pytestmark = pytest.mark.integration

SESSION_MS = 2000


# ------------------------------------------------------------------------ fixtures


class Recorder:
    """The test's history: faults it causes and every group state (ZooKeeper watch),
    stamped with ``time.time_ns`` like the brokers' permission logs."""

    def __init__(self, plan: ClusterPlan, group: str = "g1") -> None:
        self.plan = plan
        self.group = group
        self.path = plan.dir / "history.jsonl"
        self.writer = HistoryWriter(self.path, clock=time.time_ns, clock_name="time_ns")
        self.states: list[tuple[str, int, str | None]] = []
        self._lock = threading.Lock()
        self.zk = make_client(plan.zk_connect, timeout_s=5.0)
        self.zk.start(timeout=10)
        self.zk.DataWatch(state_path(group), self._on_state)
        self._cycle = 0

    def _on_state(self, data: bytes | None, _stat: object) -> None:
        if data is None:
            return
        st = decode_state(data)
        with self._lock:
            if self.states and self.states[-1][1] == st.epoch:
                return
            self.states.append((st.mode.name, st.epoch, st.acting))
        self.writer.mode(group=self.group, mode=st.mode, epoch=st.epoch)

    def transitions(self) -> list[tuple[str, int, str | None]]:
        """Every state from the first one seen, as the controller's journal records its
        versioned writes. The watch above may coalesce two writes in quick succession
        (FENCING then SLAVE_CONSUME a few ms apart), the journal never does."""
        first = self.states[0]
        journal = read_transitions(transitions_log(self.plan.dir))
        return [first, *((t.mode.name, t.epoch, t.acting) for t in journal
                         if t.group == self.group and t.epoch > first[1])]

    def state(self) -> tuple[str, int, str | None]:
        with self._lock:
            return self.states[-1] if self.states else ("", 0, None)

    def wait(self, pred: Callable[[tuple[str, int, str | None]], bool], what: str,
             within_s: float = 20.0) -> tuple[str, int, str | None]:
        try:
            return wait_until(lambda: st if pred(st := self.state()) else None, what,
                              within_s, interval_s=0.02)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; states so far: {self.states}") from None

    def wait_mode(self, mode: str, *, acting: str | None = None, within_s: float = 20.0) -> tuple[str, int, str | None]:
        return self.wait(lambda s: s[0] == mode and (acting is None or s[2] == acting),
                         f"{mode} (acting {acting})", within_s)

    def kill(self, broker: str, sig: str = "KILL") -> None:
        self._cycle += 1
        self.writer.fault(cycle=self._cycle, kind="kill" if sig == "KILL" else "hang",
                          broker=broker, group=self.group)
        lc.kill(self.plan.dir, broker, sig=sig)

    def start(self, broker: str) -> None:
        lc.start(self.plan.dir, broker, wait=False)
        self.writer.restart(cycle=self._cycle, broker=broker, group=self.group)

    def close(self) -> None:
        self.zk.stop()
        self.zk.close()
        self.writer.close()

    def judge(self) -> Report:
        """After ``local down``: merge the permission logs and run the shared checker."""
        merge_permission_logs(self.plan, self.path)
        return check(read_history(self.path).events)


def readers_now(plan: ClusterPlan, group: str = "g1") -> list[str]:
    row = next(g for g in lc.status(plan.dir).groups if g.name == group)
    return [b.name for b in row.brokers if b.alive and Permission.READ in b.effective]


def degraded(plan: ClusterPlan) -> bool:
    metrics = lc.http_get(plan.controller_http_port or 0, "/metrics") or ""
    return re.search(r'understudy_group_degraded\{group="g1"\} 1\.0', metrics) is not None


def assert_one_reader(report: Report) -> None:
    assert report.one_reader_violations == 0, report.violations
    assert report.offset_rewinds == 0, report.violations
    assert report.violations == [], report.violations


# --------------------------------------------------------------- acting slave dies


def test_acting_slave_dies_and_the_other_slave_takes_over_never_two_readers(cluster_dir: Path) -> None:
    plan = lc.up(cluster_dir, slaves=2, session_timeout_ms=SESSION_MS)
    rec = Recorder(plan)
    try:
        rec.wait(lambda _s: readers_now(plan) == ["g1-0"], "the master reading")
        rec.kill("g1-0")
        _, epoch, acting = rec.wait_mode("SLAVE_CONSUME")
        assert acting in ("g1-1", "g1-2")
        other = "g1-2" if acting == "g1-1" else "g1-1"
        rec.wait(lambda _s: readers_now(plan) == [acting], f"{acting} reading")
        rec.kill(acting)
        _, epoch2, _ = rec.wait_mode("SLAVE_CONSUME", acting=other)
        assert epoch2 == epoch + 2  # FENCING(acting) then SLAVE_CONSUME: one transition each
        rec.wait(lambda _s: readers_now(plan) == [other], f"{other} reading")
        rec.start(acting)
        rec.start("g1-0")
        rec.wait_mode("NORMAL")
        rec.wait(lambda _s: readers_now(plan) == ["g1-0"], "the master reading again")
    finally:
        rec.close()
        lc.down(plan.dir)
    report = rec.judge()
    assert_one_reader(report)
    states = rec.transitions()
    assert [m for m, _, _ in states] == ["NORMAL", "FENCING", "SLAVE_CONSUME", "FENCING",
                                         "SLAVE_CONSUME", "RECOVERING", "NORMAL"], states
    assert [e for _, e, _ in states] == list(range(states[0][1], states[0][1] + 7))


def test_commits_through_the_acting_slave_survive_its_death(cluster_dir: Path) -> None:
    """Two slaves. The master dies; a consumer group commits through the acting slave; the
    acting slave dies (kill -9) right after: the other slave takes reads and holds the
    commit (the acting slave copied it there before acknowledging: server/mirror.py), and
    so does the master after the failback. Before, the other slave answered the offset the
    master had last replicated, and consumers re-read what they had committed."""
    plan = lc.up(cluster_dir, slaves=2, session_timeout_ms=SESSION_MS)
    rec = Recorder(plan)

    def ask(broker: str, op: p.Op, body: bytes) -> p.Frame:
        return asyncio.run(request_once(plan.address(broker), op, body, timeout_s=5))

    def committed(broker: str) -> int | None:
        frame = ask(broker, p.Op.FETCH_OFFSET, p.FetchOffsetRequest("cg", "t", [0]).encode())
        assert frame.status == p.Status.OK, p.error_message(frame)
        return p.OffsetsResponse.decode(frame.body).offsets[0]

    try:
        rec.wait(lambda _s: readers_now(plan) == ["g1-0"], "the master reading")
        assert ask("g1-0", p.Op.CREATE_TOPIC, p.CreateTopicRequest("t", 1).encode()).status == 0
        batch = p.ProduceRequest("t", [p.ProduceMessage(0, None, b"m%d" % i) for i in range(20)])
        assert ask("g1-0", p.Op.PRODUCE, batch.encode()).status == p.Status.OK
        commit = p.CommitOffsetRequest("cg", "t", {0: 5}).encode()
        assert ask("g1-0", p.Op.COMMIT_OFFSET, commit).status == p.Status.OK
        rec.kill("g1-0")
        _, epoch, acting = rec.wait_mode("SLAVE_CONSUME")
        assert acting is not None
        other = "g1-2" if acting == "g1-1" else "g1-1"
        rec.wait(lambda _s: readers_now(plan) == [acting], f"{acting} reading")
        frame = ask(acting, p.Op.COMMIT_OFFSET, p.CommitOffsetRequest("cg", "t", {0: 17}).encode())
        assert frame.status == p.Status.OK, p.error_message(frame)
        rec.kill(acting)
        rec.wait_mode("SLAVE_CONSUME", acting=other)
        rec.wait(lambda _s: readers_now(plan) == [other], f"{other} reading")
        assert committed(other) == 17
        # a copy from the dead acting slave's epoch (a late one) is refused, merges nothing
        late = p.BackSyncRequest("g1", acting, epoch, {"cg": {"t": {0: 19}}}).encode()
        frame = ask(other, p.Op.BACKSYNC_OFFSETS, late)
        assert frame.status == p.Status.STALE_EPOCH, p.error_message(frame)
        assert committed(other) == 17
        rec.start(acting)
        rec.start("g1-0")
        rec.wait_mode("NORMAL")
        rec.wait(lambda _s: readers_now(plan) == ["g1-0"], "the master reading again")
        assert committed("g1-0") == 17
    finally:
        rec.close()
        lc.down(plan.dir)
    assert_one_reader(rec.judge())


def test_a_slave_that_cannot_take_the_acting_slaves_commits_leaves_the_record_first(
        cluster_dir: Path) -> None:
    """Two slaves; the one that does not act is frozen (SIGSTOP). A commit through the
    acting slave is acknowledged only after the frozen one left the in-sync record, so when
    the acting slave dies the controller does not hand reads to the slave that lacks it."""
    plan = lc.up(cluster_dir, slaves=2, session_timeout_ms=SESSION_MS)
    rec = Recorder(plan)

    def ask(broker: str, op: p.Op, body: bytes) -> p.Frame:
        return asyncio.run(request_once(plan.address(broker), op, body, timeout_s=10))

    try:
        rec.wait(lambda _s: readers_now(plan) == ["g1-0"], "the master reading")
        assert ask("g1-0", p.Op.CREATE_TOPIC, p.CreateTopicRequest("t", 1).encode()).status == 0

        def known(broker: str) -> bool:  # the master's metadata frames carry its topics
            frame = ask(broker, p.Op.GET_ROUTE, p.GetRouteRequest("t").encode())
            return "t" in p.RouteResponse.decode(frame.body).topics

        wait_until(lambda: known("g1-1") and known("g1-2"), "the slaves to know topic t", 10)
        rec.kill("g1-0")
        _, _, acting = rec.wait_mode("SLAVE_CONSUME")
        other = "g1-2" if acting == "g1-1" else "g1-1"
        rec.wait(lambda _s: readers_now(plan) == [acting], f"{acting} reading")
        lc.kill(plan.dir, other, sig="STOP")
        frame = ask(acting, p.Op.COMMIT_OFFSET, p.CommitOffsetRequest("cg", "t", {0: 3}).encode())
        assert frame.status == p.Status.OK, p.error_message(frame)
        with zk_session(plan.zk_connect) as zk:
            assert isr_record(zk, "g1") == frozenset({acting})
        lc.kill(plan.dir, other, sig="CONT")
        rec.kill(acting)
        deadline = time.monotonic() + 3 * SESSION_MS / 1000
        while time.monotonic() < deadline:  # nobody may take reads: the other lacks offset 3
            assert other not in readers_now(plan)
            time.sleep(0.2)
    finally:
        rec.close()
        lc.down(plan.dir)
    assert_one_reader(rec.judge())


def test_every_slave_down_master_returns_degraded_then_recovers_when_the_slave_returns(
    cluster_dir: Path,
) -> None:
    """One slave: the acting slave dies during slave-consume (no reader: nobody else may
    take reads), the master returns while every slave is down (it must not read: the
    consumer offsets that moved on the slave would rewind), the human override refuses to
    make it read without ``--accept-rewind``, and the slave's return recovers the group."""
    plan = lc.up(cluster_dir, slaves=1, session_timeout_ms=SESSION_MS)
    rec = Recorder(plan)
    try:
        rec.wait(lambda _s: readers_now(plan) == ["g1-0"], "the master reading")
        rec.kill("g1-0")
        _, epoch, _ = rec.wait_mode("SLAVE_CONSUME", acting="g1-1")
        rec.wait(lambda _s: readers_now(plan) == ["g1-1"], "the slave reading")
        rec.kill("g1-1")
        rec.wait(lambda _s: readers_now(plan) == [], "no reader")
        # master and every slave down: Degraded, and nothing moves
        rec.wait(lambda _s: degraded(plan), "understudy_group_degraded 1")
        assert rec.state()[:2] == ("SLAVE_CONSUME", epoch), rec.states
        rec.start("g1-0")
        lc._wait_healthy(plan, plan.process("g1-0"), deadline=time.monotonic() + 20)
        # the master is back and every slave is down: several session timeouts pass and
        # neither the state nor any permission moves
        deadline = time.monotonic() + 3 * SESSION_MS / 1000
        while time.monotonic() < deadline:
            assert rec.state()[:2] == ("SLAVE_CONSUME", epoch), rec.states
            assert readers_now(plan) == []
            time.sleep(0.2)
        out = subprocess.run(
            [sys.executable, "-c", "from understudy_broker.cli import main; main()", "group",
             "force-mode", "--zk", plan.zk_connect, "--group", "g1", "--mode", "NORMAL", "--yes",
             "--pid-dir", str(plan.pid_dir)],
            capture_output=True, text=True, timeout=60,
        )
        assert out.returncode != 0, out.stdout + out.stderr
        assert "rewind" in (out.stdout + out.stderr).lower(), out.stdout + out.stderr
        assert rec.state()[:2] == ("SLAVE_CONSUME", epoch)
        rec.start("g1-1")
        rec.wait_mode("NORMAL")
        rec.wait(lambda _s: readers_now(plan) == ["g1-0"], "the master reading again")
    finally:
        rec.close()
        lc.down(plan.dir)
    report = rec.judge()
    assert_one_reader(report)
    states = rec.transitions()
    assert [m for m, _, _ in states][-2:] == ["RECOVERING", "NORMAL"], states


# ------------------------------------------------------------ two controllers racing


def test_two_controllers_on_real_brokers_make_exactly_one_transition_per_event(cluster_dir: Path) -> None:
    plan = lc.up(cluster_dir, slaves=1, session_timeout_ms=SESSION_MS)
    ctl = plan.process(CONTROLLER)
    second_port = free_port()
    argv = list(ctl.argv)
    argv[argv.index("--http-port") + 1] = str(second_port)
    argv[argv.index("--pid-dir") + 1] = str(plan.dir / "pids")
    rec = Recorder(plan)
    second = procs.spawn(argv, log=plan.log_dir / "controller-2.log", cwd=plan.dir)
    try:
        wait_until(lambda: lc.http_get(second_port, "/metrics") is not None,
                   "the second controller to serve /metrics", 20)
        _, first_epoch, _ = rec.state()
        cycles = 3
        for n in range(1, cycles + 1):
            rec.kill("g1-0")
            rec.wait_mode("SLAVE_CONSUME")
            rec.start("g1-0")
            rec.wait(lambda s, n=n: s[0] == "NORMAL" and s[1] == first_epoch + 4 * n,  # type: ignore[misc]
                     f"NORMAL after cycle {n}")
            if n == 1:  # the leader resigns: the other takes over mid-run
                first = procs.read_pid(plan.pid_dir, CONTROLLER)
                assert first is not None
                procs.stop(first, marker="controller")
        time.sleep(1.0)  # time for a stray double transition to show
        with zk_session(plan.zk_connect) as zk:
            data, stat = zk.get(state_path("g1"))
        st = decode_state(data)
        assert (st.mode, st.epoch) == (Mode.NORMAL, first_epoch + 4 * cycles), rec.states
        # every write to the state was one of these transitions: versions and epochs agree
        assert stat.version == st.epoch - 1
        states = rec.transitions()
        epochs = [e for _, e, _ in states]
        assert epochs == list(range(first_epoch, first_epoch + 4 * cycles + 1)), states
        assert [m for m, _, _ in states[1:5]] == ["FENCING", "SLAVE_CONSUME", "RECOVERING", "NORMAL"]
    finally:
        rec.close()
        procs.stop(second, marker="controller")
        lc.down(plan.dir)
    assert_one_reader(rec.judge())


# ------------------------------------------------- master partitioned from ZooKeeper


def test_master_session_expires_while_its_process_lives(cluster_dir: Path) -> None:
    """The master loses ZooKeeper (a silent partition of its ZooKeeper link only) until its
    session expires, then the link heals. Its slave still hears it, so nothing moves
    (seed 000 §3, scenario 3), and the master keeps reading throughout: its ZooKeeper
    confirmations fail, and its slave's echoes renew its read lease (docs/failover.md, "A
    master cut off from ZooKeeper only"). One reader throughout; after the heal the same
    process re-registers in a new session."""
    plan = lc.up(cluster_dir, slaves=1, session_timeout_ms=SESSION_MS)
    proxy = PartitionProxy(("127.0.0.1", plan.zk_port))
    rec = Recorder(plan)
    try:
        # route the master's ZooKeeper traffic through the proxy: restart it with that
        # connect string (a normal kill -9 failover and failback on the way)
        doc = json.loads((plan.dir / "cluster.json").read_text())
        text = json.dumps(doc).replace(f"127.0.0.1:{plan.zk_port}/", f"127.0.0.1:{proxy.port}/")
        master_doc = next(p for p in json.loads(text)["processes"] if p["name"] == "g1-0")
        for p in doc["processes"]:
            if p["name"] == "g1-0":
                p["argv"] = master_doc["argv"]
        (plan.dir / "cluster.json").write_text(json.dumps(doc))
        rec.wait(lambda _s: readers_now(plan) == ["g1-0"], "the master reading")
        rec.kill("g1-0")
        rec.wait_mode("SLAVE_CONSUME")
        rec.start("g1-0")
        _, epoch, _ = rec.wait_mode("NORMAL")
        rec.wait(lambda _s: readers_now(plan) == ["g1-0"], "the master reading via the proxy")
        master_pid = procs.read_pid(plan.pid_dir, "g1-0")
        cut_at = time.time_ns()
        proxy.cut()
        # the session must expire on the server: the ephemeral node goes away
        with zk_session(plan.zk_connect) as zk:
            wait_until(lambda: zk.exists("/groups/g1/live/g1-0") is None,
                       "the master's session to expire", 15)
        expired_at = time.time_ns()
        # stay partitioned a while past the expiry, the master process alive throughout
        time.sleep(2.0)
        info = procs.inspect(master_pid, marker=plan.process("g1-0").marker)
        assert info is not None
        assert info.alive
        assert not info.stopped
        states_during = list(rec.states)
        healed_at = time.time_ns()
        proxy.heal()
        rec.wait(lambda s: s[0] == "NORMAL" and readers_now(plan) == ["g1-0"],
                 "NORMAL with the master reading after the heal", within_s=30)
        assert procs.read_pid(plan.pid_dir, "g1-0") == master_pid  # the same process rejoined
    finally:
        rec.close()
        proxy.close()
        lc.down(plan.dir)
    report = rec.judge()
    assert_one_reader(report)
    # the master's own log: FULL before the cut and no change at all until after the heal
    # (its ZooKeeper lease lapsed ~1 s after the cut; the slave route carried it)
    from understudy_broker.ha.permlog import FILE_NAME, read_changes

    changes = [c for c in read_changes(plan.dir / "data" / "g1-0" / FILE_NAME) if c.pid == master_pid]
    before = [c for c in changes if c.t_ns < cut_at]
    assert before, changes
    assert before[-1].effective == Permission.FULL, changes
    assert [c for c in changes if cut_at <= c.t_ns <= healed_at] == [], changes
    assert expired_at > cut_at
    # DESIGN: a slave is eligible only with its link to the master down; here the slave
    # still hears the master (only the ZooKeeper path is cut), so the controller does not
    # hand reads over, and it never needs to.
    assert states_during[-1][:2] == ("NORMAL", epoch), states_during
    print(f"cut +0 ms, session expired +{(expired_at - cut_at) / 1e6:.0f} ms, healed "
          f"+{(healed_at - cut_at) / 1e6:.0f} ms; master log {[(round((c.t_ns - cut_at) / 1e6), c.effective.label) for c in changes]}; "
          f"states while partitioned {states_during}; epoch before {epoch}")
