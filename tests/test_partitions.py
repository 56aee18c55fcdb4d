"""Real network partitions under a serving group: ZooKeeper and the controller, the master,
the slave, the test's clients and a second consumer-group member each on a host (network
namespace) of their own, on one bridge (:mod:`understudy_harness.netns`), with a producer
and a consumer group recording into a history that the shared checker judges.

Each test cuts one path (both directions; packets are lost on the way, connections stay
open) and checks it against DESIGN ("Effective permission", "Read leases", "Failover")
and seed 000 §3:

* master ↔ ZooKeeper only (the slave still replicates): no switch, WRITE kept; today the
  master's read lease lapses and the group has no reader until ZooKeeper is back (a slave
  heartbeat does not renew the lease yet): reported, and "reads continue" is an xfail;
* master ↔ slave only: no switch, reads stay with the master, writes wait for the slave;
* the island master (cut from ZooKeeper and the slave, still reached by the clients): it
  drops READ before the slave is handed it, a write to it is not acknowledged, and after
  the heal it comes back through back-sync;
* slave ↔ ZooKeeper: nothing moves, the slave never reads;
* a consumer-group member ↔ the broker of its queues, then ↔ every broker: its queues
  move to the other member only after its lease, never two members on one queue;
* 20 % loss and 50 ms delay each way on the replication link (an NFQUEUE delayer: this
  kernel has no ``sch_netem``): writes are still acknowledged, later; nothing is lost.

Every figure (read gap, write stall, produce latency) is printed (``pytest -s``). One
cluster serves the whole module; before each scenario every path is healed and the group
is back to NORMAL with the master reading and the slave caught up. Every process is
stopped by PID (``local down``, then anything naming the cluster's directory) and every
namespace removed (the ``netns`` fixture), whatever happens. Skips, with the kernel's
reason, where the machine refuses network namespaces.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest

from understudy_broker import protocol as p
from understudy_broker.client import Producer, create_topic
from understudy_broker.model import Permission
from understudy_harness import subclients
from understudy_harness.checker import Report, check
from understudy_harness.drill import merge_permission_logs, merge_transitions
from understudy_harness.history import Deliver, Event, HistoryWriter, Own, Perm, read_history
from understudy_harness.netns import NetnsUnavailable, Network
from understudy_harness.testing import eventually, raw_request, wait_caught_up
from understudy_harness.workload import Target, Traffic, TrafficCounts, settle
from understudy_operator.controller.journal import Transition, read_transitions
from understudy_operator.local import cluster as lc
from understudy_operator.local import procs
from understudy_operator.local.plan import (
    CONTROLLER,
    ZOOKEEPER,
    ClusterPlan,
    Placement,
    transitions_log,
)

pytestmark = pytest.mark.integration

T = TypeVar("T")
SESSION_MS = 2000
GROUP = "g1"
MASTER, SLAVE = "g1-0", "g1-1"
ZK, CLIENT, MEMBER = "zk", "client", "member"
HOSTS = (ZK, MASTER, SLAVE, CLIENT, MEMBER)
RATE = 100.0
#: Longer than the session (2 s): whatever expires on a cut has expired before the heal.
CUT_S = 3.5
NS = 1_000_000


@dataclass
class Lab:
    net: Network
    plan: ClusterPlan

    def run(self, scenario: Callable[[Lab], Coroutine[Any, Any, T]]) -> T:
        """Run ``scenario`` on the clients' host (its own event loop, in a thread there)."""
        return self.net.call(CLIENT, lambda: asyncio.run(scenario(self)))


@pytest.fixture(scope="module")
def lab(netns: Callable[[tuple[str, ...]], Network],
        tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    net = netns(HOSTS)
    directory = tmp_path_factory.mktemp("partitions") / "c"

    def place(name: str) -> Placement:
        host = net.host(ZK if name in (ZOOKEEPER, CONTROLLER) else name)
        return Placement(host.address, host.prefix)

    try:
        plan = net.call(CLIENT, lambda: lc.up(directory, slaves=1, session_timeout_ms=SESSION_MS,
                                               placement=place))
        yield Lab(net, plan)
    finally:
        started = time.monotonic()
        with contextlib.suppress(Exception):
            lc.down(directory, progress=lambda msg: print(
                f"{msg} after {time.monotonic() - started:.1f} s"))
        procs.kill_leftovers(directory)


# ------------------------------------------------------------------ what happened


@dataclass
class Outcome:
    """One scenario: the merged history, the checker's report, the cut and heal times."""

    name: str
    events: list[Event]
    report: Report
    cut_ns: int
    healed_ns: int
    end_ns: int
    acked_while_cut: int
    drained: bool
    transitions: list[Transition]
    facts: dict[str, Any] = field(default_factory=dict)

    def stretches(self, brokers: tuple[str, ...], perm: Permission, *, held: bool,
                  start: int | None = None, end: int | None = None) -> list[tuple[int, int]]:
        """The stretches of ``[start, end]`` (default: cut to end) in which some broker of
        ``brokers`` holds ``perm`` (``held``), or none does, from the permission logs."""
        start = self.cut_ns if start is None else start
        end = self.end_ns if end is None else end
        now: dict[str, Permission] = {}
        out: list[tuple[int, int]] = []
        since: int | None = None
        perms = sorted((e for e in self.events if isinstance(e, Perm) and e.group == GROUP
                        and e.broker in brokers), key=lambda e: e.t)
        for t, batch in _by_time(perms):
            for e in batch:
                now[e.broker] = e.effective
            if t > end:
                break
            on = any(perm in eff for eff in now.values()) == held
            t = max(t, start)
            if on and since is None:
                since = t
            elif not on and since is not None:
                if t > since:
                    out.append((since, t))
                since = None
        if since is not None and end > since:
            out.append((since, end))
        return out

    def ms(self, stretches: list[tuple[int, int]]) -> list[tuple[int, int]]:
        """``(start, length)`` in ms after the cut, for printing."""
        return [(round((a - self.cut_ns) / NS), round((b - a) / NS)) for a, b in stretches]

    def write_stall_ms(self) -> float | None:
        """The checker's write stall of the scenario's fault (its one cycle)."""
        return self.report.cycles[0].write_stall_ms if self.report.cycles else None

    def modes(self) -> list[str]:
        return [f"{t.mode.name}@{t.epoch} +{(t.t_ns - self.cut_ns) / NS:.0f}ms"
                for t in self.transitions]


def _by_time(perms: list[Perm]) -> Iterator[tuple[int, list[Perm]]]:
    i = 0
    while i < len(perms):
        j = i
        while j < len(perms) and perms[j].t == perms[i].t:
            j += 1
        yield perms[i].t, perms[i:j]
        i = j


def assert_no_switch(out: Outcome) -> None:
    """The invariants, no transition written, and the slave never read."""
    assert_invariants(out)
    assert out.transitions == [], out.modes()
    assert out.stretches((SLAVE,), Permission.READ, held=True) == []


def assert_invariants(out: Outcome) -> None:
    """DESIGN's invariants as the shared checker judges them over the whole history."""
    report = out.report
    assert report.acked > 0
    assert out.drained, "the consumers did not get every acknowledged message"
    assert report.lost_acked == 0, report.violations
    assert report.one_reader_violations == 0, report.overlaps
    assert report.offset_rewinds == 0, report.violations
    assert report.two_member_violations == 0, report.shared_queues
    assert report.violations == [], report.violations


# ------------------------------------------------------------------ running one


async def ready(lab: Lab) -> None:
    """Every path healed; NORMAL, the master holding FULL and the slave live in ZooKeeper
    and caught up."""
    lab.net.heal_all()
    plan = lab.plan
    deadline = time.monotonic() + 30
    await asyncio.to_thread(lc.wait_mode, plan, GROUP, "NORMAL", deadline=deadline)
    await asyncio.to_thread(lc.wait_master_holds, plan, GROUP, Permission.FULL,
                            deadline=deadline)

    def both_live() -> bool:
        rows = lc.status(plan.dir).groups[0].brokers
        return all(r.source == "zk" for r in rows)

    await eventually(lambda: asyncio.to_thread(both_live), "both brokers live in ZooKeeper", 30)
    await wait_caught_up(plan.address(MASTER), plan.address(SLAVE), within_s=30)


Body = Callable[[HistoryWriter, TrafficCounts, Traffic], Awaitable[dict[str, Any]]]


async def scenario(lab: Lab, name: str, body: Body, *, target: Target | None = None,
                   members: int = 0) -> Outcome:
    """Recorded traffic (one producer, one consumer group) on its own topic, ``body`` in
    the middle (it cuts, records the ``fault`` and returns figures with ``cut_ns``,
    ``healed_ns`` and ``acked_while_cut``), the drain, then the brokers' permission logs
    and the controller's journal merged and judged."""
    await ready(lab)
    plan = lab.plan
    history = plan.dir / f"{name}.jsonl"
    target = target or Target(label=name, topic=f"p-{name}", bootstrap=tuple(plan.bootstrap(GROUP)))
    counts = TrafficCounts()
    with HistoryWriter(history, clock=time.time_ns, clock_name="time_ns") as writer:
        traffic = Traffic([target], writer, counts, rate=RATE, queues=2, consumer_groups=("cg1",),
                          members=members, session_timeout_ms=SESSION_MS)
        try:
            await traffic.start()
            await eventually(lambda: counts.acked > 30 and counts.delivered > 30,
                             "traffic to flow", 20)
            facts = await body(writer, counts, traffic)
            if "drained" in facts:  # the body drained (and stopped) the traffic itself
                drained = bool(facts.pop("drained"))
            else:
                drained = await traffic.finish(drain_timeout=20)
        finally:
            lab.net.heal_all()
            await traffic.shutdown()
    end_ns = time.time_ns()
    merge_transitions(plan, history)
    merge_permission_logs(plan, history)
    events = read_history(history).events
    cut_ns = int(facts.pop("cut_ns"))
    return Outcome(
        name=name, events=list(events), report=check(events), cut_ns=cut_ns,
        healed_ns=int(facts.pop("healed_ns")), end_ns=end_ns,
        acked_while_cut=int(facts.pop("acked_while_cut")), drained=drained,
        transitions=[t for t in read_transitions(transitions_log(plan.dir)) if t.t_ns >= cut_ns],
        facts=facts)


def cut_for(lab: Lab, pairs: list[tuple[str, str]], *, broker: str, kind: str,
            after_cut: Callable[[], Awaitable[dict[str, Any]]] | None = None) -> Body:
    """A body that cuts ``pairs`` for :data:`CUT_S` (recording a ``fault``), runs
    ``after_cut`` meanwhile, heals, and waits for produce and consume to move again."""

    async def body(writer: HistoryWriter, counts: TrafficCounts, _traffic: Traffic
                   ) -> dict[str, Any]:
        writer.fault(cycle=1, kind=kind, broker=broker, group=GROUP)
        cut_ns = time.time_ns()
        for a, b in pairs:
            lab.net.cut(a, b)
        acked = counts.acked
        started = time.monotonic()
        facts = await after_cut() if after_cut is not None else {}
        await asyncio.sleep(max(0.0, CUT_S - (time.monotonic() - started)))
        acked_while_cut = counts.acked - acked
        for a, b in pairs:
            lab.net.heal(a, b)
        healed_ns = time.time_ns()
        await flowing(counts, f"produce and consume after healing {kind}")
        return {**facts, "cut_ns": cut_ns, "healed_ns": healed_ns,
                "acked_while_cut": acked_while_cut}

    return body


def run_cut(lab: Lab, name: str, pairs: list[tuple[str, str]], *, broker: str,
            after_cut: Callable[[], Awaitable[dict[str, Any]]] | None = None) -> Outcome:
    """:func:`scenario` with :func:`cut_for` ``pairs`` (fault kind ``partition-<name>``)."""
    return lab.run(lambda lab: scenario(lab, name, cut_for(
        lab, pairs, broker=broker, kind=f"partition-{name}", after_cut=after_cut)))


async def flowing(counts: TrafficCounts, what: str, *, within_s: float = 30.0) -> None:
    acked, delivered = counts.acked, counts.delivered
    await eventually(lambda: counts.acked > acked + 20 and counts.delivered > delivered + 20,
                     what, within_s)


# ------------------------------------------------------------ master ↔ ZooKeeper


@pytest.fixture(scope="module")
def master_cut_from_zk(lab: Lab) -> Outcome:
    out = run_cut(lab, "master-zk", [(MASTER, ZK)], broker=MASTER)
    no_reader = out.stretches((MASTER, SLAVE), Permission.READ, held=False)
    print(f"\nmaster ↔ ZooKeeper cut {CUT_S:.1f} s: group without a reader {out.ms(no_reader)} "
          f"(ms after the cut, ms); master WRITE lost {out.ms(out.stretches((MASTER,), Permission.WRITE, held=False, end=out.healed_ns))}; "
          f"{out.acked_while_cut} acks while cut; write stall {out.write_stall_ms()} ms; "
          f"transitions {out.modes()}")
    return out


def test_master_cut_from_zookeeper_only_no_switch_one_reader(master_cut_from_zk: Outcome) -> None:
    """Seed 000 §3, scenario 3: the master loses ZooKeeper but still replicates to its
    slave: no switch, the master keeps its WRITE (not isolated: a slave is connected), the
    slave never reads, nothing is lost."""
    out = master_cut_from_zk
    assert_no_switch(out)
    assert out.stretches((MASTER,), Permission.WRITE, held=False, end=out.healed_ns) == []
    assert out.acked_while_cut > 0
    # the master reads again once ZooKeeper is back
    assert out.stretches((MASTER,), Permission.READ, held=True, start=out.healed_ns) != []


def test_master_cut_from_zookeeper_only_keeps_reading(master_cut_from_zk: Outcome) -> None:
    """Its read lease lapses ~1 s after the cut as far as ZooKeeper goes; the echoes of
    its in-sync slave renew it instead (docs/failover.md, "A master cut off from ZooKeeper
    only"), so the master never stops reading, and the slave never reads."""
    out = master_cut_from_zk
    assert out.stretches((MASTER,), Permission.READ, held=False) == []
    assert out.stretches((SLAVE,), Permission.READ, held=True) == []


# ------------------------------------------------------------ master ↔ slave


def test_master_cut_from_slave_only_reads_stay_writes_wait(lab: Lab) -> None:
    """The master keeps its ZooKeeper session, so it is not down: no switch and it keeps
    reading (one reader). A synchronous write needs the slave's copy, so writes wait for
    the heal (the stall is printed); nothing acknowledged is lost."""
    out = run_cut(lab, "master-slave", [(MASTER, SLAVE)], broker=MASTER)
    no_reader = out.stretches((MASTER, SLAVE), Permission.READ, held=False)
    print(f"\nmaster ↔ slave cut {CUT_S:.1f} s: group without a reader {out.ms(no_reader)}; "
          f"{out.acked_while_cut} acks while cut; write stall {out.write_stall_ms()} ms; "
          f"transitions {out.modes()}")
    assert_no_switch(out)
    assert no_reader == []


# ------------------------------------------------------------ the island master


def test_island_master_fences_itself_before_the_slave_reads(lab: Lab) -> None:
    """The master is cut from ZooKeeper and from its slave; the clients still reach it.
    It must drop READ before the slave holds READ (the permission logs, one clock), and a
    write sent to it while it is an island is not acknowledged. After the heal it comes
    back through RECOVERING (back-sync) to NORMAL; nothing acknowledged is lost."""
    plan = lab.plan

    async def write_to_island() -> dict[str, Any]:
        await eventually(lambda: asyncio.to_thread(slave_reads, plan),
                         "the slave to read while the master is an island", 15)
        body = p.encode_produce("p-island", [(0, None, b"written-to-the-island")])
        started = time.monotonic()
        try:
            frame = await raw_request(plan.address(MASTER), p.Op.PRODUCE, body, timeout_s=3)
            answer = p.Status(frame.status).name
        except (TimeoutError, OSError) as exc:
            answer = f"no answer ({type(exc).__name__})"
        return {"island_write": answer, "island_write_s": time.monotonic() - started}

    out = run_cut(lab, "island", [(MASTER, ZK), (MASTER, SLAVE)], broker=MASTER,
                  after_cut=write_to_island)
    master_read = out.stretches((MASTER,), Permission.READ, held=True, end=out.healed_ns)
    slave_read = out.stretches((SLAVE,), Permission.READ, held=True)
    no_reader = out.stretches((MASTER, SLAVE), Permission.READ, held=False)
    master_lost_read = master_read[0][1] if master_read else out.cut_ns
    cycle = out.report.cycles[0] if out.report.cycles else None
    master_no_write = out.stretches((MASTER,), Permission.WRITE, held=False, end=out.healed_ns)
    print(f"\nisland master: lost READ +{(master_lost_read - out.cut_ns) / NS:.0f} ms, WRITE "
          f"{out.ms(master_no_write)}, slave READ "
          f"{out.ms(slave_read)}, group without a reader {out.ms(no_reader)}; write to the "
          f"island: {out.facts['island_write']} after {out.facts['island_write_s']:.2f} s; "
          f"{out.acked_while_cut} acks while cut; write stall {out.write_stall_ms()} ms; "
          f"reads restored {cycle and cycle.reads_restored_ms} ms, back-sync "
          f"{cycle and cycle.backsync_ms} ms; transitions {out.modes()}")
    assert_invariants(out)
    assert slave_read, "the slave never read while the master was an island"
    assert master_lost_read < slave_read[0][0], (out.ms(master_read), out.ms(slave_read))
    assert out.facts["island_write"] != "OK"
    modes = [t.mode.name for t in out.transitions]
    assert modes[:2] == ["FENCING", "SLAVE_CONSUME"], out.modes()
    assert modes[-2:] == ["RECOVERING", "NORMAL"], out.modes()


def slave_reads(plan: ClusterPlan) -> bool:
    rows = {r.name: r for r in lc.status(plan.dir).groups[0].brokers}
    return Permission.READ in rows[SLAVE].effective


# ------------------------------------------------------------ slave ↔ ZooKeeper


def test_slave_cut_from_zookeeper_nothing_moves(lab: Lab) -> None:
    """The slave's session expires; the master keeps FULL (it still has its slave), the
    controller writes nothing, the slave never reads; the slave registers again after
    the heal."""
    out = run_cut(lab, "slave-zk", [(SLAVE, ZK)], broker=SLAVE)
    master_not_full = [*out.stretches((MASTER,), Permission.READ, held=False),
                       *out.stretches((MASTER,), Permission.WRITE, held=False)]
    print(f"\nslave ↔ ZooKeeper cut {CUT_S:.1f} s: master without READ or WRITE "
          f"{out.ms(master_not_full)}; {out.acked_while_cut} acks while cut; write stall "
          f"{out.write_stall_ms()} ms; transitions {out.modes()}")
    assert_no_switch(out)
    assert master_not_full == []
    assert out.acked_while_cut > 0


# ------------------------------------------------------------ a member ↔ its broker


def test_member_cut_from_its_broker_then_from_all(lab: Lab, tmp_path: Path) -> None:
    """Two members of one consumer group share a topic's two queues on g1: one in the
    test (the clients' host), one a process on a host of its own. Cut that host from the
    master (the broker its queues are read from), then from every broker. Invariant 6: the
    other member takes its queue only after its lease; never two members on one queue."""
    plan = lab.plan
    topic = "p-members"
    target = Target(label="members", topic=topic, bootstrap=tuple(plan.bootstrap(GROUP)),
                    groups=(GROUP,), keyed=False)
    far: list[subclients.SubClient] = []

    def far_owns() -> set[int]:
        held: set[int] = set()
        for e in far[0].events():
            if isinstance(e, Own):
                (held.add if e.held else held.discard)(e.queue)
        return held

    async def body(writer: HistoryWriter, counts: TrafficCounts, traffic: Traffic
                   ) -> dict[str, Any]:
        far.append(await asyncio.to_thread(
            subclients.start_consumer, tmp_path, list(target.bootstrap), topic, cgroup="cg1",
            name="cg1-far", session_timeout_ms=SESSION_MS, prefix=lab.net.host(MEMBER).prefix))
        near = next(iter(traffic.member_runs.values()))
        await eventually(lambda: far_owns() and near.consumer is not None
                         and near.consumer.assigned, "both members to own a queue", 20)
        (queue,) = far_owns()
        delivered = len([e for e in far[0].events() if isinstance(e, Deliver)])
        writer.fault(cycle=1, kind="member-partition", broker="cg1-far", group=GROUP)
        cut_ns = time.time_ns()
        lab.net.cut(MEMBER, MASTER)
        acked = counts.acked
        await asyncio.sleep(CUT_S)
        from_master_only = {
            "keeps_queue": queue in far_owns(),
            "delivered_meanwhile": len([e for e in far[0].events()
                                        if isinstance(e, Deliver)]) - delivered}
        all_cut_ns = time.time_ns()
        lab.net.cut(MEMBER, SLAVE)
        await eventually(lambda: queue in near.consumer.assigned, "the near member to take "
                         "the far member's queue", 20)
        taken_ns = time.time_ns()
        acked_while_cut = counts.acked - acked
        lab.net.heal_all()
        healed_ns = time.time_ns()
        back = True
        try:
            await eventually(lambda: far_owns(), "the far member to own a queue again", 15)
        except AssertionError:
            back = False
        # drain: every acknowledged id delivered to one of the two members
        traffic.producing.clear()
        await settle(traffic.producers, within_s=20)

        def got_all() -> bool:
            theirs = {e.id for e in far[0].events() if isinstance(e, Deliver)}
            return traffic.acked["members"] <= traffic.received[("members", "cg1")] | theirs

        try:
            await eventually(got_all, "every acknowledged message delivered", 20)
            drained = True
        except AssertionError:
            drained = False
        await traffic.shutdown()
        far[0].stop()
        for e in far[0].events():
            writer.record(e)
        return {"cut_ns": cut_ns, "healed_ns": healed_ns, "acked_while_cut": acked_while_cut,
                "drained": drained, "queue": queue, "all_cut_ns": all_cut_ns,
                "taken_ns": taken_ns, "back": back, **from_master_only}

    try:
        out = lab.run(lambda lab: scenario(lab, "members", body, target=target, members=1))
    finally:
        for client in far:
            client.stop()
    queue = out.facts["queue"]
    owns = [e for e in out.events if isinstance(e, Own) and e.queue == queue]
    far_released = next((e.t for e in owns if e.member == "cg1-far" and not e.held
                         and e.t >= out.cut_ns), None)
    near_took = next((e.t for e in owns if e.member != "cg1-far" and e.held
                      and e.t >= out.cut_ns), None)
    all_cut = out.facts["all_cut_ns"]
    print(f"\nmember cut from the master only ({CUT_S:.1f} s): keeps queue {queue}: "
          f"{out.facts['keeps_queue']}, delivered {out.facts['delivered_meanwhile']} meanwhile; "
          f"cut from every broker: its lease ended "
          f"+{((far_released or all_cut) - all_cut) / NS:.0f} ms, the other member took the queue "
          f"+{((near_took or all_cut) - all_cut) / NS:.0f} ms; back after the heal: "
          f"{out.facts['back']}; two-member overlaps {out.report.two_member_violations}")
    assert_invariants(out)
    assert near_took is not None, owns
    assert far_released is not None, owns
    assert far_released <= near_took, (far_released, near_took)


# ------------------------------------------------------------ loss and delay


def test_lossy_slow_replication_link_still_acknowledges(lab: Lab) -> None:
    """20 % loss and 50 ms delay each way between master and slave: writes are still
    acknowledged (slower: the produce latency is printed), no switch, nothing lost."""
    plan = lab.plan
    bootstrap = plan.bootstrap(GROUP)

    async def latencies(producer: Producer, n: int) -> list[float]:
        out = []
        for i in range(n):
            started = time.monotonic()
            fut = await producer.send("p-netem-probe", b"probe-%d" % i, key=b"k")
            await fut
            out.append((time.monotonic() - started) * 1000)
        return out

    async def body(writer: HistoryWriter, counts: TrafficCounts, _traffic: Traffic
                   ) -> dict[str, Any]:
        await create_topic(bootstrap, topic="p-netem-probe", queues=1)
        producer = Producer(bootstrap, linger_ms=0, request_timeout_s=10)
        try:
            before = await latencies(producer, 20)
            writer.fault(cycle=1, kind="impair-replication", broker=MASTER, group=GROUP)
            cut_ns = time.time_ns()
            try:
                lab.net.impair(MASTER, SLAVE, loss=0.2, delay_ms=50)
            except NetnsUnavailable as exc:
                pytest.skip(str(exc))
            acked = counts.acked
            started = time.monotonic()
            during = await latencies(producer, 20)
            await asyncio.sleep(max(0.0, CUT_S - (time.monotonic() - started)))
            acked_while_cut = counts.acked - acked
            lab.net.heal(MASTER, SLAVE)
            healed_ns = time.time_ns()
        finally:
            await producer.close()
        return {"cut_ns": cut_ns, "healed_ns": healed_ns, "acked_while_cut": acked_while_cut,
                "before": before, "during": during,
                "rate_during": acked_while_cut / ((healed_ns - cut_ns) / 1e9)}

    out = lab.run(lambda lab: scenario(lab, "netem", body))
    before, during = out.facts["before"], out.facts["during"]

    def summary(xs: list[float]) -> str:
        return f"p50 {statistics.median(xs):.1f} ms, max {max(xs):.1f} ms"

    print(f"\nreplication link 20 % loss + 50 ms each way: produce latency before {summary(before)}, "
          f"during {summary(during)}; traffic acks {out.facts['rate_during']:.0f}/s while impaired "
          f"(offered {RATE:.0f}/s); write stall {out.write_stall_ms()} ms; transitions {out.modes()}")
    assert_no_switch(out)
    assert out.acked_while_cut > 0
    assert statistics.median(during) > statistics.median(before)
