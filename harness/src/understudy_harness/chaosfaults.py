"""The chaos soak's faults beyond kill and hang, injected into a running local cluster.

Why this module exists: ``understudy drill --faults mixed`` (:mod:`understudy_harness.chaos`
picks the kind of each cycle) must hurt a cluster in every way the product claims to
survive, with the mechanisms the suite already trusts: network namespaces and cut paths
(:mod:`understudy_harness.netns`, the cluster placed with
:class:`~understudy_operator.local.plan.Placement`), a ZooKeeper ensemble whose leader is
killed (``local kill/start zkN``), and a broker data directory on a small tmpfs
(:class:`~understudy_harness.testing.SmallDisk`) that is filled until produce is refused.
Each kind has the shape of the drill's kill/hang cycle: record the ``fault``, inject it,
wait (bounded) for the outcome the design predicts, hold it while the member churn of the
cluster scenario runs, heal, record the ``restart`` (the heal), and return once the group
is NORMAL with its master holding FULL again. A bound missed raises :class:`FaultError`.

:class:`Lab` is where the soak runs: the hosts (a namespace per broker, one for ZooKeeper
and the controller, one for the drill's own clients) and the masters' small disks, or
neither; it says which kinds cannot run here and why, and removes all of it on close.

ZooKeeper session expiry is ZooKeeper's own recipe (its FAQ, "How do I expire a session
for testing?"): a second client opens the session with the same id and password and
closes it. The id is the owner of the master's ephemeral ``live`` node; the password is
what the server derives from the id (``ZooKeeperServer.generatePasswd``: 16 bytes of
``java.util.Random(id ^ 0xB3415C00)``, the same constant in every ZooKeeper release this
project runs, 3.8 included), reproduced by :func:`session_password`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from kazoo.client import KazooClient

from understudy_broker import protocol as p
from understudy_broker.client import BrokerError, Connection
from understudy_broker.model import Mode, Permission
from understudy_broker.zkclient import close_client
from understudy_broker.zklayout import BrokerStatus, GroupConfig, live_path, status_path
from understudy_harness import netns as namespaces
from understudy_harness.chaos import NETNS_KINDS
from understudy_harness.history import HistoryWriter
from understudy_harness.testing import SmallDisk, eventually
from understudy_harness.workload import Target, create_cluster_topic
from understudy_operator.local import cluster as lc
from understudy_operator.local.plan import CONTROLLER, ZOOKEEPER, ClusterPlan, Placement

T = TypeVar("T")

#: Lab hosts besides one per broker: ZooKeeper (every server) with the controller, and the
#: drill's own clients (traffic, watches).
ZK_HOST, CLIENT_HOST = "zk", "client"
#: Left free on a master's disk when it is filled; the probe's writes take the rest.
DISK_MARGIN = 256 << 10
PROBE_BODY = 4096
PROBE_BATCH = 16
_JAVA_MASK = (1 << 48) - 1
_ZK_SUPER_SECRET = 0xB3415C00


class FaultError(RuntimeError):
    """A fault's predicted outcome, or the group's return to NORMAL, missed its bound."""


# ------------------------------------------------------------------------- the lab


@dataclass
class Lab:
    """Where the soak's processes run and what can be broken there (see the module
    docstring). ``skipped``: kinds that cannot run here, with the reason."""

    net: namespaces.Network | None = None
    disks: dict[str, SmallDisk] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    disk_root: Path | None = None

    @classmethod
    def open(cls, *, kinds: Sequence[str], brokers: Sequence[str], masters: Sequence[str],
             zk_ensemble: int, disk_bytes: int, use_netns: bool = True) -> Lab:
        """Build what ``kinds`` need and say why any cannot run. Anything made is removed
        again if building the rest fails."""
        lab = cls()
        try:
            if any(k in NETNS_KINDS for k in kinds):
                reason = namespaces.unavailable() if use_netns else "run with --no-netns"
                if reason is None:
                    namespaces.remove_leftovers()
                    lab.net = namespaces.Network([ZK_HOST, *brokers, CLIENT_HOST]).start()
                else:
                    lab.skipped.update(dict.fromkeys(
                        (k for k in kinds if k in NETNS_KINDS),
                        f"needs the cluster in network namespaces: {reason}"))
            if "zk_leader_loss" in kinds and zk_ensemble < 3:
                lab.skipped["zk_leader_loss"] = ("needs a ZooKeeper ensemble (--zk-ensemble 3); "
                                                 f"this run has {zk_ensemble} server")
            if "disk_full" in kinds:
                lab._mount_disks(masters, disk_bytes)
        except BaseException:
            lab.close()
            raise
        return lab

    def _mount_disks(self, masters: Sequence[str], size: int) -> None:
        self.disk_root = Path(tempfile.mkdtemp(prefix="understudy-chaos-disks-"))
        try:
            for m in masters:
                disk = self.disks[m] = SmallDisk(self.disk_root / m)
                disk.mount(size)
        except PermissionError as exc:
            self.skipped["disk_full"] = f"needs a master's data directory on a tmpfs: {exc}"
            self._unmount_disks()

    def _unmount_disks(self) -> None:
        for disk in self.disks.values():
            disk.unmount()
        self.disks.clear()
        if self.disk_root is not None:
            shutil.rmtree(self.disk_root, ignore_errors=True)
            self.disk_root = None

    def placement(self, name: str) -> Placement:
        """For ``lc.up``: each broker on its host, ZooKeeper and the controller on
        :data:`ZK_HOST`; everything on 127.0.0.1 without namespaces."""
        if self.net is None:
            return Placement()
        host = self.net.host(ZK_HOST if name in (ZOOKEEPER, CONTROLLER) else name)
        return Placement(host.address, host.prefix)

    def data_dirs(self) -> dict[str, Path]:
        """For ``lc.up``: each master with a small disk keeps its data on it."""
        return {m: disk.path / "data" for m, disk in self.disks.items()}

    def call(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the clients' host (in a thread there), or here."""
        return fn() if self.net is None else self.net.call(CLIENT_HOST, fn)

    def give_space_back(self) -> None:
        for disk in self.disks.values():
            (disk.path / "ballast").unlink(missing_ok=True)

    def heal_all(self) -> None:
        """Every cut healed, every disk's space given back (after a failed cycle)."""
        if self.net is not None:
            self.net.heal_all()
        self.give_space_back()

    def keep_data(self, directory: Path) -> None:
        """Copy each small disk's data directory to where the cluster's other brokers keep
        theirs (``data/<master>``, a link to the disk until now), to read after the run."""
        for m in self.disks:
            link = directory / "data" / m
            if link.is_symlink():
                target = link.resolve()
                link.unlink()
                shutil.copytree(target, link, symlinks=True)

    def close(self) -> list[int]:
        """Remove the namespaces (with any process still inside them, by PID: returned)
        and unmount the disks."""
        leftovers: list[int] = []
        try:
            if self.net is not None:
                leftovers = self.net.close()
                self.net = None
        finally:
            self._unmount_disks()
        return leftovers


# ----------------------------------------------------------------------- a cycle


@dataclass
class Cycle:
    """One cycle of a kind other than kill and hang, and what it needs."""

    n: int
    kind: str
    plan: ClusterPlan
    group: GroupConfig
    lab: Lab
    writer: HistoryWriter
    zk: Any  # a started kazoo client on the cluster's chroot (blocking: used in threads)
    #: The drill's mode watch: ``wait(group, mode, within_s=)``.
    wait_mode: Callable[..., Awaitable[None]]
    phase: Callable[[str], None]
    during: Callable[[], Awaitable[None]] | None
    session_timeout_s: float
    timeout_s: float
    dwell_s: float
    warmup_s: float
    #: What the cycle saw, for the drill's JSON (``chaos_cycles``).
    notes: dict[str, Any] = field(default_factory=dict)

    @property
    def master(self) -> str:
        return self.group.master.name

    @property
    def slaves(self) -> list[str]:
        return [b.name for b in self.group.brokers if b.name != self.master]

    def fault(self) -> None:
        self.phase(f"cycle {self.n}: {self.kind} {self.master}")
        self.writer.fault(cycle=self.n, kind=self.kind, broker=self.master,
                          group=self.group.group)

    async def hold(self, since: float, at_least_s: float) -> None:
        """Run the member churn, then keep the fault until ``at_least_s`` after ``since``
        (and at least the dwell)."""
        if self.during is not None:
            await self.during()
        await asyncio.sleep(max(self.dwell_s, at_least_s - (time.monotonic() - since)))

    async def healed(self) -> None:
        """Record the heal, then wait for NORMAL and the master holding FULL."""
        self.writer.restart(cycle=self.n, broker=self.master, group=self.group.group)
        await settled(self.plan, self.group.group, self.wait_mode, within_s=self.timeout_s,
                      phase=lambda msg: self.phase(f"cycle {self.n}: {msg}"))

    async def until(self, cond: Callable[[], Any], what: str, within_s: float) -> Any:
        """:func:`~understudy_harness.testing.eventually` with a :class:`FaultError`."""
        self.phase(f"cycle {self.n}: waiting for {what}")
        try:
            return await eventually(cond, what, within_s, interval_s=0.05)
        except AssertionError as exc:
            raise FaultError(f"cycle {self.n} ({self.kind} {self.master}): {exc}") from None

    def status_of(self, broker: str) -> BrokerStatus | None:
        """The broker's published status (blocking)."""
        found = self.zk.exists(status_path(self.group.group, broker))
        if found is None:
            return None
        with contextlib.suppress(Exception):
            return BrokerStatus.from_json(self.zk.get(status_path(self.group.group, broker))[0])
        return None

    def session_of(self, broker: str) -> int | None:
        """The session that owns ``broker``'s ``live`` node (blocking); None if none."""
        stat = self.zk.exists(live_path(self.group.group, broker))
        return None if stat is None else int(stat.ephemeralOwner)


async def settled(plan: ClusterPlan, group: str, wait_mode: Callable[..., Awaitable[None]],
                  *, within_s: float, phase: Callable[[str], None] = lambda _m: None) -> None:
    """Wait for ``group`` NORMAL with its master holding FULL (each bounded)."""
    phase(f"waiting for {group} NORMAL")
    await wait_mode(group, Mode.NORMAL, within_s=within_s)
    phase(f"waiting for {group}'s master to hold FULL")
    try:
        await asyncio.to_thread(lc.wait_master_holds, plan, group, Permission.FULL,
                                deadline=time.monotonic() + within_s)
    except lc.LocalError as exc:
        raise FaultError(str(exc)) from None


async def begin(c: Cycle) -> None:
    c.phase(f"cycle {c.n}: steady")
    await asyncio.sleep(c.warmup_s)


# ---------------------------------------------------------------- the fault kinds


def session_password(session_id: int) -> bytes:
    """The password ZooKeeper gives session ``session_id`` (see the module docstring)."""
    seed = ((session_id ^ _ZK_SUPER_SECRET) ^ 0x5DEECE66D) & _JAVA_MASK
    out = bytearray()
    while len(out) < 16:
        seed = (seed * 0x5DEECE66D + 0xB) & _JAVA_MASK
        word = seed >> 16  # java.util.Random.next(32)
        for _ in range(min(16 - len(out), 4)):
            out.append(word & 0xFF)
            word >>= 8
    return bytes(out)


def expire_session(hosts: str, session_id: int, *, timeout_s: float) -> None:
    """Expire ZooKeeper session ``session_id``: open it from here and close it (blocking).
    Its owner's next request is answered SESSION_EXPIRED and its ephemeral nodes are
    gone at once."""
    client = KazooClient(hosts=hosts, timeout=timeout_s,
                         client_id=(session_id, session_password(session_id)))
    try:
        client.start(timeout=10)
    finally:
        close_client(client)  # closing the session from here is what expires it


async def zk_expiry(c: Cycle) -> None:
    """Expire the master's ZooKeeper session. Predicted: it registers again under a new
    session (a failover may run meanwhile: the controller sees its node gone)."""
    await begin(c)
    sid = await asyncio.to_thread(c.session_of, c.master)
    if sid is None:
        raise FaultError(f"cycle {c.n}: {c.master} has no live node before the fault")
    c.fault()
    started = time.monotonic()
    await asyncio.to_thread(expire_session, c.plan.zk_hosts, sid,
                            timeout_s=c.session_timeout_s)
    new = await c.until(lambda: asyncio.to_thread(
        lambda: (s := c.session_of(c.master)) not in (None, sid) and s),
        f"{c.master} to register under a new session", 3 * c.session_timeout_s + 10)
    c.notes.update(expired_session=hex(sid), new_session=hex(new),
                   registered_again_ms=round((time.monotonic() - started) * 1000, 1))
    await c.hold(started, 0.0)
    await c.healed()


def _cuts(c: Cycle) -> list[tuple[str, str]]:
    if c.kind == "partition_master_zk":
        return [(c.master, ZK_HOST)]
    if c.kind == "partition_master_slave":
        return [(c.master, s) for s in c.slaves]
    return [(c.master, ZK_HOST), *((c.master, s) for s in c.slaves)]  # island_master


async def partition(c: Cycle) -> None:
    """Cut the master from ZooKeeper, from its slaves, or from both (an island: the
    clients still reach it), for the session timeout plus 1.5 s. Predicted (docs/
    partitions.md): from ZooKeeper, its session expires and nothing switches; from its
    slaves, the slaves report the link down and nothing switches; an island, the slave
    takes reads (SLAVE_CONSUME)."""
    net = c.lab.net
    if net is None:  # the drill skips these kinds without namespaces
        raise FaultError(f"cycle {c.n}: {c.kind} needs network namespaces")
    await begin(c)
    cuts = _cuts(c)
    c.fault()
    started = time.monotonic()
    for a, b in cuts:
        net.cut(a, b)
    c.notes["cut"] = [f"{a}-{b}" for a, b in cuts]
    try:
        if c.kind == "partition_master_zk":
            await c.until(lambda: _gone(c), f"{c.master}'s session to expire",
                          c.session_timeout_s + 5)
        elif c.kind == "partition_master_slave":
            await c.until(lambda: asyncio.to_thread(_links_down, c),
                          "the slaves to report their master link down", 10)
        else:
            await c.wait_mode(c.group.group, Mode.SLAVE_CONSUME, within_s=c.timeout_s)
        c.notes["outcome_ms"] = round((time.monotonic() - started) * 1000, 1)
        await c.hold(started, c.session_timeout_s + 1.5)
    finally:
        for a, b in cuts:
            net.heal(a, b)
    await c.healed()


async def _gone(c: Cycle) -> bool:
    return await asyncio.to_thread(c.session_of, c.master) is None


def _links_down(c: Cycle) -> bool:
    return all((st := c.status_of(s)) is not None and not st.master_link for s in c.slaves)


async def zk_leader_loss(c: Cycle) -> None:
    """``kill -9`` the ZooKeeper ensemble's leader, then start it again. Predicted
    (docs/local-and-drill.md): another server leads within about a second, sessions move
    to a surviving server, nothing switches."""
    await begin(c)
    leader = await asyncio.to_thread(_leader, c.plan)
    if leader is None:
        raise FaultError(f"cycle {c.n}: the ZooKeeper ensemble has no leader before the fault")
    c.fault()
    started = time.monotonic()
    await asyncio.to_thread(lc.kill, c.plan.dir, leader)
    new = await c.until(lambda: asyncio.to_thread(
        lambda: (got := _leader(c.plan)) not in (None, leader) and got),
        f"a ZooKeeper leader other than {leader}", 20)
    c.notes.update(killed=leader, new_leader=new,
                   elected_ms=round((time.monotonic() - started) * 1000, 1))
    await c.hold(started, 0.0)
    c.phase(f"cycle {c.n}: starting {leader} again")
    try:
        await asyncio.to_thread(lc.start, c.plan.dir, leader, timeout=c.timeout_s)
    except lc.LocalError as exc:
        raise FaultError(f"cycle {c.n}: {leader} did not start again: {exc}") from None
    await c.until(lambda: asyncio.to_thread(_serves, c.plan, leader),
                  f"{leader} to serve again", c.timeout_s)
    await c.healed()


def _leader(plan: ClusterPlan) -> str | None:
    return next((z.name for z in lc.status(plan.dir).zk_nodes if z.mode == "leader"), None)


def _serves(plan: ClusterPlan, name: str) -> bool:
    return any(z.name == name and z.mode is not None for z in lc.status(plan.dir).zk_nodes)


async def disk_full(c: Cycle) -> None:
    """Fill the master's data disk (a tmpfs) until a produce to it is refused with
    STORAGE_FULL, hold it full, then give the space back and wait until a produce is
    stored again. Predicted (docs/broker.md, "A full disk"): nothing stored by a refused
    produce, the broker stays up and serves reads, producers send to the other group."""
    disk = c.lab.disks.get(c.master)
    if disk is None:
        raise FaultError(f"cycle {c.n}: {c.master} has no small disk")
    topic = f"chaos-probe-{c.group.group}"
    bootstrap = tuple(c.plan.bootstrap(c.group.group))
    await create_cluster_topic(Target(label=topic, topic=topic, bootstrap=bootstrap,
                                      groups=(c.group.group,),
                                      security=lc.client_security(c.plan)), 1)
    await begin(c)
    conn = await Connection.open(c.plan.address(c.master), security=lc.client_security(c.plan))
    try:
        c.fault()
        started = time.monotonic()
        ballast = disk.path / "ballast"
        _fill(ballast, disk.free_bytes() - DISK_MARGIN)
        refused = await c.until(lambda: _probe(conn, topic, "STORAGE_FULL"),
                                "a produce refused with STORAGE_FULL", 30)
        c.notes.update(full_ms=round((time.monotonic() - started) * 1000, 1),
                       refusal=refused)
        try:
            await c.hold(started, 0.0)
        finally:
            ballast.unlink(missing_ok=True)
        returned = time.monotonic()
        await c.until(lambda: _probe(conn, topic, "OK"),
                      "a produce stored after the space came back", 30)
        c.notes["stored_again_ms"] = round((time.monotonic() - returned) * 1000, 1)
    finally:
        (disk.path / "ballast").unlink(missing_ok=True)
        await conn.close()
    await c.healed()


def _fill(path: Path, size: int) -> None:
    """A file of ``size`` bytes (at most what fits) taking real blocks."""
    fd = os.open(path, os.O_CREAT | os.O_WRONLY, 0o600)
    try:
        while size > 0:
            try:
                os.posix_fallocate(fd, 0, size)
                return
            except OSError:
                size -= DISK_MARGIN  # the broker wrote meanwhile: a little less
    finally:
        os.close(fd)


async def _probe(conn: Connection, topic: str, want: str) -> str | None:
    """One probe produce (not part of the judged traffic): its answer's status name if it
    is ``want``, else None."""
    msgs = [p.ProduceMessage(0, None, b"p" * PROBE_BODY) for _ in range(PROBE_BATCH)]
    try:
        await conn.request(p.Op.PRODUCE, p.ProduceRequest(topic, msgs).encode(), timeout_s=5)
        got = "OK"
    except BrokerError as exc:
        got = f"{p.Status(exc.status).name}: {exc.message}"
    except (ConnectionError, TimeoutError) as exc:
        got = f"{type(exc).__name__}"
    return got if got.split(":")[0] == want else None


#: The kinds this module injects, by name (kill and hang are the drill's own cycle).
FAULTS: dict[str, Callable[[Cycle], Awaitable[None]]] = {
    "zk_expiry": zk_expiry,
    "partition_master_zk": partition,
    "partition_master_slave": partition,
    "island_master": partition,
    "zk_leader_loss": zk_leader_loss,
    "disk_full": disk_full,
}

