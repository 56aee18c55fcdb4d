"""Model check: the failover controller + effective permission + read leases over random
interleavings of faults, asserting one reader and no rewind in every reachable state.

The world is a discrete-time model (1 tick = 1 s) of what the real parts do:

- ZooKeeper: the ``state`` znode with a version, sessions that expire ``S`` ticks after the
  last contact from their client, ephemeral ``live`` nodes owned by sessions, persistent
  ``status`` nodes with versions (so statuses of dead brokers stay, stale).
- Brokers: processes that run, stop (SIGSTOP) and die, get cut off from ZooKeeper, and
  restart; each slave's replication link to the master can be cut on its own. Each keeps its own *applied* view of ``state`` — updated only when a watch is
  delivered or a lease renewal reads it, so views are arbitrarily stale — and a read lease
  of ``L < S`` ticks renewed by a connected, registered session confirming the epoch.
  A broker registers its live node before any lease renewal in a new session, and a
  broker that has not yet learned the state enforces NONE.
- The slave route (docs/failover.md, "A master cut off from ZooKeeper only"): the master
  also renews its lease for ``LS`` ticks from a probe's send time once *every* slave of
  the in-sync record echoed that probe at the master's epoch. Probes and echoes travel
  the replication links and may be delivered any number of steps later. A slave echoes
  only at the master's epoch and not acting, and then holds back its own READ until
  ``LS`` ticks after it echoed (a restarted slave holds back ``LS`` ticks from its start). Each computes its effective
  permission with the real ``model.effective_permission``.
- Consumers: commits go to whoever has effective READ at that moment. Replication keeps
  an in-sync set of slaves (ISR) in ZooKeeper: the reader (master, or acting slave
  mirroring to the other slaves) acknowledges a commit only once every ISR slave but
  itself holds it, and at least one does; a slave that cannot receive it is first removed
  from the ISR by a ZooKeeper write (so the reader must be connected); a running slave
  rejoins after catching up from the master (an acting slave only takes members out:
  server/mirror.py). The controller only picks ISR
  slaves. Whether a commit is acknowledged is the real ``isr.write_outcome`` under the
  group's quorum-write policy (inSyncReplicas, the floor, autoDegrade; several policies
  run the same search), and a slave may run but stop acknowledging (a slow disk). The acting slave pushes its offsets to the master in RECOVERING (back-sync).
- Controllers: two of them, each with its own memory, each taking *snapshots* (possibly
  acted on later: delayed watches, stale views) and writing with the snapshot's version.

Invariants checked after every step: at most one broker with effective READ; every broker
with effective READ holds every acknowledged commit (no rewind); the state epoch only
grows, by exactly one per write.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from understudy_broker.model import GroupState, Health, Mode, Permission, effective_permission
from understudy_broker.replication.isr import AckPolicy, write_outcome
from understudy_broker.zklayout import BrokerSpec, BrokerStatus, FailoverPolicy, GroupConfig
from understudy_operator.controller.machine import Memory, decide, initial_state
from understudy_operator.controller.observe import BrokerView, Observation, ProcessState

S = 4  # session timeout, ticks
L = 3  # read lease, ticks (< S, as lease_duration_s guarantees)
LS = 2  # the lease a master takes from its slaves' echoes, ticks (slave_route_duration_s)
NAMES = ("m", "s1", "s2")

CONFIG = GroupConfig(
    group="g",
    brokers=tuple(
        BrokerSpec(n, i, "127.0.0.1", 1, 2, 3, Permission.FULL if i == 0 else Permission.READ)
        for i, n in enumerate(NAMES)
    ),
    failover=FailoverPolicy(check_interval_ms=1000, detection_checks=2, backsync_timeout_s=3),
    session_timeout_ms=S * 1000,
).validate()


@dataclass
class Broker:
    name: str
    ordinal: int
    proc: str = "run"  # run | stop | dead
    session: int | None = None
    registered: bool = False
    cut: bool = False
    view: GroupState | None = None
    lease_at: int | None = None
    commits: int = 0
    slow: bool = False  # running, connected, but not acknowledging replication
    backsync_epoch: int | None = None
    status: BrokerStatus | None = None
    status_version: int = -1
    held_until: int = 0  # a slave: no READ before this tick (it echoed a probe)
    echoes: dict[str, tuple[int, int]] = field(default_factory=dict)  # master: slave -> (sent, epoch)


@dataclass
class World:
    use_lease: bool = True
    use_slave_route: bool = True
    use_wait_out: bool = True  # a mutation switch: slaves that echoed read at once
    t: int = 0
    state: GroupState = field(default_factory=lambda: initial_state(0.0))
    version: int = 0
    next_session: int = 1
    sessions: dict[int, int] = field(default_factory=dict)  # live session -> last contact
    ephemerals: dict[str, int] = field(default_factory=dict)
    brokers: dict[str, Broker] = field(default_factory=dict)
    counter: int = 0
    acked: int = 0
    memories: list[Memory] = field(default_factory=lambda: [Memory(), Memory()])
    snapshots: list[tuple[GroupState, int, Observation] | None] = field(
        default_factory=lambda: [None, None])
    epochs_written: list[int] = field(default_factory=list)
    isr: set[str] = field(default_factory=lambda: set(NAMES[1:]))
    policy: AckPolicy = field(default_factory=lambda: AckPolicy.of(min_insync=1,
                                                                   auto_degrade=False))
    link_cut: set[str] = field(default_factory=set)  # slaves whose link to the master is cut
    probes: dict[str, list[tuple[int, int]]] = field(  # to a slave: (sent at, master epoch)
        default_factory=lambda: {n: [] for n in NAMES[1:]})
    replies: dict[str, list[tuple[int, int]]] = field(  # from a slave: (sent at, its epoch)
        default_factory=lambda: {n: [] for n in NAMES[1:]})

    def __post_init__(self) -> None:
        for i, n in enumerate(NAMES):
            self.brokers[n] = Broker(n, i)
        self.tick()
        for b in self.brokers.values():
            self.renew(b)
            self.publish(b)

    # ---------------------------------------------------------------- ZooKeeper & time
    def connected(self, b: Broker) -> bool:
        return b.proc == "run" and not b.cut and b.session in self.sessions

    def tick(self) -> None:
        self.t += 1
        for b in self.brokers.values():
            if self.connected(b):
                self.sessions[b.session] = self.t  # type: ignore[index]  # kazoo pings
        for sid, last in list(self.sessions.items()):
            if self.t - last >= S:  # the server expires the session and its ephemerals
                del self.sessions[sid]
                for name, owner in list(self.ephemerals.items()):
                    if owner == sid:
                        del self.ephemerals[name]
        for b in self.brokers.values():
            if b.proc == "run" and not b.cut:
                if b.session not in self.sessions:
                    b.session = self.next_session
                    b.registered = False
                    self.next_session += 1
                    self.sessions[b.session] = self.t
                if not b.registered and b.name not in self.ephemerals:
                    assert b.session is not None
                    self.ephemerals[b.name] = b.session
                    b.registered = True

    def deliver(self, b: Broker) -> None:
        """A watch delivers the current state (applied only if newer)."""
        if self.connected(b) and (b.view is None or self.state.epoch > b.view.epoch):
            b.view = self.state

    def renew(self, b: Broker) -> None:
        if not (self.connected(b) and b.registered):
            return
        self.sessions[b.session] = self.t  # type: ignore[index]
        self.deliver(b)
        if b.view is not None and b.view.epoch == self.state.epoch:
            b.lease_at = self.t

    # ---------------------------------------------------------------- the slave route
    def linked(self, s: Broker) -> bool:
        """Bytes flow between the master and slave ``s`` (both running, link not cut)."""
        return (self.brokers["m"].proc == "run" and s.proc == "run"
                and s.name not in self.link_cut)

    def probe(self) -> None:
        """The master sends a probe to every slave it has a link to, stamped now."""
        m = self.brokers["m"]
        if m.proc != "run" or m.view is None or not self.use_slave_route:
            return
        for s in self.brokers.values():
            if s.ordinal > 0 and self.linked(s):
                self.probes[s.name].append((self.t, m.view.epoch))

    def answer(self, s: Broker) -> None:
        """Slave ``s`` takes its oldest probe; it echoes only at the master's epoch and
        when not acting, and first holds back its own READ for ``LS``."""
        if s.proc != "run" or s.name in self.link_cut or not self.probes[s.name]:
            return
        sent, epoch = self.probes[s.name].pop(0)
        v = s.view
        if v is None or v.epoch != epoch or v.acting == s.name:
            return
        s.held_until = max(s.held_until, self.t + LS)
        self.replies[s.name].append((sent, v.epoch))

    def receive(self, s: Broker) -> None:
        m = self.brokers["m"]
        if not self.linked(s) or not self.replies[s.name]:
            return
        sent, epoch = self.replies[s.name].pop(0)
        old = m.echoes.get(s.name)
        if old is None or sent >= old[0]:
            m.echoes[s.name] = (sent, epoch)

    def probe_round(self) -> None:
        """The common case: a probe goes out, every slave answers, the master hears."""
        self.probe()
        for s in self.brokers.values():
            if s.ordinal > 0:
                for _ in range(len(self.probes[s.name])):
                    self.answer(s)
                for _ in range(len(self.replies[s.name])):
                    self.receive(s)

    def slave_route_valid(self, m: Broker) -> bool:
        """Every slave of the in-sync record echoed at the master's epoch, and the oldest
        of those latest echoes answers a probe sent less than ``LS`` ago."""
        if not self.use_slave_route or m.view is None or not self.isr:
            return False
        sent = []
        for name in self.isr:
            echo = m.echoes.get(name)
            if echo is None or echo[1] != m.view.epoch:
                return False
            sent.append(echo[0])
        return 0 <= self.t - min(sent) < LS

    # ---------------------------------------------------------------- brokers
    def lease_valid(self, b: Broker) -> bool:
        if not self.use_lease:
            return True
        zk = b.lease_at is not None and 0 <= self.t - b.lease_at < L
        if b.ordinal == 0:
            return zk or self.slave_route_valid(b)
        return zk and (not self.use_wait_out or self.t >= b.held_until)

    def effective(self, b: Broker) -> Permission:
        if b.proc != "run" or b.view is None:
            return Permission.NONE
        spec = CONFIG.broker(b.name)
        slaves = [x for x in self.brokers.values() if x.ordinal > 0]
        health = Health(
            zk_live=self.connected(b), zk_lost_for=0.0 if self.connected(b) else 1e9,
            fence_after=1e12,
            slaves_assigned=True,
            slave_connected=any(self.linked(s) for s in slaves),
            slave_once_connected=True, lease_valid=self.lease_valid(b),
        )
        return effective_permission(role=spec.role, name=b.name, configured=spec.permission,
                                    state=b.view, health=health)

    def readers(self) -> list[Broker]:
        return [b for b in self.brokers.values() if self.effective(b) & Permission.READ]

    def publish(self, b: Broker) -> None:
        if not self.connected(b) or b.view is None:
            return
        eff = self.effective(b)
        running_slaves = tuple(
            x.name for x in self.brokers.values() if x.ordinal > 0 and self.linked(x))
        is_master = b.ordinal == 0
        b.status = BrokerStatus(
            broker=b.name, effective=eff, epoch_applied=b.view.epoch,
            master_link=not is_master and self.linked(b),
            slave_links=running_slaves if is_master else (),
            max_offset=b.commits,
            ready=is_master and b.view.mode is not Mode.NORMAL and not eff & Permission.READ,
            backsync_epoch=b.backsync_epoch,
        )
        b.status_version += 1

    def commit(self, b: Broker) -> None:
        if not self.effective(b) & Permission.READ:
            return
        self.counter += 1
        b.commits = self.counter  # persisted locally, acknowledged only below
        for p in self.brokers.values():
            reaches = self.linked(p) if b.ordinal == 0 else p.proc == "run"
            if p is not b and p.name in self.isr and reaches and not p.slow:
                p.commits = max(p.commits, self.counter)
        # The real rule decides (replication/isr.py), with this world's quorum-write policy.
        outcome = self.write_outcome(b)
        if outcome is None:
            # Someone in the ISR has not acknowledged (dead, stopped, slow): the time bound
            # removes them from the record, by a ZooKeeper write, before going on.
            if not self.connected(b):
                return  # cannot record the smaller ISR: not acknowledged
            self.isr -= {m for m in self.isr - {b.name} if self.acked_by(m) < self.counter}
            outcome = self.write_outcome(b)
        if outcome is True:
            self.acked = self.counter

    def acked_by(self, name: str) -> int:
        p = self.brokers[name]
        return p.commits if p.proc == "run" else -1

    def write_outcome(self, b: Broker) -> bool | None:
        return write_outcome(recorded=frozenset(self.isr - {b.name}), joining=(), leaving=(),
                             acked=self.acked_by, end=self.counter, policy=self.policy)

    def rejoin(self, s: Broker) -> None:
        """The master, reading, catches a running slave up and records it in the ISR."""
        readers = self.readers()
        if s.ordinal == 0 or s.name in self.isr or s.proc != "run" or len(readers) != 1:
            return
        reader = readers[0]
        if reader.ordinal != 0 or not self.connected(reader) or not self.linked(s):
            return
        s.commits = max(s.commits, reader.commits)
        s.slow = False
        self.isr.add(s.name)

    def backsync(self, b: Broker) -> None:
        master = self.brokers["m"]
        v = b.view
        if b.ordinal == 0 or b.proc != "run" or master.proc != "run" or v is None:
            return
        if v.mode is not Mode.RECOVERING or v.acting != b.name:
            return
        if master.view is not None and v.epoch < master.view.epoch:
            return  # stale-epoch offsets are ignored
        master.commits = max(master.commits, b.commits)
        master.backsync_epoch = v.epoch

    # ---------------------------------------------------------------- controllers
    def observe(self) -> Observation:
        proc = {"run": ProcessState.RUNNING, "stop": ProcessState.STOPPED,
                "dead": ProcessState.EXITED}
        views = {
            b.name: BrokerView(b.name, zk_live=b.name in self.ephemerals, process=proc[b.proc],
                               status=b.status, status_version=b.status_version)
            for b in self.brokers.values()
        }
        return Observation(now=float(self.t), wall=float(self.t), brokers=views,
                           in_sync=frozenset(self.isr))

    def second(self, *, probe: bool = False, controller: bool = True) -> None:
        """One tick in which every broker renews and publishes, the master probes its
        slaves (``probe``) and controller 0 acts (``controller``)."""
        self.tick()
        for b in self.brokers.values():
            self.renew(b)
            self.publish(b)
        if probe:
            self.probe_round()
        if controller:
            self.snapshot(0)
            self.act(0)

    def snapshot(self, c: int) -> None:
        self.snapshots[c] = (self.state, self.version, self.observe())

    def act(self, c: int) -> None:
        snap = self.snapshots[c]
        if snap is None:
            return
        self.snapshots[c] = None
        state, version, obs = snap
        d = decide(CONFIG, state, obs, self.memories[c])
        if d.target is None:
            self.memories[c] = d.memory
            return
        if version != self.version:
            return  # BadVersionError: someone else moved; the stale decision is dropped
        assert d.target.epoch == self.state.epoch + 1
        self.state = d.target
        self.version += 1
        self.memories[c] = d.memory
        self.epochs_written.append(d.target.epoch)

    # ---------------------------------------------------------------- invariants
    def check(self) -> None:
        readers = self.readers()
        assert len(readers) <= 1, (
            f"two readers at t={self.t}: {[(r.name, r.view) for r in readers]}; state {self.state}")
        for r in readers:
            assert r.commits >= self.acked, (
                f"rewind: {r.name} reads with commits {r.commits} < acknowledged {self.acked}")
        assert self.epochs_written == list(range(2, 2 + len(self.epochs_written)))


names = st.sampled_from(NAMES)


class FailoverModel(RuleBasedStateMachine):
    #: The quorum-write policy of the group (the knobs change which writes are refused,
    #: never what is safe: every policy below runs the same search).
    policy = AckPolicy.of(min_insync=1, auto_degrade=False)

    def __init__(self) -> None:
        super().__init__()
        self.w = World(policy=self.policy)

    @rule(n=st.integers(0, 2), who=st.sets(names), c=st.sampled_from((0, 1, None)))
    def progress(self, n: int, who: set[str], c: int | None) -> None:
        """Time passes; the brokers in ``who`` renew (reading the state), back-sync and
        publish; the others keep their stale views. Optionally a controller checks."""
        for _ in range(n):
            self.w.tick()
        for name in sorted(who):
            b = self.w.brokers[name]
            self.w.renew(b)
            self.w.backsync(b)
            self.w.publish(b)
        if c is not None:
            self.w.snapshot(c)
            self.w.act(c)

    @rule(rounds=st.integers(1, 4), c=st.sampled_from((0, 1)))
    def settle(self, rounds: int, c: int) -> None:
        """No time passes; every broker renews, back-syncs and publishes and a controller
        checks, ``rounds`` times: a fault followed by a quick reaction in few steps."""
        for _ in range(rounds):
            for b in self.w.brokers.values():
                self.w.renew(b)
                self.w.backsync(b)
                self.w.rejoin(b)
                self.w.publish(b)
            m = self.w.brokers["m"]
            if m.lease_at != self.w.t:  # the real master probes only then (ZooKeeper failing)
                self.w.probe_round()
            self.w.snapshot(c)
            self.w.act(c)

    @rule()
    def tick_once(self) -> None:
        self.w.tick()

    @rule(kind=st.sampled_from(("stop", "kill", "cut", "link")), name=names,
          ticks=st.integers(0, S + 1), c=st.sampled_from((0, 1)))
    def fault_then_react(self, kind: str, name: str, ticks: int, c: int) -> None:
        """A macro step: a fault, then ``ticks`` seconds in which everyone else renews,
        publishes and a controller checks — the common shape of a real incident, so the
        search reaches deep failover states often and spends its steps on interleavings."""
        b = self.w.brokers[name]
        if kind == "stop" and b.proc == "run":
            b.proc = "stop"
        elif kind == "kill":
            b.proc = "dead"
        elif kind == "cut":
            b.cut = True
        elif kind == "link":  # the master's: every link; a slave's: its own
            self.w.link_cut |= set(NAMES[1:]) if b.ordinal == 0 else {name}
        self.settle(3, c)
        for _ in range(ticks):
            self.w.tick()
            self.settle(3, c)

    @rule(ticks=st.integers(0, S + 2), links=st.sets(st.sampled_from(NAMES[1:]), min_size=1),
          c=st.sampled_from((0, 1)))
    def master_loses_zookeeper_then_links(self, ticks: int, links: set[str], c: int) -> None:
        """A macro step of the partition shapes: the master is cut from ZooKeeper and reads
        on its slaves' echoes for ``ticks`` seconds, then loses links to ``links``."""
        self.fault_then_react(kind="cut", name="m", ticks=ticks, c=c)
        self.w.link_cut |= links
        self.settle(3, c)

    @rule()
    def master_probes(self) -> None:
        self.w.probe()

    @rule(name=st.sampled_from(NAMES[1:]))
    def slave_answers_a_probe(self, name: str) -> None:
        self.w.answer(self.w.brokers[name])

    @rule(name=st.sampled_from(NAMES[1:]))
    def master_hears_an_echo(self, name: str) -> None:
        self.w.receive(self.w.brokers[name])

    @rule()
    def probe_round(self) -> None:
        self.w.probe_round()

    @rule(name=st.sampled_from(NAMES[1:]))
    def link_toggle(self, name: str) -> None:
        self.w.link_cut ^= {name}

    @rule(name=names)
    def deliver_watch(self, name: str) -> None:
        self.w.deliver(self.w.brokers[name])

    @rule(name=st.sampled_from(NAMES[1:]))
    def slave_rejoins_isr(self, name: str) -> None:
        self.w.rejoin(self.w.brokers[name])

    @rule(name=names)
    def consumer_commits(self, name: str) -> None:
        self.w.commit(self.w.brokers[name])

    @rule(name=names)
    def kill(self, name: str) -> None:
        self.w.brokers[name].proc = "dead"

    @rule(name=names)
    def sigstop(self, name: str) -> None:
        b = self.w.brokers[name]
        if b.proc == "run":
            b.proc = "stop"

    @rule(name=st.sampled_from(NAMES[1:]))
    def slow_disk(self, name: str) -> None:
        """A slave keeps running but stops acknowledging what it is sent."""
        self.w.brokers[name].slow = True

    @rule(name=names)
    def sigcont(self, name: str) -> None:
        b = self.w.brokers[name]
        if b.proc == "stop":
            b.proc = "run"

    @rule(name=names)
    def restart(self, name: str) -> None:
        b = self.w.brokers[name]
        if b.proc == "dead":
            # A new process: new (future) session, no view, no lease, nothing heard on the
            # replication links; a slave holds back READ for LS from its start (it cannot
            # know what it echoed before). The disk survives.
            self.w.brokers[name] = replace(
                b, proc="run", session=None, registered=False, view=None, lease_at=None,
                echoes={}, held_until=self.w.t + LS)
            for links in (self.w.probes, self.w.replies):
                for slave in links if b.ordinal == 0 else [name]:
                    links[slave].clear()

    @rule(name=names)
    def zk_partition_toggle(self, name: str) -> None:
        b = self.w.brokers[name]
        b.cut = not b.cut

    @rule(c=st.sampled_from((0, 1)))
    def controller_snapshot(self, c: int) -> None:
        self.w.snapshot(c)

    @precondition(lambda self: any(s is not None for s in self.w.snapshots))
    @rule(c=st.sampled_from((0, 1)))
    def controller_act(self, c: int) -> None:
        self.w.act(c)

    @invariant()
    def invariants_hold(self) -> None:
        self.w.check()


FailoverModel.TestCase.settings = settings(
    max_examples=300, stateful_step_count=60, deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_failover_model = FailoverModel.TestCase


def _with_policy(policy: AckPolicy) -> type[FailoverModel]:
    model = type(f"FailoverModel_isr{policy.in_sync_replicas}_floor{policy.min_insync}"
                 f"_{'degrade' if policy.auto_degrade else 'strict'}", (FailoverModel,),
                 {"policy": policy})
    model.TestCase.settings = settings(
        max_examples=120, stateful_step_count=60, deadline=None,
        suppress_health_check=[HealthCheck.too_slow])
    return model


# inSyncReplicas 3 (every broker) degrading to one slave; the same floor without degrade;
# the floor at zero (the master alone acknowledges, and then no slave is eligible).
test_failover_model_three_copies_degrading = _with_policy(
    AckPolicy.of(min_insync=1, auto_degrade=True, in_sync_replicas=3)).TestCase
test_failover_model_three_copies_strict = _with_policy(
    AckPolicy.of(min_insync=1, auto_degrade=False, in_sync_replicas=3)).TestCase
test_failover_model_master_alone_floor = _with_policy(
    AckPolicy.of(min_insync=0, auto_degrade=True, in_sync_replicas=3)).TestCase


def drive_to_slave_consume(w: World) -> None:
    """Master frozen by SIGSTOP; the controller fails over after its session expires."""
    for b in w.brokers.values():
        w.publish(b)
    w.brokers["m"].proc = "stop"
    while w.state.mode is not Mode.SLAVE_CONSUME:
        w.second()
        assert w.t < 60, w.state
    for b in w.brokers.values():
        w.renew(b)


def test_the_lease_is_what_keeps_a_resumed_master_from_reading() -> None:
    # Without leases, the frozen master resumes believing it is NORMAL: two readers.
    w = World(use_lease=False)
    drive_to_slave_consume(w)
    w.brokers["m"].proc = "run"  # SIGCONT; its watch has not fired yet
    assert {b.name for b in w.readers()} == {"m", w.state.acting}
    with pytest.raises(AssertionError, match="two readers"):
        w.check()
    # With leases, the same history leaves exactly one reader.
    w = World()
    drive_to_slave_consume(w)
    w.brokers["m"].proc = "run"
    assert [b.name for b in w.readers()] == [w.state.acting]
    w.check()


def test_full_cycle_returns_to_normal_without_rewind() -> None:
    w = World()
    for b in w.brokers.values():
        w.publish(b)
    w.commit(w.brokers["m"])
    w.brokers["m"].proc = "dead"
    for _ in range(30):
        if w.state.mode is Mode.SLAVE_CONSUME:
            break
        w.tick()
        for b in w.brokers.values():
            w.renew(b)
            w.publish(b)
        w.snapshot(1)
        w.act(1)
    assert w.state.mode is Mode.SLAVE_CONSUME
    acting = w.brokers[w.state.acting or ""]
    w.renew(acting)
    w.commit(acting)
    assert w.acked == 2
    w.brokers["m"] = replace(w.brokers["m"], proc="run", view=None, lease_at=None,
                             session=None, registered=False)
    for _ in range(30):
        if w.state.mode is Mode.NORMAL:
            break
        w.tick()
        for b in w.brokers.values():
            w.renew(b)
            w.backsync(b)
            w.publish(b)
        w.snapshot(0)
        w.act(0)
        w.check()
    assert w.state.mode is Mode.NORMAL
    w.renew(w.brokers["m"])
    assert [b.name for b in w.readers()] == ["m"]
    assert w.brokers["m"].commits == 2
    w.check()


def test_a_hung_master_keeps_reads_until_proven_unable() -> None:
    # The shortest path to two readers if the controller skipped the fencing proof: the
    # master hangs, a slave is named one second later, the master resumes with its lease.
    fm = FailoverModel()
    fm.fault_then_react(kind="stop", name="m", ticks=1, c=0)
    assert fm.w.state.mode is Mode.FENCING  # no proof yet: the session is still alive
    fm.sigcont("m")
    fm.w.check()
    fm.sigstop("m")
    fm.fault_then_react(kind="stop", name="m", ticks=S + 1, c=0)
    assert fm.w.state.mode is Mode.SLAVE_CONSUME  # proof: the session expired
    fm.sigcont("m")
    fm.w.check()
    assert [b.name for b in fm.w.readers()] == [fm.w.state.acting]


def test_a_slave_that_missed_acknowledged_commits_is_never_chosen() -> None:
    # Found by the random search before the ISR contract existed: s2 is down while the
    # master's commit is acknowledged by s1 alone; s1 dies; s2 returns; the master hangs.
    fm = FailoverModel()
    fm.kill("s2")
    fm.settle(1, 0)
    fm.w.renew(fm.w.brokers["m"])
    fm.consumer_commits("m")
    assert fm.w.acked == 1
    assert fm.w.isr == {"s1"}
    fm.kill("s1")
    fm.restart("s2")
    fm.fault_then_react(kind="stop", name="m", ticks=S + 2, c=0)
    fm.w.check()
    assert fm.w.state.mode is Mode.NORMAL or fm.w.state.acting != "s2"
    assert not any(b.name == "s2" for b in fm.w.readers())


@pytest.mark.parametrize(("policy", "acknowledged"), [
    (AckPolicy.of(min_insync=1, auto_degrade=False), True),  # two copies are enough
    (AckPolicy.of(min_insync=1, auto_degrade=False, in_sync_replicas=3), False),  # refused
    (AckPolicy.of(min_insync=1, auto_degrade=True, in_sync_replicas=3), True),  # degrades
])
def test_a_slow_slave_leaves_the_record_before_a_commit_goes_on_without_it(
        policy: AckPolicy, acknowledged: bool) -> None:
    w = World(policy=policy)
    w.brokers["s2"].slow = True
    w.commit(w.brokers["m"])
    assert w.isr == {"s1"}  # recorded first, whatever the outcome
    assert (w.acked == w.counter) is acknowledged
    # The master and s1 die: s2 lacks the commit and is not eligible, so no rewind.
    w.brokers["m"].proc = w.brokers["s1"].proc = "dead"
    for _ in range(12):
        w.second()
        w.check()
    assert w.state.acting != "s2"


def cut_master_from_zookeeper(w: World, ticks: int) -> None:
    """Seed 000 §3, scenario 3: the master loses ZooKeeper, keeps its slaves. Each second
    every broker renews and publishes, the master probes (its confirmations fail), and a
    controller checks."""
    for b in w.brokers.values():
        w.publish(b)
    w.brokers["m"].cut = True
    for _ in range(ticks):
        w.second(probe=True)
        w.check()


def test_a_master_cut_from_zookeeper_only_keeps_reading_on_its_slaves_echoes() -> None:
    w = World()
    cut_master_from_zookeeper(w, 3 * S)
    assert "m" not in w.ephemerals  # its session expired long ago
    assert w.state.mode is Mode.NORMAL  # nobody moved
    assert w.epochs_written == []
    assert [b.name for b in w.readers()] == ["m"]
    # Without the slave route the same history leaves the group without a reader.
    w = World(use_slave_route=False)
    cut_master_from_zookeeper(w, 3 * S)
    assert w.readers() == []


def test_a_slave_that_echoed_holds_back_its_reads_until_the_master_lease_it_renewed_ends() -> None:
    """The master, cut from ZooKeeper, read on its slaves' echoes; then its links are cut
    too, and the controller makes a slave act at once. Without the hold-back the slave
    reads while the master's echo-renewed lease still runs: two readers."""
    def history(w: World) -> None:
        cut_master_from_zookeeper(w, S + 1)  # its session is gone: proof for FENCING
        w.probe_round()  # the last echoes, at this tick
        w.link_cut |= {"s1", "s2"}
        for b in w.brokers.values():
            w.renew(b)
            w.publish(b)
        for _ in range(4):  # the controller moves at once (detection within this tick)
            w.snapshot(0)
            w.act(0)
            for b in w.brokers.values():
                w.renew(b)
                w.publish(b)

    w = World(use_wait_out=False)
    history(w)
    assert w.state.mode is Mode.SLAVE_CONSUME
    assert {b.name for b in w.readers()} == {"m", w.state.acting}
    with pytest.raises(AssertionError, match="two readers"):
        w.check()
    w = World()
    history(w)
    assert w.state.mode is Mode.SLAVE_CONSUME
    assert [b.name for b in w.readers()] == ["m"]  # the slave holds back
    w.check()
    for _ in range(LS):
        w.second(controller=False)
        w.check()
    assert [b.name for b in w.readers()] == [w.state.acting]
