"""A three-server ZooKeeper ensemble under a serving group: real ZooKeeper servers (one
process each), real ``understudy broker --zk`` processes and the real controller
(``understudy local up --zk-ensemble 3``), with a producer and two consumer groups running.

What it proves:

* killing the ZooKeeper leader (``kill -9``) elects another leader, every broker keeps its
  ZooKeeper session (it moves to a surviving server), the controller writes no transition,
  the master keeps WRITE and reads again at once, produce and consume go on, and the
  killed server rejoins as a follower when it is started again;
* losing the quorum (two of three servers down) for longer than a session: the lone
  server serves nobody; the controller decides nothing; the master keeps WRITE (a slave is
  connected: not isolated, seed 000 §3) and drops READ when its lease lapses (DESIGN
  "Read leases": only a ZooKeeper confirmation renews it); the slave never reads. When
  the quorum is back every session is still the same (ZooKeeper restarts each session's
  timeout under a new leader; the client must reconnect within it), the master reads
  again at the same epoch, and the shared checker finds nothing lost and one reader at
  most throughout;
* ``understudy local up --zk-ensemble 3`` / ``status --json`` / ``down``: three servers,
  one leader, nothing left running.

Every process is stopped by PID whatever the outcome: ``local down`` (recorded PIDs), then
anything still naming the test's directory (the shared ``cluster_dir`` fixture), and the
``zk_ensemble`` fixture's servers by their PIDs.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from click.testing import CliRunner

from understudy_broker.ha.permlog import FILE_NAME, PermissionChange, read_changes
from understudy_broker.model import Permission
from understudy_broker.zklayout import decode_state, live_path, state_path
from understudy_harness.checker import Report, check
from understudy_harness.drill import merge_permission_logs, merge_transitions, traffic_targets
from understudy_harness.history import HistoryWriter, read_history
from understudy_harness.testing import eventually, wait_until, zk_session
from understudy_harness.workload import Traffic, TrafficCounts
from understudy_operator.cli.local import local
from understudy_operator.controller.journal import read_transitions
from understudy_operator.local import cluster as lc
from understudy_operator.local import procs
from understudy_operator.local.plan import ClusterPlan, ZkNode, plan_cluster, transitions_log
from understudy_operator.local.zkserver import ZooKeeperEnsemble

pytestmark = pytest.mark.integration

SESSION_MS = 2000
BROKERS = ("g1-0", "g1-1")


# ------------------------------------------------------------------------ helpers


def zk_modes(directory: Path) -> dict[str, str | None]:
    """Each ZooKeeper server's mode as ``local status`` reports it (None: not serving)."""
    return {n.name: n.mode for n in lc.status(directory).zk_nodes}


def leader_of(directory: Path) -> str | None:
    return next((name for name, mode in zk_modes(directory).items() if mode == "leader"), None)


def sessions(plan: ClusterPlan) -> dict[str, int]:
    """The ZooKeeper session that owns each broker's ``live`` node."""
    with zk_session(plan.zk_connect) as zk:
        return {b: zk.exists(live_path("g1", b)).ephemeralOwner for b in BROKERS}


def group_state(plan: ClusterPlan) -> tuple[str, int, int]:
    """``(mode, epoch, znode version)`` of the group's state."""
    with zk_session(plan.zk_connect) as zk:
        data, stat = zk.get(state_path("g1"))
    st = decode_state(data)
    return st.mode.name, st.epoch, stat.version


def changes(plan: ClusterPlan, broker: str) -> list[PermissionChange]:
    return list(read_changes(plan.dir / "data" / broker / FILE_NAME))


def held_at(log: list[PermissionChange], t_ns: int) -> Permission:
    """What a broker held at ``t_ns`` according to its permission-change log."""
    held = Permission.NONE
    for c in log:
        if c.t_ns > t_ns:
            break
        held = c.effective
    return held


def since(plan: ClusterPlan, broker: str, t_ns: int) -> list[tuple[int, Permission]]:
    """``(t_ns, effective)``: what ``broker`` held at ``t_ns``, then every change after."""
    log = changes(plan, broker)
    return [(t_ns, held_at(log, t_ns)), *((c.t_ns, c.effective) for c in log if c.t_ns > t_ns)]


def without(held: list[tuple[int, Permission]], perm: Permission, *, end_ns: int
            ) -> list[tuple[int, int]]:
    """The stretches ``(start, end)`` in which ``held`` lacks ``perm``, up to ``end_ns``."""
    out: list[tuple[int, int]] = []
    start: int | None = None
    for t, eff in [*((t, e) for t, e in held if t < end_ns), (end_ns, perm)]:
        if perm not in eff and start is None:
            start = t
        elif perm in eff and start is not None:
            out.append((start, t))
            start = None
    return out


def judge(plan: ClusterPlan, history: Path) -> Report:
    """After ``local down``: the controller's transitions and every broker's permission
    log into the history, then the shared checker."""
    merge_transitions(plan, history)
    merge_permission_logs(plan, history)
    return check(read_history(history).events)


def assert_clean(report: Report) -> None:
    assert report.acked > 0
    assert report.lost_acked == 0, report.violations
    assert report.one_reader_violations == 0, report.violations
    assert report.offset_rewinds == 0, report.violations
    assert report.violations == [], report.violations


@asynccontextmanager
async def traffic_on(plan: ClusterPlan, history: Path
                     ) -> AsyncIterator[tuple[Traffic, TrafficCounts]]:
    """The drill's recorded traffic on group g1 (one producer, two consumer groups) into
    ``history``; drained, then stopped, when the block ends."""
    counts = TrafficCounts()
    with HistoryWriter(history, clock=time.time_ns, clock_name="time_ns") as writer:
        traffic = Traffic(traffic_targets(plan), writer, counts, rate=100.0, queues=2,
                          session_timeout_ms=SESSION_MS)
        try:
            await traffic.start()
            await eventually(lambda: counts.acked > 50 and counts.delivered > 50,
                             "traffic to flow", 20)
            yield traffic, counts
            assert await traffic.finish(drain_timeout=20), "the drain did not complete"
        finally:
            await traffic.shutdown()


async def flowing(counts: TrafficCounts, what: str, *, within_s: float = 15.0) -> None:
    """Produce and consume both move on from here."""
    acked, delivered = counts.acked, counts.delivered
    await eventually(lambda: counts.acked > acked + 30 and counts.delivered > delivered + 30,
                     what, within_s)


@pytest.fixture
def ensemble_dir(cluster_dir: Path) -> Iterator[Path]:
    """:func:`cluster_dir`, and no process left behind is a failure."""
    yield cluster_dir
    if (cluster_dir / "cluster.json").exists():
        lc.down(cluster_dir)
    assert procs.mentioning(str(cluster_dir)) == []


# ------------------------------------------------------------ the ensemble alone


def test_a_new_leader_keeps_every_session_and_so_does_a_lost_quorum(
        zk_ensemble: ZooKeeperEnsemble) -> None:
    """The fixture's ensemble with a client (the project's one client factory, as brokers
    and the controller use it): a killed leader is replaced and the session moves to a
    surviving server; a quorum lost for longer than the session and restored keeps it."""
    with zk_session(zk_ensemble.connect, timeout_s=SESSION_MS / 1000) as client:
        client.create("/held", b"", ephemeral=True)
        session = client.client_id[0]
        old = zk_ensemble.wait_leader()
        killed_at = time.monotonic()
        old.kill()
        survivors = [n for n in zk_ensemble.nodes if n is not old]
        zk_ensemble.wait_leader(among=survivors, timeout=20)
        elected_s = time.monotonic() - killed_at
        wait_until(lambda: client.connected, "the client to reconnect", 20)
        moved_s = time.monotonic() - killed_at
        assert client.client_id[0] == session
        assert client.exists("/held") is not None
        old.start()
        assert old.wait_serving(timeout=20) == "follower"
        assert sorted(m or "-" for m in zk_ensemble.modes()) == ["follower", "follower", "leader"]

        lone, *others = zk_ensemble.nodes
        lost_at = time.monotonic()
        for node in others:
            node.stop()
        wait_until(lambda: lone.mode() is None, "the lone server to stop serving", 10)
        # The client learns it from its connection's end, on kazoo's thread, a moment after
        # the server stops serving (read at once, it was once still connected).
        wait_until(lambda: not client.connected, "the client to see the quorum gone", 10)
        time.sleep(2 * SESSION_MS / 1000)
        for node in others:
            node.start()
        zk_ensemble.wait_leader(timeout=20)
        back_at = time.monotonic()
        wait_until(lambda: client.connected, "the client to reconnect", 20)
        reconnect_s = time.monotonic() - back_at
        assert client.client_id[0] == session, "the session expired after the quorum came back"
        assert client.exists("/held") is not None
    print(f"leader killed: new leader {elected_s * 1000:.0f} ms, client reconnected "
          f"{moved_s * 1000:.0f} ms; quorum lost {back_at - lost_at:.1f} s, client back "
          f"{reconnect_s * 1000:.0f} ms after the new leader, same session")


# ------------------------------------------------------- a serving group on it


async def test_zk_leader_killed_under_traffic_no_failover_and_it_rejoins(
        ensemble_dir: Path) -> None:
    plan = await asyncio.to_thread(lc.up, ensemble_dir, slaves=1, session_timeout_ms=SESSION_MS,
                                   zk_ensemble=3)
    history = plan.dir / "history.jsonl"
    before = await asyncio.to_thread(sessions, plan)
    state_before = await asyncio.to_thread(group_state, plan)
    started_ns = time.time_ns()
    try:
        async with traffic_on(plan, history) as (_traffic, counts):
            leader = await asyncio.to_thread(leader_of, plan.dir)
            assert leader is not None
            killed_ns = time.time_ns()
            await asyncio.to_thread(lc.kill, plan.dir, leader)
            new_leader = await eventually(
                lambda: (got := leader_of(plan.dir)) not in (None, leader) and got,
                "another ZooKeeper server to lead", 20)
            elected_ms = (time.time_ns() - killed_ns) / 1e6
            await flowing(counts, "produce and consume after the leader's death")
            after = await asyncio.to_thread(sessions, plan)
            assert after == before, "a broker lost its ZooKeeper session"
            await asyncio.to_thread(lc.start, plan.dir, leader)
            await eventually(lambda: zk_modes(plan.dir)[leader] == "follower",
                             f"{leader} to rejoin as a follower", 20)
            modes = await asyncio.to_thread(zk_modes, plan.dir)
            assert sorted(m or "-" for m in modes.values()) == ["follower", "follower", "leader"]
            await flowing(counts, "produce and consume after the rejoin")
            state_after = await asyncio.to_thread(group_state, plan)
            ended_ns = time.time_ns()
    finally:
        await asyncio.to_thread(lc.down, plan.dir)
    # no failover: the state was never written again, no transition journaled
    assert state_after == state_before, (state_before, state_after)
    assert state_after[0] == "NORMAL"
    assert read_transitions(transitions_log(plan.dir)) == []
    master = since(plan, "g1-0", started_ns)
    assert master[0][1] == Permission.FULL
    assert without(master, Permission.WRITE, end_ns=ended_ns) == [], master
    unreadable = without(master, Permission.READ, end_ns=ended_ns)
    assert [eff for t, eff in master if t < ended_ns][-1] == Permission.FULL, master
    assert without(since(plan, "g1-1", started_ns), Permission.READ, end_ns=ended_ns) == [
        (started_ns, ended_ns)]  # the slave never read
    report = judge(plan, history)
    assert_clean(report)
    print(f"ZooKeeper leader {leader} killed: {new_leader} leads after {elected_ms:.0f} ms; "
          f"sessions kept; master without READ: "
          f"{[(round((a - killed_ns) / 1e6), round((b - a) / 1e6)) for a, b in unreadable]} "
          f"(ms after the kill, ms); acked {report.acked}, delivered {report.delivered}")


async def test_quorum_lost_longer_than_a_session_then_back(ensemble_dir: Path) -> None:
    plan = await asyncio.to_thread(lc.up, ensemble_dir, slaves=1, session_timeout_ms=SESSION_MS,
                                   zk_ensemble=3)
    history = plan.dir / "history.jsonl"
    before = await asyncio.to_thread(sessions, plan)
    state_before = await asyncio.to_thread(group_state, plan)
    outage_s = 2.5 * SESSION_MS / 1000
    started_ns = time.time_ns()
    try:
        async with traffic_on(plan, history) as (_traffic, counts):
            leader = await asyncio.to_thread(leader_of, plan.dir)
            lone = next(n.name for n in plan.zk_nodes if n.name != leader)
            down = [n.name for n in plan.zk_nodes if n.name != lone]
            lost_ns = time.time_ns()
            for name in down:
                await asyncio.to_thread(lc.kill, plan.dir, name)
            await eventually(lambda: zk_modes(plan.dir)[lone] is None,
                             f"{lone} to stop serving without a quorum", 10)
            acked_lost = counts.acked
            await asyncio.sleep(outage_s)
            acked_during = counts.acked - acked_lost
            back_ns = time.time_ns()
            for name in down:
                await asyncio.to_thread(lc.start, plan.dir, name)
            await eventually(lambda: leader_of(plan.dir) is not None, "a new ZooKeeper leader", 20)
            quorum_ns = time.time_ns()
            # converged (the master reads throughout: checked below)
            await flowing(counts, "produce and consume after the quorum came back")
            after = await asyncio.to_thread(sessions, plan)
            state_after = await asyncio.to_thread(group_state, plan)
            ended_ns = time.time_ns()
    finally:
        await asyncio.to_thread(lc.down, plan.dir)
    # the controller decided nothing: no state write, no transition journaled
    assert state_after == state_before, (state_before, state_after)
    assert read_transitions(transitions_log(plan.dir)) == []
    assert after == before, "a broker's ZooKeeper session expired after the quorum came back"
    # the brokers against DESIGN / seed 000 §3
    master = since(plan, "g1-0", started_ns)
    assert master[0][1] == Permission.FULL
    assert without(master, Permission.WRITE, end_ns=ended_ns) == [], master  # not isolated
    assert acked_during > 0  # writes kept being acknowledged without ZooKeeper
    assert without(since(plan, "g1-1", started_ns), Permission.READ, end_ns=ended_ns) == [
        (started_ns, ended_ns)]  # the slave never read
    # the master never stopped reading: its ZooKeeper lease lapsed ~1 s into the outage,
    # and its slave's echoes carried it (docs/failover.md, "A master cut off from ZooKeeper
    # only"); before the slave route the group had no reader until the quorum was back
    assert without(master, Permission.READ, end_ns=ended_ns) == [], master
    report = judge(plan, history)
    assert_clean(report)
    print(f"quorum lost {(back_ns - lost_ns) / 1e9:.1f} s: master kept READ and WRITE "
          f"({acked_during} acks while lost); a leader {(quorum_ns - back_ns) / 1e6:.0f} ms "
          f"after the servers were started; sessions kept; acked {report.acked}")


# ---------------------------------------------------------------------- the CLI


def test_the_plan_records_every_server_and_reads_an_old_one(tmp_path: Path) -> None:
    ports = iter(range(20000, 20100))
    nodes = [ZkNode(k, next(ports), next(ports), next(ports)) for k in (1, 2, 3)]
    plan = plan_cluster(directory=tmp_path, groups=1, slaves=1, sync=True,
                        port=lambda: next(ports), zk_nodes=nodes)
    hosts = "127.0.0.1:20000,127.0.0.1:20003,127.0.0.1:20006"
    assert plan.zk_hosts == hosts
    argv = list(plan.process("g1-0").argv)
    assert argv[argv.index("--zk") + 1] == hosts + "/understudy"
    ctl = list(plan.process("controller").argv)
    assert ctl[ctl.index("--zk") + 1] == hosts + "/understudy"
    (tmp_path / "cluster.json").write_text(plan.to_json())
    assert ClusterPlan.load(tmp_path).zk_nodes == tuple(nodes)
    assert [n.name for n in nodes] == ["zk1", "zk2", "zk3"]
    # a cluster.json written before ensembles: one standalone server on zkPort
    doc = json.loads(plan.to_json())
    del doc["zkNodes"]
    (tmp_path / "cluster.json").write_text(json.dumps(doc))
    old = ClusterPlan.load(tmp_path)
    assert old.zk_nodes == (ZkNode(0, 20000),)
    assert (old.zk_nodes[0].name, old.zk_hosts) == ("zookeeper", "127.0.0.1:20000")


def test_local_up_zk_ensemble_status_json_and_down(ensemble_dir: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(local, ["up", "--dir", str(ensemble_dir), "--zk-ensemble", "2"])
    assert result.exit_code == 2, result.output  # even: refused before anything starts
    assert not ensemble_dir.exists()
    result = runner.invoke(local, ["up", "--dir", str(ensemble_dir), "--zk-ensemble", "3"])
    assert result.exit_code == 0, result.output
    result = runner.invoke(local, ["status", "--dir", str(ensemble_dir), "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    zk = doc["zookeeper"]
    nodes = zk["nodes"]
    assert [n["name"] for n in nodes] == ["zk1", "zk2", "zk3"]
    assert sorted(n["mode"] for n in nodes) == ["follower", "follower", "leader"]
    assert all(n["alive"] and not n["stopped"] for n in nodes)
    assert zk["alive"] is True
    assert zk["connect"] == ",".join(f"127.0.0.1:{n['port']}" for n in nodes) + "/understudy"
    pids = [n["pid"] for n in nodes] + [b["pid"] for b in doc["groups"][0]["brokers"]]
    for pid in pids:
        os.kill(pid, 0)  # real processes
    assert doc["groups"][0]["mode"] == "NORMAL"
    result = runner.invoke(local, ["down", "--dir", str(ensemble_dir)])
    assert result.exit_code == 0, result.output
    for name in ("zk1", "zk2", "zk3", "g1-0", "g1-1", "controller"):
        assert f"stopped {name}" in result.output
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert procs.mentioning(str(ensemble_dir)) == []
