"""The failover drill: real traffic through real faults, recorded, then judged.

Why this module exists: the invariants (no lost acknowledged message, no rewind, one
reader) and the failover figures (reads restored, failback gap, back-sync) are only
believable when measured on a running cluster under the faults that matter. The drill
brings up a local cluster, runs a producer and consumer groups per broker group while it
kills (``kill -9``) or freezes (SIGSTOP past the session timeout, then SIGCONT) a master,
waits for slave-consume, brings the master back, waits for NORMAL, and repeats. Everything
observed goes into a history file (:mod:`.history`); the verdict comes from the one
shared checker (:mod:`.checker`). The cluster is torn down whatever happens.

How permissions are observed: each broker appends every change of its effective
permission to ``<data-dir>/permissions.jsonl`` at the instant it happens (``time.time_ns``,
lease lapses backdated to the lapse). After the cluster is down the drill merges those logs
into the history (:mod:`.permevents`), ending a SIGKILLed incarnation's READ at the kill (it
cannot write a last line); the history uses the same clock, so the timing error is the clock
read itself. Group modes come from the controller's transition journal (exact times of the
versioned state writes); a ZooKeeper watch on ``/groups/<g>/state`` only tells the drill
when to move on.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import itertools
import json
import logging
import signal
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kazoo.exceptions import KazooException

from understudy_broker.admin import describe_consumer_group, describe_topic
from understudy_broker.chains import history_violations
from understudy_broker.ha.permlog import FILE_NAME, read_changes
from understudy_broker.model import GroupState, Mode
from understudy_broker.zklayout import (
    ChainDoc,
    GroupConfig,
    LayoutError,
    chains_path,
    decode_state,
    state_path,
)
from understudy_harness import chaos, chaosfaults, promrun, subclients
from understudy_harness.checker import Report, check
from understudy_harness.history import (
    Deliver,
    Fault,
    HistoryWriter,
    ModeChange,
    ProduceAck,
    Restart,
    read_history,
)
from understudy_harness.permevents import LoggedChange, perm_events_from_log
from understudy_harness.subclients import SubClient
from understudy_harness.testing import zk_session
from understudy_harness.workload import (
    CONSUMER_GROUPS,
    Target,
    Traffic,
    TrafficCounts,
    create_cluster_topic,
)
from understudy_operator.controller.journal import read_transitions
from understudy_operator.controller.machine import eligible_slaves
from understudy_operator.local import cluster as lc
from understudy_operator.local import procs
from understudy_operator.local.plan import ClusterPlan, on_loopback, plan_cluster, transitions_log
from understudy_operator.zk import ZkGateway, gateway

log = logging.getLogger(__name__)

FAULTS = ("kill", "hang")
#: ``--faults``: ``mixed`` is the chaos soak (every kind of :data:`chaos.KINDS` in turn).
FAULT_MIXES = ("mixed",)
SCENARIOS = ("failover", "cluster", "ordered", "delayed")
CLUSTER_TOPIC = "drill-cluster"
ORDERED_TOPIC = "drill-ordered"
DELAYED_TOPIC = "drill-delayed"
#: The delayed scenario's delivery delays (ms): due while the slave acts, whatever the
#: phase of the cycle they were sent in.
DELAYS_MS = (1000, 5000)
#: Members hand back the first delivery of one message in this many.
NACK_EVERY = 10


class DrillError(RuntimeError):
    """The drill could not run (missing parts, a cycle that never completed)."""


@dataclass(frozen=True, slots=True)
class DrillOptions:
    cycles: int = 3
    fault: str = "kill"
    groups: int = 1
    slaves: int = 1
    directory: Path | None = None
    rate: float = 200.0  # messages per second per broker group
    queues: int = 4
    warmup_s: float = 1.0
    dwell_s: float = 1.0  # slave-consume time before the master comes back
    cycle_timeout_s: float = 30.0
    drain_timeout_s: float = 30.0
    session_timeout_ms: int = 2000
    #: ``False``: brokers with static permissions and no controller (no failover), for a
    #: run that must show two readers on purpose. Cycles need a coordinated cluster.
    coordinated: bool = True
    #: Scrape the cluster with a private Prometheus at this interval and export its
    #: data for the SLA job (:mod:`.promrun`); ``None``: no Prometheus.
    prometheus_interval_s: float | None = None
    #: With ``prometheus_interval_s``: called (in a thread) with the private Prometheus'
    #: URL once the run is exported and before the server stops, to read it through its
    #: HTTP API as ``understudy sla report --prometheus`` does; what it raises is an error
    #: of the run.
    while_prometheus_runs: Callable[[str], None] | None = None
    #: ``failover``: a topic per group, keyed sends, faults of ``fault`` kind. ``cluster``:
    #: one topic over every group (at least 2), unkeyed sends that route around a dead
    #: master, ``members`` members per consumer group; cycles alternate kill and hang over
    #: the groups' masters, and while the faulted group's slave acts a member of ``cg1``
    #: joins, leaves cleanly or crashes (in turn). ``ordered``: one ordered topic over every
    #: group (at least 2), a producer process and two in-process producers (one active at a
    #: time), ``members`` members per consumer group and a consumer process in ``cg2``;
    #: each cycle kills or hangs (in turn) the master of the topic's send head and, while
    #: its slave acts, pauses the processes past their sessions, crashes the active
    #: producer, or crashes the member reading for ``cg1`` (:func:`ordered_event`).
    #: ``delayed``: one topic over every group (at least 2) whose every message is sent
    #: for delivery 1-5 s later; members hand back one first delivery in ten (redelivered
    #: a second later through the retry topic); cycles kill and hang masters in turn and
    #: hold the slave acting for ``dwell_s`` while messages and retries fall due (escape;
    #: the JSON adds scheduled_lost, delivered_early and escape_duplicates).
    scenario: str = "failover"
    members: int = 2
    #: ``"mixed"``: the chaos soak (:func:`run_mixed`): the cluster scenario's traffic,
    #: each cycle the next kind of ``kinds`` (:func:`chaos.rotation`, ``seed``) on a group.
    faults: str | None = None
    kinds: tuple[str, ...] = chaos.KINDS
    seed: int | None = None
    zk_ensemble: int = 1
    #: TLS on every broker port, SCRAM and ACLs (``local up --secure``); every client of
    #: the run (in-process and subprocesses) connects as the cluster's admin.
    secure: bool = False
    #: Stop starting cycles once this many seconds from the start, less what the drain,
    #: teardown and check need, have passed; ``None``: no cap.
    max_seconds: float | None = None
    #: The chaos soak: each master's data directory on a tmpfs of this size (``disk_full``).
    disk_bytes: int = 256 << 20
    #: The chaos soak: put the cluster in network namespaces when the machine allows.
    netns: bool = True


@dataclass(slots=True)
class DrillResult:
    report: Report
    history: Path
    directory: Path
    cycles_completed: int
    sampling: dict[str, Any]
    errors: list[str] = field(default_factory=list)
    prometheus: dict[str, Any] | None = None  # the export (promrun.Export.to_json()), if any
    #: The ordered scenario: the chain documents as watched, and what the rules say of them.
    chain_history: list[dict[str, Any]] | None = None
    chain_violations: list[str] = field(default_factory=list)
    #: The chaos soak: the checker's counts and figures per fault kind, what each cycle
    #: saw, and why it stopped before its cycles were done (the time cap).
    chaos: list[chaos.KindSummary] | None = None
    chaos_cycles: list[dict[str, Any]] = field(default_factory=list)
    stopped_early: str | None = None

    @property
    def ok(self) -> bool:
        return self.report.ok and not self.errors and not self.chain_violations

    def to_json(self) -> dict[str, Any]:
        doc = self.report.to_json()
        doc.update(
            ok=self.ok,
            errors=self.errors,
            cycles_completed=self.cycles_completed,
            history=str(self.history),
            directory=str(self.directory),
            perm_sampling=self.sampling,
        )
        if self.prometheus is not None:
            doc["prometheus"] = self.prometheus
        if self.chain_history is not None:
            doc["chain_history"] = self.chain_history
            doc["chain_violations"] = self.chain_violations
        if self.chaos is not None:
            doc.update(chaos=chaos.to_json(self.chaos), chaos_cycles=self.chaos_cycles,
                       stopped_early=self.stopped_early)
        return doc


class Status(TrafficCounts):
    """Live progress, fed by the drill and read by the CLI's status line."""

    def __init__(self) -> None:
        super().__init__()
        self.phase = "starting"
        self.cycle = 0

    def line(self) -> str:
        return (
            f"{self.phase}  acked {self.acked}  delivered {self.delivered}  "
            f"unacked sends {self.failed_sends}"
        )


# ----------------------------------------------------------------------- observation


class ModeWatch:
    """Keeps each group's latest mode (a ZooKeeper watch) so the drill can wait for one.

    It does not record mode changes: a watch fires with the state current when it is read
    again, so a short RECOVERING can be missed. The history takes mode changes from the
    controller's transition journal instead (:func:`merge_transitions`)."""

    def __init__(self, zk: ZkGateway) -> None:
        self._zk = zk
        self._latest: dict[str, GroupState] = {}
        self.chains: list[ChainDoc] = []  # of the watched ordered topic, as seen

    async def watch_chains(self, topic: str) -> None:
        """Record every version of ``topic``'s chains this watch sees (docs/ordered.md)."""
        def on_change(data: bytes | None) -> None:
            if data is None:
                return
            try:
                doc = ChainDoc.from_json(data)
            except LayoutError as exc:
                log.warning("chains of %s: unreadable: %s", topic, exc)
                return
            if not self.chains or self.chains[-1] != doc:
                self.chains.append(doc)

        await self._zk.data_watch(chains_path(topic), on_change)

    def send_head(self) -> str | None:
        return self.chains[-1].head if self.chains else None

    @classmethod
    async def open(cls, plan: ClusterPlan) -> ModeWatch:
        zk = gateway(plan.zk_connect, timeout_s=5.0)
        await zk.start(timeout_s=10)
        watch = cls(zk)
        for g in plan.groups:
            await zk.data_watch(state_path(g.group), watch._callback(g.group))
        return watch

    def _callback(self, group: str) -> Callable[[bytes | None], None]:
        def on_change(data: bytes | None) -> None:
            if data is None:
                return
            try:
                st = decode_state(data)
            except LayoutError as exc:
                log.warning("group %s: unreadable state: %s", group, exc)
                return
            self._latest[group] = st

        return on_change

    def mode(self, group: str) -> Mode | None:
        got = self._latest.get(group)
        return None if got is None else got.mode

    def last_seen(self, group: str) -> str:
        """The group's latest state as seen, with the controller's reason for it."""
        st = self._latest.get(group)
        if st is None:
            return "no state"
        return f"{st.mode.name} at epoch {st.epoch}" + (f": {st.reason}" if st.reason else "")

    async def wait(self, group: str, mode: Mode, *, within_s: float) -> None:
        deadline = time.monotonic() + within_s
        while self.mode(group) is not mode:
            if time.monotonic() > deadline:
                raise DrillError(f"group {group} did not reach {mode.name} within "
                                 f"{within_s:.0f}s (last seen: {self.last_seen(group)})")
            await asyncio.sleep(0.01)

    async def failover_facts(self, config: GroupConfig) -> tuple[list[str], str]:
        """The slaves of ``config`` the controller could hand reads to the moment its
        master is gone (:func:`machine.eligible_slaves`, the controller's own rule:
        ZooKeeper-live, a published status, READ configured, in the in-sync record), and
        the facts behind that, in words (for an error message)."""
        obs = await self._zk.observe_group(config.group, [b.name for b in config.brokers])
        eligible = [s.name for s in eligible_slaves(config, obs, need_link_down=False)]
        live = sorted(b.name for b in config.brokers if obs.view(b.name).zk_live)
        isr = "none" if obs.in_sync is None else f"[{', '.join(sorted(obs.in_sync))}]"
        return eligible, (f"in-sync record {isr}, ZooKeeper-live [{', '.join(live)}], "
                          f"eligible to act for reads [{', '.join(eligible)}]")

    async def wait_failover_possible(self, config: GroupConfig, *, within_s: float) -> None:
        """Wait until ``config``'s group is NORMAL and some slave could act for reads at
        once if its master went (:meth:`failover_facts`).

        Why: a slave leaves the in-sync record when it has not acknowledged a waiting write
        within the 1 s lag bound (docs/replication.md), as a slave starved of CPU or disk
        on a loaded machine does now and then, and it rejoins once it has caught up. A
        master faulted in that window leaves its group NORMAL with nobody to hand reads to
        (by design: the slave may lack an acknowledged write) until the master is back,
        and a cycle that waits for SLAVE_CONSUME before bringing it back fails after its
        timeout. That is not the failover the cycle is there to exercise."""
        deadline = time.monotonic() + within_s
        while True:
            facts = "group state not NORMAL"
            if self.mode(config.group) is Mode.NORMAL:
                try:
                    async with asyncio.timeout(max(0.1, deadline - time.monotonic())):
                        eligible, facts = await self.failover_facts(config)
                except (KazooException, TimeoutError) as exc:
                    facts = f"ZooKeeper did not answer: {exc!r}"
                else:
                    if eligible:
                        return
            if time.monotonic() > deadline:
                raise DrillError(f"group {config.group} was not ready for a failover within "
                                 f"{within_s:.0f}s (last seen: {self.last_seen(config.group)}; "
                                 f"{facts})")
            await asyncio.sleep(0.05)

    async def close(self) -> None:
        await self._zk.stop()


def merge_transitions(plan: ClusterPlan, history: Path) -> int:
    """Append the controller's transition journal to ``history`` as ``mode`` events
    (exact times of every versioned state write); returns how many were added."""
    added = 0
    with HistoryWriter(history, clock=time.time_ns, clock_name="time_ns") as writer:
        for t in read_transitions(transitions_log(plan.dir)):
            writer.record(ModeChange(t.t_ns, t.group, t.mode, t.epoch))
            added += 1
    return added


def merge_permission_logs(plan: ClusterPlan, history: Path) -> int:
    """Append every broker's permission-change log to ``history`` as ``perm`` events;
    returns how many were added."""
    faults = [e for e in read_history(history).events if isinstance(e, Fault)]
    added = 0
    with HistoryWriter(history, clock=time.time_ns, clock_name="time_ns") as writer:
        for g in plan.groups:
            for b in g.brokers:
                path = plan.dir / "data" / b.name / FILE_NAME
                changes = [LoggedChange(c.t_ns, c.effective, c.pid) for c in read_changes(path)]
                for ev in perm_events_from_log(
                    group=g.group, broker=b.name, role=b.role.value, changes=changes, faults=faults
                ):
                    writer.record(ev)
                    added += 1
    return added


def cluster_targets(plan: ClusterPlan) -> list[Target]:
    """The cluster scenario's one stream: a topic over every group, unkeyed sends."""
    return [Target(label="cluster", topic=CLUSTER_TOPIC,
                   bootstrap=tuple(b for g in plan.groups for b in plan.bootstrap(g.group)),
                   groups=tuple(g.group for g in plan.groups), keyed=False)]


def ordered_targets(plan: ClusterPlan) -> list[Target]:
    """The ordered scenario's one stream: an ordered topic over every group, two producer
    instances of which the brokers let one send."""
    return [Target(label="ordered", topic=ORDERED_TOPIC,
                   bootstrap=tuple(b for g in plan.groups for b in plan.bootstrap(g.group)),
                   groups=tuple(g.group for g in plan.groups), keyed=False, ordered=True,
                   producers=2)]


def delayed_targets(plan: ClusterPlan) -> list[Target]:
    """The delayed scenario's one stream: delayed unkeyed sends over every group, members
    that hand some messages back."""
    return [Target(label="delayed", topic=DELAYED_TOPIC,
                   bootstrap=tuple(b for g in plan.groups for b in plan.bootstrap(g.group)),
                   groups=tuple(g.group for g in plan.groups), keyed=False,
                   delay_ms=DELAYS_MS, nack_every=NACK_EVERY, resend=False)]


def traffic_targets(plan: ClusterPlan) -> list[Target]:
    """One traffic stream per broker group, on topic ``drill-<group>``."""
    return [Target(label=g.group, topic=f"drill-{g.group}", bootstrap=tuple(plan.bootstrap(g.group)))
            for g in plan.groups]  # fmt: skip


# ------------------------------------------------------------------------------ cycles


async def _cycle(
    n: int, plan: ClusterPlan, watch: ModeWatch, writer: HistoryWriter, status: Status, opts: DrillOptions,
    *, during: Callable[[], Awaitable[None]] | None = None, kind: str | None = None,
    group: GroupConfig | None = None,
) -> None:
    """Fault the next group's master (or ``group``'s) with the cycle's fault (or
    ``kind``), wait for slave-consume, run ``during`` (while the slave acts), bring the
    master back, wait for NORMAL."""
    kind = kind or cycle_fault(n, opts)
    group = group or plan.groups[(n - 1) % len(plan.groups)]
    if opts.scenario == "ordered":  # the send head's master, wherever the head is now
        head = watch.send_head()
        group = next((g for g in plan.groups if g.group == head), group)
    master = group.master.name
    proc = plan.process(master)
    timeout = opts.cycle_timeout_s
    status.phase = f"cycle {n}: steady"
    await asyncio.sleep(opts.warmup_s)
    status.phase = f"cycle {n}: waiting until {group.group} can fail over"
    await watch.wait_failover_possible(group, within_s=timeout)
    pid = procs.read_pid(plan.pid_dir, master)
    info = procs.inspect(pid, marker=proc.marker)
    if info is None or not info.alive:
        raise DrillError(f"cycle {n}: master {master} is not running before the fault")
    status.phase = f"cycle {n}: {kind} {master}"
    writer.fault(cycle=n, kind=kind, broker=master, group=group.group)
    frozen_at = time.monotonic()
    procs.send(info.pid, procs.SIGNALS["STOP" if kind == "hang" else "KILL"])
    status.phase = f"cycle {n}: waiting for slave-consume"
    try:
        await watch.wait(group.group, Mode.SLAVE_CONSUME, within_s=timeout)
    except DrillError as exc:  # say why nobody took reads, as the controller sees it
        facts = "its failover facts could not be read"
        with contextlib.suppress(KazooException, TimeoutError):
            async with asyncio.timeout(5.0):
                facts = (await watch.failover_facts(group))[1]
        raise DrillError(f"{exc}; after the {kind} of {master}: {facts}") from None
    status.phase = f"cycle {n}: slave-consume"
    if during is not None:
        await during()
    await asyncio.sleep(opts.dwell_s)
    if kind == "hang":
        # keep it frozen past its session timeout, then let it wake up believing it is master
        hold = opts.session_timeout_ms / 1000 + 0.5 - (time.monotonic() - frozen_at)
        await asyncio.sleep(max(0.0, hold))
        procs.send(info.pid, procs.SIGNALS["CONT"])
    else:
        await asyncio.to_thread(procs.wait_gone, info.pid, marker=proc.marker, timeout=5.0)
        await asyncio.to_thread(lc.start, plan.dir, master, wait=False)
    writer.restart(cycle=n, broker=master, group=group.group)
    status.phase = f"cycle {n}: waiting for NORMAL"
    await watch.wait(group.group, Mode.NORMAL, within_s=timeout)


def cycle_fault(n: int, opts: DrillOptions) -> str:
    """The fault of cycle ``n``: ``opts.fault``, or kill and hang in turn (cluster,
    ordered)."""
    if opts.scenario in ("cluster", "ordered", "delayed"):
        return FAULTS[(n - 1) % len(FAULTS)]
    return opts.fault


async def member_event(n: int, traffic: Traffic, writer: HistoryWriter, status: Status) -> None:
    """Cycle ``n`` of the cluster scenario, while a slave acts: a member of ``cg1`` joins
    (n = 1, 4, ...), leaves cleanly (2, 5, ...) or crashes and is replaced by a new one
    (3, 6, ...). A crash is recorded as a ``member-crash`` fault: what it had handed out
    and not committed may be delivered again (the at-least-once window). So is a clean
    leave (``member-leave``): it commits first, but where its queue's group has no reader
    then (the chaos soak's faults) the commit is refused, and the next owner gets what it
    had handed out again; a commit that did land still shows a redelivery as a rewind."""
    cgroup, target = CONSUMER_GROUPS[0], traffic.targets[0]
    members = traffic.members_of(cgroup)
    step = (n - 1) % 3
    if step == 0 or not members or (step == 1 and len(members) < 2):
        status.phase = f"cycle {n}: a member joins {cgroup}"
        traffic.add_member(target, cgroup)
    elif step == 1:
        status.phase = f"cycle {n}: {members[0]} leaves {cgroup}"
        await traffic.remove_member(members[0], crash=False)
        writer.fault(cycle=n, kind="member-leave", broker=members[0], group=cgroup)
    else:
        status.phase = f"cycle {n}: {members[0]} crashes"
        await traffic.remove_member(members[0], crash=True)
        # Recorded once it has stopped: it may hand out records until then, and the
        # checker judges a redelivery against the crash that came after the first one.
        writer.fault(cycle=n, kind="member-crash", broker=members[0], group=cgroup)
        traffic.add_member(target, cgroup)


async def holders(target: Target) -> dict[str, str | None]:
    """Who the brokers let send ``target``'s ordered topic (``producer``) and who reads it
    for each consumer group (the consumer group's name)."""
    boot = list(target.bootstrap)
    out: dict[str, str | None] = {"producer": None}
    with contextlib.suppress(Exception):
        out["producer"] = ((await describe_topic(boot, target.topic, target.security))
                           .get("producers") or {}).get("active")
    for cg in CONSUMER_GROUPS:
        with contextlib.suppress(Exception):
            d = await describe_consumer_group(boot, cg, target.security)
            out[cg] = next((str(a["member"]) for a in d["assignment"]
                            if a["topic"] == target.topic), None)
    return out


async def ordered_event(n: int, traffic: Traffic, writer: HistoryWriter, status: Status,
                        subs: list[SubClient], session_timeout_ms: int) -> None:
    """Cycle ``n`` of the ordered scenario, while the old send head's slave acts:

    - n = 1, 4, ...: the subprocess producer and consumer (``subs``; at the start they are
      the active producer and ``cg2``'s reader) are paused (SIGSTOP) past their sessions
      and continued: they wake to find the brokers handed their leadership and their
      topic on (``producer-pause``, ``member-pause`` faults);
    - n = 2, 5, ...: the active producer crashes (no hand-over; ``producer-crash``): an
      in-process one is replaced by a new instance standing by;
    - n = 3, 6, ...: the member reading for ``cg1`` crashes (``member-crash``) and a new
      member joins.

    A fault is recorded once the client has stopped."""
    target = traffic.targets[0]
    step = (n - 1) % 3
    if step == 0:
        gone = [c for c in subs if not c.alive and c.stopped_at is None]
        if gone:  # exited on their own: the scenario cannot pause them
            raise DrillError(f"cycle {n}: " + "; ".join(
                f"{c.name} exited (code {c.proc.returncode}) before its pause: {c.log_tail()}"
                for c in gone))
        alive = [c for c in subs if c.alive]
        if not alive:
            status.phase = f"cycle {n}: no subprocess client to pause"
            return
        now = await holders(target)
        status.phase = (f"cycle {n}: pausing {', '.join(c.name for c in alive)} (active "
                        f"producer {now['producer']}, cg2 reads with {now.get('cg2')})")
        for c in alive:
            c.signal(signal.SIGSTOP)
            kind = "producer-pause" if c.kind == "producer" else "member-pause"
            writer.fault(cycle=n, kind=kind, broker=c.name, group=c.cgroup or target.topic)
        await asyncio.sleep(session_timeout_ms / 1000 + 0.5)
        for c in alive:
            c.signal(signal.SIGCONT)
            writer.restart(cycle=n, broker=c.name, group=c.cgroup or target.topic)
        return
    if step == 1:
        name = traffic.active_producer(target)
        if name is not None:
            status.phase = f"cycle {n}: the active producer {name} crashes"
            await traffic.crash_producer(name)
            writer.fault(cycle=n, kind="producer-crash", broker=name, group=target.topic)
            traffic.add_producer(target)
            return
        active = (await holders(target))["producer"]
        sub = next((c for c in subs if c.kind == "producer" and c.name == active and c.alive),
                   None)
        if sub is None:
            status.phase = f"cycle {n}: no active producer to crash"
            return
        status.phase = f"cycle {n}: the active producer {sub.name} (a process) is killed"
        sub.stop()
        writer.fault(cycle=n, kind="producer-crash", broker=sub.name, group=target.topic)
        return
    cgroup = CONSUMER_GROUPS[0]
    reading = traffic.reading_members(cgroup)
    if not reading:
        status.phase = f"cycle {n}: no member of {cgroup} reads now"
        return
    status.phase = f"cycle {n}: {reading[0]}, reading for {cgroup}, crashes"
    await traffic.remove_member(reading[0], crash=True)
    writer.fault(cycle=n, kind="member-crash", broker=reading[0], group=cgroup)
    traffic.add_member(target, cgroup)


async def start_subclients(plan: ClusterPlan, target: Target, opts: DrillOptions,
                           status: Status) -> list[SubClient]:
    """The ordered scenario's subprocess producer and ``cg2`` member, started before the
    in-process clients so that they are the active ones at first (waited for, bounded)."""
    await create_cluster_topic(target, 1)
    client_args = plan.security.client_argv() if plan.secure else []
    subs = [
        subclients.start_producer(plan.dir, target.bootstrap, target.topic, name="ordered.sub",
                                  rate=opts.rate * len(plan.groups),
                                  session_timeout_ms=opts.session_timeout_ms,
                                  client_args=client_args),
        subclients.start_consumer(plan.dir, target.bootstrap, target.topic,
                                  cgroup=CONSUMER_GROUPS[1], name="cg2.sub",
                                  session_timeout_ms=opts.session_timeout_ms,
                                  client_args=client_args),
    ]
    status.phase = "waiting for the subprocess clients to be the active ones"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        now = await holders(target)
        if now["producer"] == "ordered.sub" and now.get(CONSUMER_GROUPS[1]) == "cg2.sub":
            return subs
        if not all(c.alive for c in subs):
            break
        await asyncio.sleep(0.2)
    for c in subs:
        c.stop()
    raise DrillError("the subprocess producer and consumer did not become active within 30 s "
                     f"(logs: {plan.dir}/ordered.sub.log, {plan.dir}/cg2.sub.log)")


def merge_subclients(subs: list[SubClient], traffic: Traffic, writer: HistoryWriter) -> None:
    """Stop the subprocess clients (SIGKILL) and add what they recorded to the history and
    to the drain's bookkeeping (their acknowledgements must be delivered, their
    deliveries count)."""
    label = traffic.targets[0].label
    for c in subs:
        c.stop()
        for ev in c.events():
            writer.record(ev)
            if isinstance(ev, ProduceAck):
                traffic.acked[label].add(ev.id)
            elif isinstance(ev, Deliver):
                traffic.received[(label, ev.cgroup)].add(ev.id)


def _quiet_unretrieved(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """Client futures that failed with a lost connection nobody awaited any more are
    expected while brokers are being killed: log them quietly, not as tracebacks on the
    drill's screen. Anything else goes to the default handler."""
    exc = context.get("exception")
    if context.get("message") == "Future exception was never retrieved" and isinstance(exc, ConnectionError):
        log.debug("unretrieved client future: %s", exc)
        return
    loop.default_exception_handler(context)


async def _revive_masters(plan: ClusterPlan) -> None:
    """Best effort after a failed cycle: start (or resume) any master that is down."""
    for g in plan.groups:
        with contextlib.suppress(lc.LocalError):
            await asyncio.to_thread(lc.start, plan.dir, g.master.name, wait=False)


async def run_drill(opts: DrillOptions, *, status: Status | None = None,
                    lab: chaosfaults.Lab | None = None) -> DrillResult:
    """Run the drill end to end; the cluster is always torn down. ``--faults mixed``
    runs through :func:`run_mixed`, which gives it its ``lab``."""
    started = time.monotonic()
    if opts.fault not in FAULTS:
        raise DrillError(f"unknown fault {opts.fault!r}: expected one of {', '.join(FAULTS)}")
    if opts.scenario not in SCENARIOS:
        raise DrillError(f"unknown scenario {opts.scenario!r}: expected one of "
                         f"{', '.join(SCENARIOS)}")
    mixed = opts.faults is not None
    if mixed:
        opts = mixed_options(opts)
        if lab is None:
            raise DrillError("--faults mixed runs through run_mixed (it prepares the lab)")
    cluster = opts.scenario in ("cluster", "ordered", "delayed")
    ordered = opts.scenario == "ordered"
    delayed = opts.scenario == "delayed"
    if cluster:
        opts = dataclasses.replace(opts, groups=max(2, opts.groups),
                                   members=max(2 if ordered else 1, opts.members))
    if opts.cycles and not opts.coordinated:
        raise DrillError("failover cycles need a coordinated cluster (brokers with --zk and "
                         "a controller)")
    if opts.prometheus_interval_s is not None and promrun.missing():
        raise DrillError("--prometheus needs the Debian 'prometheus' package (missing: "
                         + ", ".join(promrun.missing()) + "); run 'make setup'")
    if opts.prometheus_interval_s is not None:
        # Prometheus must see every NORMAL between two cycles: in any 3 intervals there is
        # a whole bucket in which both the controller and the master were scraped.
        opts = dataclasses.replace(opts, warmup_s=max(opts.warmup_s, 3 * opts.prometheus_interval_s))
    status = status or Status()
    asyncio.get_running_loop().set_exception_handler(_quiet_unretrieved)
    directory = opts.directory or Path(tempfile.mkdtemp(prefix="understudy-drill-"))
    status.phase = "bringing up the cluster"
    plan = await asyncio.to_thread(
        lc.up,
        directory,
        groups=opts.groups,
        slaves=opts.slaves,
        session_timeout_ms=opts.session_timeout_ms,
        coordinated=opts.coordinated,
        progress=lambda msg: setattr(status, "phase", msg),
        zk_ensemble=opts.zk_ensemble,
        placement=on_loopback if lab is None else lab.placement,
        data_dirs=None if lab is None else lab.data_dirs(),
        secure=opts.secure,
    )
    history = plan.dir / "history.jsonl"
    # A history is one run: a directory reused from an earlier drill must not lend it its
    # faults and commits (the checker would judge both runs as one).
    history.unlink(missing_ok=True)
    errors: list[str] = []
    completed = 0
    soak: MixedRun | None = None
    chains: list[ChainDoc] = []
    prom: promrun.PrometheusServer | None = None
    exported: dict[str, Any] | None = None
    try:
        if opts.prometheus_interval_s is not None:
            status.phase = "starting Prometheus"
            try:
                prom = await asyncio.to_thread(promrun.record_cluster, plan, interval_s=opts.prometheus_interval_s)
            except promrun.PrometheusError as exc:
                raise DrillError(f"Prometheus did not start: {exc}") from None
        # time.time_ns: the clock the brokers' permission-change logs are written with
        with HistoryWriter(history, clock=time.time_ns, clock_name="time_ns") as writer:
            watch = await ModeWatch.open(plan) if opts.coordinated else None
            if watch is not None and ordered:
                await watch.watch_chains(ORDERED_TOPIC)
            targets = (ordered_targets(plan) if ordered else delayed_targets(plan) if delayed
                       else cluster_targets(plan) if cluster else traffic_targets(plan))
            security = lc.client_security(plan)
            targets = [dataclasses.replace(t, security=security) for t in targets]
            traffic = Traffic(
                targets, writer, status,
                rate=opts.rate * (len(plan.groups) if cluster else 1), queues=opts.queues,
                consumer_groups=CONSUMER_GROUPS, members=opts.members if cluster else 0,
                session_timeout_ms=opts.session_timeout_ms,
            )  # fmt: skip
            subs: list[SubClient] = []
            try:
                if ordered:
                    subs = await start_subclients(plan, targets[0], opts, status)
                await traffic.start()
                status.phase = "warming up"
                await asyncio.sleep(opts.warmup_s)
                if watch is not None and lab is not None and mixed:
                    soak = await _mixed_cycles(plan, watch, writer, status, opts, traffic, lab,
                                               errors, started=started)
                    completed = soak.completed
                for n in range(1, 0 if mixed else opts.cycles + 1):
                    status.cycle = n
                    if watch is None:  # refused above: cycles need coordination
                        raise DrillError("failover cycles need a coordinated cluster")
                    during = None
                    if ordered:
                        during = functools.partial(ordered_event, n, traffic, writer, status,
                                                   subs, opts.session_timeout_ms)
                    elif cluster and not delayed:
                        during = functools.partial(member_event, n, traffic, writer, status)
                    try:
                        await _cycle(n, plan, watch, writer, status, opts, during=during)
                    except DrillError as exc:
                        errors.append(str(exc))
                        await _revive_masters(plan)  # so the drain can still judge the run
                        break
                    completed = n
                    traffic.generation += 1  # consumers resume from committed offsets
                status.phase = "draining"
                merge_subclients(subs, traffic, writer)
                if not await traffic.finish(drain_timeout=opts.drain_timeout_s):
                    errors.append(f"drain did not complete within {opts.drain_timeout_s:.0f}s")
            finally:
                for c in subs:  # stopped by PID whatever happened
                    c.stop()
                await traffic.shutdown()
                if watch is not None:
                    chains = list(watch.chains)
                    await watch.close()
        if prom is not None:  # before the cluster goes: the last NORMAL must be scraped
            status.phase = "exporting from Prometheus"
            try:
                export = await asyncio.to_thread(prom.export, prom.directory / "export")
                exported = {"url": prom.url, "scrape_interval_s": prom.interval_s, **export.to_json()}
            except promrun.PrometheusError as exc:
                errors.append(f"Prometheus export failed: {exc}")
            if opts.while_prometheus_runs is not None:
                try:
                    await asyncio.to_thread(opts.while_prometheus_runs, prom.url)
                except Exception as exc:  # reported with the run's other errors
                    errors.append(f"reading Prometheus failed: {exc!r}")
    finally:
        status.phase = "stopping the cluster"
        try:
            await asyncio.to_thread(lc.down, plan.dir)
        finally:
            if prom is not None:
                await asyncio.to_thread(prom.stop)
    await asyncio.to_thread(merge_transitions, plan, history)
    # Complete now: a clean stop writes each broker's last line.
    merged = await asyncio.to_thread(merge_permission_logs, plan, history)
    sampling = {"source": "broker permission-change logs", "events": merged}
    status.phase = "checking"
    loaded = read_history(history)
    report = check(loaded.events)
    groups = [g.group for g in plan.groups]
    rows = None
    if soak is not None and lab is not None:
        heals: dict[int, int] = {}
        for e in loaded.events:
            if isinstance(e, Restart):
                heals.setdefault(e.cycle, e.t)
        faults = {e.cycle: e.t for e in loaded.events
                  if isinstance(e, Fault) and e.kind in chaos.KINDS}
        for note in soak.notes:  # the fault and its heal on the history's clock
            note.update(fault_ns=faults.get(note["cycle"]), heal_ns=heals.get(note["cycle"]))
        rows = chaos.summarize(report, heals=heals, kinds=opts.kinds, skipped=lab.skipped,
                               incomplete=soak.incomplete)
    return DrillResult(
        report=report,
        history=history,
        directory=plan.dir,
        cycles_completed=completed,
        sampling=sampling,
        errors=errors,
        prometheus=exported,
        chain_history=[json.loads(d.to_json()) for d in chains] if ordered else None,
        chain_violations=history_violations(chains, groups) if ordered else [],
        chaos=rows,
        chaos_cycles=soak.notes if soak is not None else [],
        stopped_early=soak.stopped if soak is not None else None,
    )


# ------------------------------------------------------------------------ chaos soak


def mixed_options(opts: DrillOptions) -> DrillOptions:
    """``--faults mixed`` as the drill runs it: the cluster scenario's traffic (a topic
    over at least two groups, members per consumer group); refuses what it cannot do."""
    if opts.faults not in FAULT_MIXES:
        raise DrillError(f"unknown fault mix {opts.faults!r}: expected one of "
                         f"{', '.join(FAULT_MIXES)}")
    unknown = [k for k in opts.kinds if k not in chaos.KINDS]
    if unknown or not opts.kinds:
        raise DrillError(f"unknown fault kind(s) {', '.join(unknown) or '(none given)'}: "
                         f"expected some of {', '.join(chaos.KINDS)}")
    if opts.scenario not in ("failover", "cluster"):
        raise DrillError("--faults mixed runs the cluster scenario's traffic; "
                         f"--scenario {opts.scenario} cannot be mixed in")
    if opts.prometheus_interval_s is not None:
        raise DrillError("--faults mixed does not record with Prometheus (its brokers may "
                         "run in network namespaces)")
    return dataclasses.replace(opts, scenario="cluster", groups=max(2, opts.groups),
                               members=max(1, opts.members))


def run_mixed(opts: DrillOptions, *, status: Status | None = None) -> DrillResult:
    """The chaos soak (``--faults mixed``): build the lab its kinds need (network
    namespaces, small disks; :class:`chaosfaults.Lab` says which kinds cannot run here),
    run the drill from the clients' host, and remove the lab whatever happens."""
    opts = mixed_options(opts)
    if opts.cycles and not opts.coordinated:
        raise DrillError("failover cycles need a coordinated cluster")
    directory = opts.directory or Path(tempfile.mkdtemp(prefix="understudy-chaos-"))
    opts = dataclasses.replace(opts, directory=directory)
    names = itertools.count(1)
    shape = plan_cluster(directory=Path("."), groups=opts.groups, slaves=opts.slaves, sync=True,
                         port=lambda: next(names))
    lab = chaosfaults.Lab.open(
        kinds=opts.kinds, brokers=[b.name for g in shape.groups for b in g.brokers],
        masters=[g.master.name for g in shape.groups], zk_ensemble=opts.zk_ensemble,
        disk_bytes=opts.disk_bytes, use_netns=opts.netns)
    try:
        return lab.call(lambda: asyncio.run(run_drill(opts, status=status, lab=lab)))
    finally:
        try:
            lab.keep_data(directory)
        finally:
            leftovers = lab.close()
        if leftovers:
            log.warning("processes left in the chaos namespaces were killed: %s", leftovers)


@dataclass(slots=True)
class MixedRun:
    """What the soak's cycles did: how many completed, each cycle's notes, the cycles of
    each kind that did not complete, and why it stopped early (the time cap)."""

    completed: int = 0
    notes: list[dict[str, Any]] = field(default_factory=list)
    incomplete: dict[str, int] = field(default_factory=dict)
    stopped: str | None = None


async def _mixed_cycles(plan: ClusterPlan, watch: ModeWatch, writer: HistoryWriter,
                        status: Status, opts: DrillOptions, traffic: Traffic,
                        lab: chaosfaults.Lab, errors: list[str], *, started: float) -> MixedRun:
    """The soak's cycles: each the next (kind, group) of :func:`chaos.rotation` over the
    kinds that can run here, after every group is NORMAL with its master holding FULL. A
    cycle that fails is reported and everything healed; the soak goes on if the cluster
    comes back, else stops."""
    runnable = [k for k in opts.kinds if k not in lab.skipped]
    if not runnable:
        raise DrillError("no fault kind can run here: " + "; ".join(
            f"{k}: {why}" for k, why in lab.skipped.items()))
    schedule = chaos.rotation(runnable, [g.group for g in plan.groups], opts.cycles, opts.seed)
    by_name = {g.group: g for g in plan.groups}
    run = MixedRun()
    longest = 0.0
    session = zk_session(plan.zk_connect, timeout_s=5.0)
    zk = await asyncio.to_thread(session.__enter__)
    try:
        for n, (kind, name) in enumerate(schedule, start=1):
            reserve = opts.drain_timeout_s + 60 + longest  # drain, teardown and check
            if opts.max_seconds is not None and (time.monotonic() - started + reserve
                                                 > opts.max_seconds):
                run.stopped = (f"stopped after {n - 1} of {opts.cycles} cycles: the "
                               f"{opts.max_seconds / 60:g}-minute cap (the drain, teardown "
                               f"and check need up to ~{reserve:.0f} s more)")
                break
            status.cycle = n
            group = by_name[name]
            note: dict[str, Any] = {"cycle": n, "kind": kind, "group": name,
                                    "broker": group.master.name}
            begun = time.monotonic()
            try:
                await _mixed_cycle(n, kind, group, plan, watch, writer, status, opts, traffic,
                                   lab, zk, note)
                run.completed += 1
            except (DrillError, chaosfaults.FaultError) as exc:
                errors.append(f"cycle {n} ({kind} on {name}): {exc}")
                run.incomplete[kind] = run.incomplete.get(kind, 0) + 1
                note["error"] = str(exc)
                if not await _recover(plan, watch, lab, opts):
                    errors.append(f"after cycle {n} the cluster did not come back to NORMAL "
                                  "with every master holding FULL; the soak stopped there")
                    break
            finally:
                note["seconds"] = round(time.monotonic() - begun, 2)
                run.notes.append(note)
                longest = max(longest, time.monotonic() - begun)
            traffic.generation += 1  # consumers resume from committed offsets
    finally:
        await asyncio.to_thread(session.__exit__, None, None, None)
    return run


async def _mixed_cycle(n: int, kind: str, group: GroupConfig, plan: ClusterPlan,
                       watch: ModeWatch, writer: HistoryWriter, status: Status,
                       opts: DrillOptions, traffic: Traffic, lab: chaosfaults.Lab, zk: Any,
                       note: dict[str, Any]) -> None:
    def phase(msg: str) -> None:
        status.phase = msg

    for g in plan.groups:  # every group settled before the fault
        await chaosfaults.settled(plan, g.group, watch.wait, within_s=opts.cycle_timeout_s,
                                  phase=lambda msg: phase(f"cycle {n}: {msg}"))
    during = functools.partial(member_event, n, traffic, writer, status)
    if kind in FAULTS:
        await _cycle(n, plan, watch, writer, status, opts, during=during, kind=kind, group=group)
        await chaosfaults.settled(plan, group.group, watch.wait, within_s=opts.cycle_timeout_s,
                                  phase=lambda msg: phase(f"cycle {n}: {msg}"))
        return
    cycle = chaosfaults.Cycle(
        n=n, kind=kind, plan=plan, group=group, lab=lab, writer=writer, zk=zk,
        wait_mode=watch.wait, phase=phase, during=during,
        session_timeout_s=opts.session_timeout_ms / 1000, timeout_s=opts.cycle_timeout_s,
        dwell_s=opts.dwell_s, warmup_s=opts.warmup_s, notes=note)
    await chaosfaults.FAULTS[kind](cycle)


async def _recover(plan: ClusterPlan, watch: ModeWatch, lab: chaosfaults.Lab,
                   opts: DrillOptions) -> bool:
    """After a failed cycle: heal every path, give every disk its space back, start any
    ZooKeeper server and master that is down; whether every group is then NORMAL with
    its master holding FULL."""
    lab.heal_all()
    for node in plan.zk_nodes:
        with contextlib.suppress(lc.LocalError):  # already running
            await asyncio.to_thread(lc.start, plan.dir, node.name)
    await _revive_masters(plan)
    try:
        for g in plan.groups:
            await chaosfaults.settled(plan, g.group, watch.wait, within_s=60)
    except (DrillError, chaosfaults.FaultError):
        return False
    return True
