"""A broker group as containers, its faults, and one history judged by the shared checker.

Why this module exists: the container suite (``make e2e-containers``, docs/containers.md)
runs the product the way a user runs the images — ZooKeeper, a master, its slaves and the
failover controller, each a container on podman networks — and hurts it the way containers
are hurt: ``podman kill`` (SIGKILL of PID 1), ``podman pause`` past the session timeout,
the master disconnected from every network (an island with no clients), the master
disconnected from ZooKeeper's network only, and a restart of the master's container on the
same data directory. The drill's traffic (:class:`~understudy_harness.workload.Traffic`)
runs on the host and reaches the brokers on their network; the verdict comes from
:func:`understudy_harness.checker.check` over one history merged exactly as the kind suite
merges it (:mod:`.permevents`, :mod:`.workload_history`), with modes from the controller's
transition journal as the drill takes them.

Layout (pure, :func:`plan_layout`): two networks — ``data`` (brokers and the host's
clients; the addresses in the group config) and ``zk`` (ZooKeeper, the controller and
every broker) — with fixed addresses, so the group config can be written before anything
starts. Each broker's ``/data`` and the controller's journal folder are host directories
(owned by the images' uid), which is how the host reads the permission-change logs and
the transitions after the run. Brokers take the same argv as ``understudy local up``
gives them (:func:`understudy_operator.local.plan.broker_process`), with ``/data`` and
``0.0.0.0`` in place of the host's paths and address.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import os
import shutil
import socket
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from ipaddress import IPv4Network
from pathlib import Path
from typing import Any, Final

from understudy_broker.ha.permlog import FILE_NAME, read_changes
from understudy_broker.model import Mode, Permission
from understudy_broker.zklayout import DEFAULT_CHROOT, GroupConfig, live_path
from understudy_harness.checker import Report, check
from understudy_harness.containers import (
    BROKER_IMAGE,
    IMAGE_UID,
    OPERATOR_IMAGE,
    ZOOKEEPER_IMAGE,
    Attach,
    ContainerError,
    ContainerSpec,
    Mount,
    Podman,
    free_subnets,
    host_address,
)
from understudy_harness.drill import DrillError, ModeWatch, Status, traffic_targets
from understudy_harness.history import (
    Event,
    Fault,
    HistoryWriter,
    ModeChange,
    iter_jsonl,
    read_history,
)
from understudy_harness.permevents import broker_perm_events
from understudy_harness.testing import zk_session
from understudy_harness.workload import CONSUMER_GROUPS, Traffic
from understudy_harness.workload_history import merge_events
from understudy_operator.controller.journal import read_transitions
from understudy_operator.local import cluster as lc
from understudy_operator.local.plan import (
    ClusterPlan,
    Placement,
    ZkNode,
    broker_process,
    plan_cluster,
    transitions_log,
    understudy_argv,
)
from understudy_operator.zk import ZkGateway, with_gateway

log = logging.getLogger(__name__)

#: The fault kinds, in the order a run injects them.
FAULTS: Final = ("kill-9", "pause", "island", "zk-partition", "restart")
GROUP: Final = "g1"
ZK_PORT: Final = 2181
BROKER_PORTS: Final = (9876, 10912, 9100)  # client, replication, HTTP (the image's)
CONTROLLER_HTTP_PORT: Final = 8080
#: The private ZooKeeper's tick, as ``understudy local up`` runs it (cluster.ZK_TICK_MS).
ZK_TICK_MS: Final = 200
ZOO_CFG: Final = """tickTime={tick}
dataDir=/data
clientPort={port}
clientPortAddress=0.0.0.0
minSessionTimeout=1000
maxSessionTimeout=10000
4lw.commands.whitelist=ruok,srvr,stat,mntr,cons
admin.enableServer=false
"""
LOG4J: Final = """log4j.rootLogger=INFO, CONSOLE
log4j.appender.CONSOLE=org.apache.log4j.ConsoleAppender
log4j.appender.CONSOLE.layout=org.apache.log4j.PatternLayout
log4j.appender.CONSOLE.layout.ConversionPattern=%d{ISO8601} [%t] %-5p %c{1} - %m%n
"""


# ------------------------------------------------------------------------ the layout


@dataclass(frozen=True, slots=True)
class GroupLayout:
    """Every decision of a run, before anything starts (see the module docstring)."""

    directory: Path
    data_subnet: IPv4Network
    zk_subnet: IPv4Network
    group: GroupConfig
    zk_ip: str
    controller_ip: str
    #: Each broker's address on the ZooKeeper network.
    broker_zk_ips: dict[str, str]
    #: Each broker's ``understudy broker`` arguments (the image's entrypoint is
    #: ``understudy``).
    broker_args: dict[str, tuple[str, ...]]
    session_timeout_ms: int
    chroot: str = DEFAULT_CHROOT

    @property
    def zk_connect(self) -> str:
        return f"{self.zk_ip}:{ZK_PORT}{self.chroot}"

    @property
    def brokers(self) -> list[str]:
        return [b.name for b in self.group.brokers]

    @property
    def master(self) -> str:
        return self.group.master.name

    def data_ip(self, broker: str) -> str:
        return self.group.broker(broker).host

    def data_dir(self, broker: str) -> Path:
        return self.directory / "data" / broker

    @property
    def journal(self) -> Path:
        return transitions_log(self.directory)

    def plan(self) -> ClusterPlan:
        """The group as a local cluster plan, for what reads ZooKeeper or the bootstrap
        list from one (the drill's mode watch and traffic targets, ``local``'s waits)."""
        return ClusterPlan(dir=self.directory, zk_nodes=(ZkNode(0, ZK_PORT, host=self.zk_ip),),
                           groups=(self.group,), processes=(), chroot=self.chroot,
                           session_timeout_ms=self.session_timeout_ms)

    def broker_spec(self, broker: str, *, data_net: str, zk_net: str) -> ContainerSpec:
        return ContainerSpec(
            name=broker, image=BROKER_IMAGE,
            attach=(Attach(data_net, self.data_ip(broker)),
                    Attach(zk_net, self.broker_zk_ips[broker])),
            command=self.broker_args[broker],
            mounts=(Mount(self.data_dir(broker), "/data"),), tmpfs=("/tmp",),
            labels={"understudy.run": self.directory.name, "understudy.broker": broker})

    def zookeeper_spec(self, *, zk_net: str) -> ContainerSpec:
        return ContainerSpec(
            name="zookeeper", image=ZOOKEEPER_IMAGE, attach=(Attach(zk_net, self.zk_ip),),
            mounts=(Mount(self.directory / "zookeeper", "/conf", read_only=True),),
            tmpfs=("/data", "/tmp"), user=f"{IMAGE_UID}:{IMAGE_UID}",
            labels={"understudy.run": self.directory.name})

    def controller_spec(self, *, zk_net: str) -> ContainerSpec:
        """The failover controller from the operator image: ZooKeeper signals only (no
        process table to read from another container), its journal on the host."""
        return ContainerSpec(
            name="controller", image=OPERATOR_IMAGE,
            attach=(Attach(zk_net, self.controller_ip),),
            command=("controller", "--zk", self.zk_connect, "--group", self.group.group,
                     "--liveness", "none", "--http-port", str(CONTROLLER_HTTP_PORT),
                     "--http-host", "0.0.0.0",
                     "--transitions-log", f"/journal/{self.journal.name}"),
            mounts=(Mount(self.journal.parent, "/journal"),), tmpfs=("/tmp",),
            labels={"understudy.run": self.directory.name})


def container_broker_args(argv: Sequence[str]) -> tuple[str, ...]:
    """A local broker's argv (:func:`broker_process`) for the image: without the host's
    interpreter prefix, ``/data`` for the data directory and ``0.0.0.0`` to listen on
    (the group config in ZooKeeper holds the address the broker is reached at). Pure."""
    prefix = understudy_argv()
    args = list(argv[len(prefix):]) if list(argv[:len(prefix)]) == prefix else list(argv)
    for flag, value in (("--data-dir", "/data"), ("--host", "0.0.0.0")):
        i = args.index(flag)
        args[i + 1] = value
    return tuple(args)


def plan_layout(directory: Path, *, slaves: int, data_subnet: IPv4Network,
                zk_subnet: IPv4Network, session_timeout_ms: int = 2000) -> GroupLayout:
    """Names, addresses and argv of a one-group run (``g1-0`` master, ``g1-1``.. slaves),
    planned as ``understudy local up`` plans a cluster. Pure."""
    names = [f"{GROUP}-{i}" for i in range(slaves + 1)]
    data_ips = {n: host_address(data_subnet, i) for i, n in enumerate(names)}
    zk_ips = {n: host_address(zk_subnet, 2 + i) for i, n in enumerate(names)}
    ports = itertools.cycle(BROKER_PORTS)
    zk_ip = host_address(zk_subnet, 0)
    plan = plan_cluster(directory=directory, groups=1, slaves=slaves, sync=True,
                        port=lambda: next(ports), zk_nodes=(ZkNode(0, ZK_PORT, host=zk_ip),),
                        session_timeout_ms=session_timeout_ms,
                        placement=lambda name: Placement(host=data_ips.get(name, "127.0.0.1")))
    (group,) = plan.groups
    args = {b.name: container_broker_args(
        broker_process(group, b, directory=directory, zk_connect=plan.zk_connect).argv)
        for b in group.brokers}
    return GroupLayout(directory=directory, data_subnet=data_subnet, zk_subnet=zk_subnet,
                       group=group, zk_ip=zk_ip, controller_ip=host_address(zk_subnet, 1),
                       broker_zk_ips=zk_ips, broker_args=args,
                       session_timeout_ms=session_timeout_ms)


# --------------------------------------------------------------------- the running group


@dataclass
class RunningGroup:
    """The containers of a run and what it takes to hurt and heal them."""

    layout: GroupLayout
    podman: Podman
    data_net: str
    zk_net: str
    ids: dict[str, str] = field(default_factory=dict)  # name -> container ID

    def broker_spec(self, broker: str) -> ContainerSpec:
        return self.layout.broker_spec(broker, data_net=self.data_net, zk_net=self.zk_net)

    def start(self, name: str, spec: ContainerSpec) -> str:
        self.ids[name] = self.podman.start_container(spec)
        return self.ids[name]

    def logs(self) -> str:
        return "\n".join(f"--- {name}\n{self.podman.logs(cid)}" for name, cid in self.ids.items())


def prepare_directory(layout: GroupLayout) -> None:
    """The host folders the containers mount: a data folder per broker and the journal's
    (owned by the images' uid), and ZooKeeper's configuration."""
    for broker in layout.brokers:
        layout.data_dir(broker).mkdir(parents=True, exist_ok=True)
        os.chown(layout.data_dir(broker), IMAGE_UID, IMAGE_UID)
    layout.journal.parent.mkdir(parents=True, exist_ok=True)
    os.chown(layout.journal.parent, IMAGE_UID, IMAGE_UID)
    conf = layout.directory / "zookeeper"
    conf.mkdir(parents=True, exist_ok=True)
    (conf / "zoo.cfg").write_text(ZOO_CFG.format(tick=ZK_TICK_MS, port=ZK_PORT))
    (conf / "log4j.properties").write_text(LOG4J)


def ruok(host: str, port: int, timeout: float = 1.0) -> bool:
    """ZooKeeper's ``ruok`` four-letter command answered ``imok``."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            s.sendall(b"ruok")
            return s.recv(16) == b"imok"
    except OSError:
        return False


def healthy(host: str) -> bool:
    """A broker at ``host`` answers ``/healthz`` on the image's HTTP port."""
    return lc.http_get(BROKER_PORTS[2], "/healthz", host=host) is not None


def wait_for(what: str, cond: Callable[[], bool], *, timeout: float,
             interval: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise ContainerError(f"{what}: not within {timeout:g}s")
        time.sleep(interval)


def start_group(pm: Podman, directory: Path, *, slaves: int,
                session_timeout_ms: int = 2000, timeout: float = 120) -> RunningGroup:
    """Networks, ZooKeeper, the group config, the brokers, the controller; returns once the
    group is NORMAL and its master reads (blocking). What it created is :class:`Podman`'s
    to remove."""
    data_subnet, zk_subnet = free_subnets(pm.used_subnets(), 2,
                                          start=uuid.uuid4().int % 200)
    layout = plan_layout(directory, slaves=slaves, data_subnet=data_subnet,
                         zk_subnet=zk_subnet, session_timeout_ms=session_timeout_ms)
    prepare_directory(layout)
    group = RunningGroup(layout, pm, data_net=pm.network_create("data", data_subnet),
                         zk_net=pm.network_create("zk", zk_subnet))
    group.start("zookeeper", layout.zookeeper_spec(zk_net=group.zk_net))
    wait_for("ZooKeeper answers ruok", lambda: ruok(layout.zk_ip, ZK_PORT), timeout=timeout)
    write_group_config(layout)
    for broker in layout.brokers:
        group.start(broker, group.broker_spec(broker))
    for broker in layout.brokers:
        wait_for(f"{broker} answers /healthz", functools.partial(healthy, layout.data_ip(broker)),
                 timeout=timeout)
    group.start("controller", layout.controller_spec(zk_net=group.zk_net))
    plan = layout.plan()
    deadline = time.monotonic() + timeout
    lc.wait_mode(plan, GROUP, "NORMAL", deadline=deadline)
    lc.wait_master_reads(plan, GROUP, deadline=deadline)
    return group


def write_group_config(layout: GroupLayout) -> None:
    """The chroot and the group config in ZooKeeper, as ``understudy local up`` writes them."""

    async def chroot(zk: ZkGateway) -> None:
        await zk.ensure_path(layout.chroot)

    async def config(zk: ZkGateway) -> None:
        await zk.write_config(layout.group.group, layout.group.to_json())

    hosts = f"{layout.zk_ip}:{ZK_PORT}"
    with_gateway(hosts, chroot, timeout_s=10)
    with_gateway(layout.zk_connect, config, timeout_s=10)


# ------------------------------------------------------------------------ the faults


@dataclass(frozen=True, slots=True)
class SuiteOptions:
    faults: tuple[str, ...] = FAULTS
    slaves: int = 1
    rate: float = 100.0  # messages per second
    queues: int = 4
    warmup_s: float = 2.0
    dwell_s: float = 2.0
    cycle_timeout_s: float = 60.0
    drain_timeout_s: float = 60.0
    session_timeout_ms: int = 2000
    stop_timeout_s: int = 10


@dataclass
class SuiteResult:
    report: Report
    history: Path
    directory: Path
    cycles_completed: int
    drained: bool
    errors: list[str]
    notes: list[dict[str, Any]]
    perm_events: int

    @property
    def ok(self) -> bool:
        return self.report.ok and self.drained and not self.errors


async def _settled(group: RunningGroup, watch: ModeWatch, within_s: float) -> None:
    layout = group.layout
    await watch.wait(GROUP, Mode.NORMAL, within_s=within_s)
    try:
        await asyncio.to_thread(lc.wait_master_holds, layout.plan(), GROUP, Permission.FULL,
                                deadline=time.monotonic() + within_s)
    except lc.LocalError as exc:
        raise DrillError(str(exc)) from None


async def _session_gone(zk: Any, broker: str, within_s: float) -> None:
    deadline = time.monotonic() + within_s
    while await asyncio.to_thread(zk.exists, live_path(GROUP, broker)) is not None:
        if time.monotonic() > deadline:
            raise DrillError(f"{broker}'s ZooKeeper session did not expire within {within_s:g}s")
        await asyncio.sleep(0.05)


async def fault_cycle(n: int, kind: str, group: RunningGroup, watch: ModeWatch,
                      writer: HistoryWriter, status: Status, opts: SuiteOptions, zk: Any,
                      note: dict[str, Any]) -> None:
    """One cycle: the group settled, warm-up, the fault on the master, its predicted
    outcome (slave-consume; for a cut from ZooKeeper only, the master's session expiring),
    held past the session timeout, healed, then NORMAL with the master holding FULL."""
    layout, pm = group.layout, group.podman
    master = layout.master
    status.phase = f"cycle {n}: settling"
    await _settled(group, watch, opts.cycle_timeout_s)
    status.phase = f"cycle {n}: steady"
    await asyncio.sleep(opts.warmup_s)
    cid = group.ids[master]
    session_s = opts.session_timeout_ms / 1000
    status.phase = f"cycle {n}: {kind} {master}"
    writer.fault(cycle=n, kind=kind, broker=master, group=GROUP)
    began = time.monotonic()

    async def slave_consume() -> None:
        await watch.wait(GROUP, Mode.SLAVE_CONSUME, within_s=opts.cycle_timeout_s)
        note["slave_consume_ms"] = round((time.monotonic() - began) * 1000, 1)

    async def hold(at_least_s: float) -> None:
        await asyncio.sleep(max(opts.dwell_s, at_least_s - (time.monotonic() - began)))

    if kind == "kill-9":
        await asyncio.to_thread(pm.kill, cid, "KILL")
        await slave_consume()
        await hold(0)
        await asyncio.to_thread(pm.start, cid)
    elif kind == "pause":
        await asyncio.to_thread(pm.pause, cid)
        try:
            await slave_consume()
            await hold(session_s + 0.5)  # frozen past its session: it wakes up as master
        finally:
            await asyncio.to_thread(pm.unpause, cid)
    elif kind in ("island", "zk-partition"):
        nets = [group.zk_net] if kind == "zk-partition" else [group.data_net, group.zk_net]
        ips = {group.data_net: layout.data_ip(master),
               group.zk_net: layout.broker_zk_ips[master]}
        for net in nets:
            await asyncio.to_thread(pm.disconnect, net, cid)
        try:
            if kind == "island":
                await slave_consume()
            else:  # docs/partitions.md: the session expires; the slave still replicates
                await _session_gone(zk, master, session_s + 10)
                note["session_expired_ms"] = round((time.monotonic() - began) * 1000, 1)
            await hold(session_s + 1.5)
        finally:
            for net in nets:
                await asyncio.to_thread(pm.connect, net, cid, ips[net])
        note["failover"] = watch.mode(GROUP) is not Mode.NORMAL or "slave_consume_ms" in note
    elif kind == "restart":
        took = await asyncio.to_thread(pm.stop, cid, opts.stop_timeout_s)
        note["stop_s"] = round(took, 2)
        note["exit_code"] = (await asyncio.to_thread(pm.inspect, cid)).exit_code
        await asyncio.to_thread(pm.remove, cid)
        await slave_consume()
        await hold(0)
        group.ids[master] = await asyncio.to_thread(
            pm.start_container, group.broker_spec(master))
    else:
        raise DrillError(f"unknown fault kind {kind!r}: expected one of {', '.join(FAULTS)}")
    writer.restart(cycle=n, broker=master, group=GROUP)
    status.phase = f"cycle {n}: waiting for NORMAL"
    await _settled(group, watch, opts.cycle_timeout_s)
    note["normal_again_s"] = round(time.monotonic() - began, 2)


async def drive(group: RunningGroup, history: Path, opts: SuiteOptions,
                status: Status) -> tuple[int, bool, list[str], list[dict[str, Any]]]:
    """The traffic through every fault cycle, then the drain: (cycles completed, drained,
    errors, notes per cycle)."""
    plan = group.layout.plan()
    errors: list[str] = []
    notes: list[dict[str, Any]] = []
    completed = 0
    drained = False
    with HistoryWriter(history, clock=time.time_ns, clock_name="time_ns") as writer:
        watch = await ModeWatch.open(plan)
        traffic = Traffic(traffic_targets(plan), writer, status, rate=opts.rate,
                          queues=opts.queues, consumer_groups=CONSUMER_GROUPS,
                          session_timeout_ms=opts.session_timeout_ms)
        session = zk_session(plan.zk_connect, timeout_s=5.0)
        zk = await asyncio.to_thread(session.__enter__)
        try:
            await traffic.start()
            await asyncio.sleep(opts.warmup_s)
            for n, kind in enumerate(opts.faults, start=1):
                status.cycle = n
                note: dict[str, Any] = {"cycle": n, "kind": kind, "broker": group.layout.master}
                notes.append(note)
                try:
                    await fault_cycle(n, kind, group, watch, writer, status, opts, zk, note)
                except (DrillError, ContainerError) as exc:
                    errors.append(f"cycle {n} ({kind}): {exc}")
                    note["error"] = str(exc)
                    break
                completed = n
                traffic.generation += 1  # consumers resume from committed offsets
            status.phase = "draining"
            drained = await traffic.finish(drain_timeout=opts.drain_timeout_s)
            if not drained:
                errors.append(f"drain did not complete within {opts.drain_timeout_s:.0f}s")
        finally:
            await traffic.shutdown()
            await asyncio.to_thread(session.__exit__, None, None, None)
            await watch.close()
    return completed, drained, errors, notes


def stop_group(group: RunningGroup, timeout_s: int = 10) -> None:
    """Stop the controller, then the brokers, then ZooKeeper (SIGTERM): each broker writes
    its last permission line, the controller closes its journal."""
    order = ["controller", *group.layout.brokers, "zookeeper"]
    for name in order:
        cid = group.ids.get(name)
        if cid is not None:
            with contextlib.suppress(ContainerError):
                group.podman.stop(cid, timeout_s)


def merged_history(layout: GroupLayout, history: Path) -> tuple[list[Event], int]:
    """The run's events (workload, faults, heals) with the controller's transitions as
    ``mode`` events and every broker's permission-change log as ``perm`` events (READ of a
    ``kill-9``ed incarnation ended at the kill, as the kind suite does: the broker is PID 1
    in every container); in time order. Returns the events and how many ``perm`` ones."""
    own = read_history(history).events
    faults = [e for e in own if isinstance(e, Fault)]
    modes = [ModeChange(t.t_ns, t.group, t.mode, t.epoch) for t in read_transitions(layout.journal)]
    perms: list[Event] = []
    for b in layout.group.brokers:
        changes = list(read_changes(layout.data_dir(b.name) / FILE_NAME))
        perms.extend(broker_perm_events(group=GROUP, broker=b.name, role=b.role.value,
                                        changes=changes, faults=faults))
    return merge_events(own, modes, perms), len(perms)


def run_suite(pm: Podman, directory: Path, opts: SuiteOptions,
              status: Status | None = None) -> SuiteResult:
    """Start the group, drive it through ``opts.faults``, stop it, merge and check."""
    status = status or Status()
    group = start_group(pm, directory, slaves=opts.slaves,
                        session_timeout_ms=opts.session_timeout_ms)
    history = directory / "history.jsonl"
    try:
        completed, drained, errors, notes = asyncio.run(drive(group, history, opts, status))
    except BaseException:
        log.error("container logs:\n%s", group.logs())
        raise
    finally:
        stop_group(group, opts.stop_timeout_s)
    if errors:
        log.error("container logs:\n%s", group.logs())
    events, perms = merged_history(group.layout, history)
    merged = directory / "history-merged.jsonl"
    merged.write_text("".join(line + "\n" for line in iter_jsonl(events)))
    return SuiteResult(report=check(events), history=merged, directory=directory,
                       cycles_completed=completed, drained=drained, errors=errors,
                       notes=notes, perm_events=perms)


def remove_directory(directory: Path) -> None:
    """Remove a run's host folder (its files belong to the images' uid)."""
    shutil.rmtree(directory, ignore_errors=True)
