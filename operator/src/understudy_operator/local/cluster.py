"""The local-cluster supervisor: carry out a :class:`~.plan.ClusterPlan` on this machine.

Why this module exists: ``understudy local ...`` and the drill need a real cluster —
a private ZooKeeper, broker processes, the failover controller — that they can start,
inspect, wound and stop without Kubernetes. Each subcommand is a separate process, so
everything this module knows lives in the state directory (``cluster.json`` and the pid
files) and in ZooKeeper; nothing is kept in memory between commands.

Status comes from ZooKeeper (``/groups/<g>/state`` and each broker's ``status`` node) and
the pid table; a running broker that has published no ZooKeeper status yet is asked for its
``/metrics`` instead. ZooKeeper is one server, or an ensemble (``zk_ensemble=3``: servers
``zk1..zk3``, each its own process, killed and started one by one like a broker); each
server's mode (leader, follower) comes from its ``srvr`` answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import secrets
import shutil
import signal
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TypeVar

from understudy_broker import metric_names
from understudy_broker.acl import make_user
from understudy_broker.model import GroupState, Permission
from understudy_broker.security import ClientSecurity
from understudy_broker.zklayout import (
    BrokerStatus,
    FailoverPolicy,
    ReplicationPolicy,
    acl_user_path,
    status_path,
)
from understudy_operator.controller.observe import Observation
from understudy_operator.k8s import certs
from understudy_operator.local import procs
from understudy_operator.local.plan import (
    ADMIN_USER,
    BROKER_USER,
    CONTROLLER,
    HOST,
    STATE_FILE,
    ZOOKEEPER,
    ClusterPlan,
    Placer,
    PlanError,
    ProcessPlan,
    ZkNode,
    on_loopback,
    plan_cluster,
)
from understudy_operator.local.ports import free_port
from understudy_operator.local.zkserver import (
    ZooKeeperEnsemble,
    ZooKeeperServer,
    ZooKeeperUnavailable,
)
from understudy_operator.zk import ZkError, ZkGateway, ZkUnavailable, with_gateway

Progress = Callable[[str], None]
T = TypeVar("T")

#: The private ZooKeeper's ``tickTime``. The server expires sessions in tick-sized buckets,
#: so a hung broker's ephemeral node goes up to one tick after its session timeout: 200 ms
#: rather than ZooKeeper's usual 500 ms bounds how late a hang failover can start. A
#: session still never expires before its timeout (what the brokers' read leases rely
#: on), and the server's minimum session (1 s) stays above two ticks.
ZK_TICK_MS = 200
#: ``--zk-ensemble`` sizes: one standalone server, or an odd ensemble (an even one
#: tolerates no more failures than the odd size below it).
ZK_ENSEMBLE_SIZES = (1, 3, 5, 7)


class LocalError(Exception):
    """A local-cluster request that cannot be carried out; the message says why and what
    to do. The CLI prints it and exits 2."""


@dataclass(frozen=True, slots=True)
class BrokerRow:
    name: str
    role: str
    effective: Permission
    pid: int | None
    alive: bool
    stopped: bool
    lag_bytes: int | None
    source: str  # where `effective` came from: "zk", "metrics" or "-" (not reachable)


@dataclass(frozen=True, slots=True)
class ZkRow:
    """One ZooKeeper server: ``mode`` is ``leader``/``follower``/``standalone``, or
    ``None`` while it serves no clients (down, or a member without a quorum)."""

    name: str
    server_id: int
    port: int
    pid: int | None
    alive: bool
    stopped: bool
    mode: str | None


@dataclass(frozen=True, slots=True)
class GroupRow:
    name: str
    mode: str | None
    epoch: int | None
    acting: str | None
    brokers: tuple[BrokerRow, ...]


@dataclass(frozen=True, slots=True)
class ClusterStatus:
    dir: Path
    zk: str
    zk_alive: bool
    controller_pid: int | None
    controller_alive: bool
    groups: tuple[GroupRow, ...]
    zk_nodes: tuple[ZkRow, ...] = ()

    def to_json(self) -> dict[str, object]:
        """The ``local status --json`` document (contract: groups -> name, mode, epoch,
        acting, brokers -> name, role, effective, pid, alive; zookeeper -> connect, alive,
        nodes -> name, id, port, pid, alive, stopped, mode)."""
        return {
            "dir": str(self.dir),
            "zookeeper": {
                "connect": self.zk,
                "alive": self.zk_alive,
                "nodes": [
                    {"name": n.name, "id": n.server_id, "port": n.port, "pid": n.pid,
                     "alive": n.alive, "stopped": n.stopped, "mode": n.mode}
                    for n in self.zk_nodes
                ],
            },
            "controller": {"pid": self.controller_pid, "alive": self.controller_alive},
            "groups": [
                {
                    "name": g.name,
                    "mode": g.mode,
                    "epoch": g.epoch,
                    "acting": g.acting,
                    "brokers": [
                        {
                            "name": b.name,
                            "role": b.role,
                            "effective": b.effective.label,
                            "pid": b.pid,
                            "alive": b.alive,
                            "stopped": b.stopped,
                            "lag_bytes": b.lag_bytes,
                        }
                        for b in g.brokers
                    ],
                }
                for g in self.groups
            ],
        }


def _quiet(_msg: str) -> None:
    pass


# ------------------------------------------------------------------------------ up


def up(
    directory: Path,
    *,
    groups: int = 1,
    slaves: int = 1,
    sync: bool = True,
    session_timeout_ms: int = 2000,
    failover: FailoverPolicy | None = None,
    replication: ReplicationPolicy | None = None,
    coordinated: bool = True,
    zk_ensemble: int = 1,
    timeout: float = 60.0,
    progress: Progress = _quiet,
    placement: Placer = on_loopback,
    data_dirs: Mapping[str, Path] | None = None,
    secure: bool = False,
) -> ClusterPlan:
    """Start ZooKeeper (one server, or an ensemble of ``zk_ensemble``), the brokers and
    the controller; return once every group is NORMAL and its master reads (uncoordinated,
    see :attr:`ClusterPlan.coordinated`: once every broker answers ``/healthz``). On any
    failure everything started so far is stopped again. ``placement`` puts each process on
    a host (:class:`~.plan.Placement`; the partition tests' network namespaces), by
    name: brokers, ``zookeeper``, ``controller``. ``data_dirs``: brokers whose data
    directory lives elsewhere (a small tmpfs that a test fills), by name; ``data/<broker>``
    is then a symbolic link to it. ``secure``: a certificate authority, the brokers'
    certificate, each group's secret and an admin user are made under ``security/``, and
    every broker serves TLS and requires authentication (docs/security.md)."""
    directory = directory.resolve()
    # Bad sizes or a bad replication policy are refused before anything starts.
    if zk_ensemble not in ZK_ENSEMBLE_SIZES:
        raise LocalError(f"--zk-ensemble must be one of {', '.join(map(str, ZK_ENSEMBLE_SIZES))}, "
                         f"got {zk_ensemble}")
    dummy_ports = itertools.count(1)
    plan_cluster(directory=directory, groups=groups, slaves=slaves, sync=sync,
                 port=lambda: next(dummy_ports), zk_port=0, replication=replication)
    _claim(directory)
    zk = ZooKeeperEnsemble.on_free_ports(directory / ZOOKEEPER, size=zk_ensemble,
                                         tick_ms=ZK_TICK_MS, placement=placement(ZOOKEEPER))
    progress("starting ZooKeeper" if zk_ensemble == 1 else
             f"starting a {zk_ensemble}-server ZooKeeper ensemble")
    try:
        zk.start()
    except ZooKeeperUnavailable as exc:
        raise LocalError(str(exc)) from None
    for server in zk.nodes:
        if server.process is not None:
            procs.detach(server.process)
    try:
        for member, server in zip(zk.members, zk.nodes, strict=True):
            procs.write_pid(directory / "pids", member.name, server.pid or 0)
        plan = plan_cluster(
            directory=directory,
            groups=groups,
            slaves=slaves,
            sync=sync,
            coordinated=coordinated,
            port=free_port,
            zk_nodes=zk.members,
            session_timeout_ms=session_timeout_ms,
            failover=failover,
            replication=replication,
            placement=placement,
            secure=secure,
        )
        (directory / STATE_FILE).write_text(plan.to_json())
        _write_configs(plan)
        if secure:
            progress("making a certificate authority, certificates and the admin user")
            _make_security(plan)
        for name, target in (data_dirs or {}).items():
            link = directory / "data" / plan.process(name).name
            target.mkdir(parents=True, exist_ok=True)
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(target.resolve())
        deadline = time.monotonic() + timeout
        for p in plan.brokers:
            progress(f"starting broker {p.name}")
            _spawn(plan, p)
        for p in plan.brokers:
            progress(f"waiting for broker {p.name}")
            _wait_healthy(plan, p, deadline=deadline)
        if not plan.coordinated:
            return plan
        controller = plan.process(CONTROLLER)
        progress("starting the controller")
        _spawn(plan, controller)
        for g in plan.groups:
            progress(f"waiting for group {g.group} to be NORMAL")
            wait_mode(plan, g.group, "NORMAL", deadline=deadline, watch=controller)
            progress(f"waiting for {g.master.name} to read")
            wait_master_reads(plan, g.group, deadline=deadline)
        return plan
    except BaseException:
        with contextlib.suppress(Exception):
            down(directory)
        for server in zk.nodes:
            if server.process is not None:
                procs.stop(server.process.pid, marker=str(server.config_path))
        raise


def _claim(directory: Path) -> None:
    """Make ``directory`` ours for a fresh cluster, or refuse with a clear reason."""
    if directory.exists() and not directory.is_dir():
        raise LocalError(f"{directory} exists and is not a directory")
    if directory.is_dir() and any(directory.iterdir()):
        if not (directory / STATE_FILE).exists():
            raise LocalError(
                f"{directory} is not empty and holds no local cluster ({STATE_FILE}); "
                "choose another --dir"
            )
        running = _running(directory)
        if running:
            names = ", ".join(f"{n} (pid {pid})" for n, pid in running)
            raise LocalError(
                f"{directory} is in use: {names} still running; "
                f"run 'understudy local down --dir {directory}' first"
            )
        for sub in ("data", "logs", "pids", ZOOKEEPER):
            shutil.rmtree(directory / sub, ignore_errors=True)
        (directory / STATE_FILE).unlink()
    directory.mkdir(parents=True, exist_ok=True)


def _running(directory: Path) -> list[tuple[str, int]]:
    try:
        plan = ClusterPlan.load(directory)
    except PlanError:
        return []
    out = []
    for name, marker in _markers(plan):
        pid = procs.read_pid(plan.pid_dir, name)
        info = procs.inspect(pid, marker=marker)
        if info is not None and info.alive:
            out.append((name, info.pid))
    return out


def _markers(plan: ClusterPlan) -> list[tuple[str, str]]:
    return [(p.name, p.marker) for p in plan.processes] + [
        (node.name, str(server.config_path)) for node, server in _zk_servers(plan)]


def _zk_servers(plan: ClusterPlan) -> list[tuple[ZkNode, ZooKeeperServer]]:
    """This cluster's ZooKeeper servers as ``up`` started them (not running: to restart
    one, or to name its marker), each with its recorded node."""
    ensemble = ZooKeeperEnsemble.build(plan.dir / ZOOKEEPER, plan.zk_nodes, tick_ms=ZK_TICK_MS)
    return list(zip(plan.zk_nodes, ensemble.nodes, strict=True))


def _zk(plan: ClusterPlan, work: Callable[[ZkGateway], Awaitable[T]], *, chroot: bool = True,
        timeout: float = 5.0) -> T:
    """Run ``work`` with a gateway to this cluster's ZooKeeper (its chroot, or the root)."""
    try:
        return with_gateway(plan.zk_connect if chroot else plan.zk_hosts, work, timeout_s=timeout)
    except ZkUnavailable as exc:
        raise LocalError(
            f"cannot reach this cluster's ZooKeeper at {plan.zk_hosts} ({exc}); "
            f"is it up? ('understudy local status --dir {plan.dir}')"
        ) from None


def _write_configs(plan: ClusterPlan) -> None:
    async def create_chroot(zk: ZkGateway) -> None:
        await zk.ensure_path(plan.chroot)

    async def write(zk: ZkGateway) -> None:
        for g in plan.groups:
            await zk.write_config(g.group, g.to_json())

    _zk(plan, create_chroot, chroot=False)
    _zk(plan, write)


def _make_security(plan: ClusterPlan) -> None:
    """The CA, one certificate for every broker (its common name a super user; names and
    addresses of every broker host), each group's secret, and the admin user's password
    (files readable by their owner only); the admin's salted keys go to ZooKeeper."""
    files = plan.security
    files.dir.mkdir(parents=True, exist_ok=True)
    now = datetime.now(UTC)
    ca = certs.new_ca(now=now, validity=timedelta(days=365))
    hosts = sorted({p.host for p in plan.brokers} | {HOST})
    broker = certs.issue(ca, common_name=BROKER_USER, dns_names=["localhost"],
                         ip_addresses=hosts, server=True, client=True, now=now,
                         validity=timedelta(days=365))
    password = secrets.token_urlsafe(24)
    private = [(files.ca_key, ca.key_pem), (files.broker_key, broker.key_pem),
               (files.admin_password, password.encode() + b"\n"),
               *((files.group_secret(g.group), secrets.token_urlsafe(32).encode() + b"\n")
                 for g in plan.groups)]
    for path, data in private:
        path.touch(mode=0o600)
        path.write_bytes(data)
    files.ca_cert.write_bytes(ca.cert_pem)
    files.broker_cert.write_bytes(broker.cert_pem)
    admin = make_user(password)

    async def write(zk: ZkGateway) -> None:
        await zk.create(acl_user_path(ADMIN_USER), admin.to_json())

    _zk(plan, write)


def client_security(plan: ClusterPlan) -> ClientSecurity | None:
    """What a client of this cluster presents: the CA and the admin user of a secure
    cluster, nothing otherwise."""
    if not plan.secure:
        return None
    files = plan.security
    return ClientSecurity.from_files(tls_ca=files.ca_cert, user=ADMIN_USER,
                                     password_file=files.admin_password)


def _spawn(plan: ClusterPlan, p: ProcessPlan) -> int:
    pid = procs.spawn(list(p.argv), log=plan.log_dir / f"{p.name}.log", cwd=plan.dir)
    procs.write_pid(plan.pid_dir, p.name, pid)
    return pid


def _log_tail(plan: ClusterPlan, name: str, lines: int = 15) -> str:
    try:
        text = (plan.log_dir / f"{name}.log").read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


def _wait_healthy(plan: ClusterPlan, p: ProcessPlan, *, deadline: float) -> None:
    while True:
        info = procs.inspect(procs.read_pid(plan.pid_dir, p.name), marker=p.marker)
        if info is None or not info.alive:
            how = "" if info is None or info.exit_status is None else f" (status {info.exit_status})"
            raise LocalError(
                f"{p.name} (pid {None if info is None else info.pid}) exited during start{how}; "
                f"last lines of {plan.log_dir / (p.name + '.log')}:\n" + _log_tail(plan, p.name)
            )
        if p.http_port is not None and http_get(p.http_port, "/healthz", host=p.host) is not None:
            return
        if time.monotonic() > deadline:
            raise LocalError(f"{p.name} did not answer /healthz on port {p.http_port} in time")
        time.sleep(0.05)


def http_get(port: int, path: str, *, timeout: float = 0.5, host: str = "127.0.0.1") -> str | None:
    """GET ``http://host:port/path``; the body on 200, else ``None``."""
    try:
        with urllib.request.urlopen(f"http://{host}:{port}{path}", timeout=timeout) as resp:
            if resp.status != 200:
                return None
            body: bytes = resp.read()
            return body.decode("utf-8", "replace")
    except (OSError, urllib.error.URLError, ValueError):
        return None


def wait_mode(
    plan: ClusterPlan, group: str, mode: str, *, deadline: float, watch: ProcessPlan | None = None
) -> None:
    """Wait until ``/groups/<group>/state`` says ``mode``; fail early if ``watch`` dies."""

    async def wait(zk: ZkGateway) -> None:
        while True:
            state, _ = await zk.read_state(group, warn=lambda _msg: None)
            if state is not None and state.mode.name == mode:
                return
            if watch is not None:
                info = procs.inspect(procs.read_pid(plan.pid_dir, watch.name), marker=watch.marker)
                if info is None or not info.alive:
                    raise LocalError(
                        f"{watch.name} exited; last lines of its log:\n" + _log_tail(plan, watch.name)
                    )
            if time.monotonic() > deadline:
                raise LocalError(f"group {group} did not reach {mode} in time")
            await asyncio.sleep(0.05)

    _zk(plan, wait)


def wait_master_reads(plan: ClusterPlan, group: str, *, deadline: float) -> None:
    """Wait until the master's published status holds READ: NORMAL is written by the
    controller; the master reads once it applied it and renewed its read lease."""
    wait_master_holds(plan, group, Permission.READ, deadline=deadline)


def wait_master_holds(plan: ClusterPlan, group: str, need: Permission, *, deadline: float) -> None:
    """Wait until the master's published status holds every permission in ``need``. A
    restarted master is isolated until back-sync, so it neither reads nor writes at once."""
    master = next(g for g in plan.groups if g.group == group).master.name

    async def wait(zk: ZkGateway) -> None:
        while True:
            found = await zk.get(status_path(group, master))
            if found is not None:
                with contextlib.suppress(ValueError):
                    if BrokerStatus.from_json(found[0]).effective & need == need:
                        return
            if time.monotonic() > deadline:
                raise LocalError(f"{master} does not hold {need.name} after the wait")
            await asyncio.sleep(0.05)

    _zk(plan, wait)


# -------------------------------------------------------------------------- status


def status(directory: Path) -> ClusterStatus:
    plan = ClusterPlan.load(directory.resolve())
    zk_rows = tuple(_zk_row(plan, node, server) for node, server in _zk_servers(plan))
    # a majority of the servers runs: ZooKeeper can answer (one server: it runs)
    zk_alive = sum(1 for n in zk_rows if n.alive) > len(zk_rows) // 2
    ctl_pid = procs.read_pid(plan.pid_dir, CONTROLLER)
    info = procs.inspect(ctl_pid, marker="controller")
    ctl_alive = info is not None and info.alive
    seen: dict[str, tuple[GroupState | None, Observation | None]] = {
        g.group: (None, None) for g in plan.groups}
    if zk_alive:

        async def read(zk: ZkGateway) -> None:
            for g in plan.groups:
                state, _ = await zk.read_state(g.group, warn=lambda _msg: None)
                obs = await zk.observe_group(g.group, [b.name for b in g.brokers],
                                             warn=lambda _msg: None)
                seen[g.group] = (state, obs)

        with contextlib.suppress(LocalError, ZkError):
            _zk(plan, read)
    rows = [_group_row(plan, g.group, *seen[g.group]) for g in plan.groups]
    return ClusterStatus(
        dir=plan.dir,
        zk=plan.zk_connect,
        zk_alive=zk_alive,
        controller_pid=ctl_pid,
        controller_alive=ctl_alive,
        groups=tuple(rows),
        zk_nodes=zk_rows,
    )


def _zk_row(plan: ClusterPlan, node: ZkNode, server: ZooKeeperServer) -> ZkRow:
    info = procs.inspect(procs.read_pid(plan.pid_dir, node.name), marker=str(server.config_path))
    alive = info is not None and info.alive
    stopped = info is not None and info.stopped
    return ZkRow(name=node.name, server_id=node.server_id, port=node.port,
                 pid=None if info is None else info.pid, alive=alive, stopped=stopped,
                 mode=server.mode() if alive and not stopped else None)


def _group_row(plan: ClusterPlan, group: str, state: GroupState | None,
               obs: Observation | None) -> GroupRow:
    cfg = next(g for g in plan.groups if g.group == group)
    mode = epoch = acting = None
    if state is not None:
        mode, epoch, acting = state.mode.name, state.epoch, state.acting
    statuses: dict[str, BrokerStatus] = {}
    if obs is not None:
        for b in cfg.brokers:
            view = obs.view(b.name)
            if view.zk_live and view.status is not None:
                statuses[b.name] = view.status
    master_offset = statuses[cfg.master.name].max_offset if cfg.master.name in statuses else None
    brokers = []
    for b in cfg.brokers:
        p = plan.process(b.name)
        info = procs.inspect(procs.read_pid(plan.pid_dir, b.name), marker=p.marker)
        alive = info is not None and info.alive
        stopped = info is not None and info.stopped
        effective, lag, source = Permission.NONE, None, "-"
        st = statuses.get(b.name)
        if alive and st is not None:
            effective, source = st.effective, "zk"
            if b.ordinal != 0 and master_offset is not None:
                lag = max(0, master_offset - st.max_offset)
        elif alive and not stopped:
            metrics = http_get(b.http_port, "/metrics", host=b.host)
            if metrics is not None:
                effective = permission_from_metrics(metrics) or Permission.NONE
                lag = lag_from_metrics(metrics)
                source = "metrics"
        brokers.append(
            BrokerRow(
                name=b.name,
                role=b.role.value,
                effective=effective,
                pid=None if info is None else info.pid,
                alive=alive,
                stopped=stopped,
                lag_bytes=lag,
                source=source,
            )
        )
    return GroupRow(name=group, mode=mode, epoch=epoch, acting=acting, brokers=tuple(brokers))


def _metric_values(text: str, name: str) -> list[float]:
    out = []
    for line in text.splitlines():
        if line.startswith(name) and line[len(name) : len(name) + 1] in ("{", " "):
            with contextlib.suppress(ValueError, IndexError):
                out.append(float(line.rsplit(" ", 1)[1]))
    return out


def permission_from_metrics(text: str) -> Permission | None:
    """``understudy_broker_permission`` from a Prometheus exposition (0-3)."""
    values = _metric_values(text, metric_names.BROKER_PERMISSION)
    if not values or not 0 <= int(values[0]) <= 3:
        return None
    return Permission(int(values[0]))


def lag_from_metrics(text: str) -> int | None:
    values = _metric_values(text, metric_names.REPLICATION_LAG_BYTES)
    return int(max(values)) if values else None


# ------------------------------------------------------------------ kill/start/down


def kill(directory: Path, broker: str, *, sig: str = "KILL") -> int:
    """Send ``sig`` (KILL, STOP, TERM, CONT) to one broker or ZooKeeper server; returns
    its PID."""
    plan = ClusterPlan.load(directory.resolve())
    name, marker = _target(plan, broker)
    signame = sig.upper().removeprefix("SIG")
    if signame not in procs.SIGNALS:
        raise LocalError(f"unknown signal {sig!r}: expected one of {', '.join(procs.SIGNALS)}")
    info = procs.inspect(procs.read_pid(plan.pid_dir, name), marker=marker)
    if info is None or not info.alive:
        raise LocalError(f"{broker} is not running; start it with 'understudy local start {broker}'")
    procs.send(info.pid, procs.SIGNALS[signame])
    if signame == "KILL":
        procs.wait_gone(info.pid, marker=marker, timeout=5.0)
    elif signame == "STOP":
        procs.wait_stopped(info.pid, marker=marker)
    return info.pid


def start(directory: Path, broker: str, *, wait: bool = True, timeout: float = 30.0) -> int:
    """Start a broker or ZooKeeper server that is down, exactly as ``up`` started it; a
    frozen (SIGSTOPped) one is resumed instead. Returns its PID. ``wait``: a broker until
    it answers ``/healthz``; a ZooKeeper server until it answers ``ruok`` (serving clients
    needs a quorum: ``status`` shows its mode)."""
    plan = ClusterPlan.load(directory.resolve())
    name, marker = _target(plan, broker)
    info = procs.inspect(procs.read_pid(plan.pid_dir, name), marker=marker)
    if info is not None and info.alive:
        if info.stopped:
            procs.send(info.pid, signal.SIGCONT)
            return info.pid
        raise LocalError(f"{broker} is already running (pid {info.pid})")
    node = plan.zk_node(name)
    if node is not None:
        return _start_zk(plan, node, timeout=timeout)
    p = plan.process(name)
    pid = _spawn(plan, p)
    if wait:
        _wait_healthy(plan, p, deadline=time.monotonic() + timeout)
    return pid


def _start_zk(plan: ClusterPlan, node: ZkNode, *, timeout: float) -> int:
    server = dict((n.name, s) for n, s in _zk_servers(plan))[node.name]
    try:
        server.start(timeout=timeout)
    except ZooKeeperUnavailable as exc:
        raise LocalError(str(exc)) from None
    assert server.process is not None  # started
    procs.detach(server.process)
    procs.write_pid(plan.pid_dir, node.name, server.process.pid)
    return server.process.pid


def _target(plan: ClusterPlan, name: str) -> tuple[str, str]:
    """``(name, marker)`` of a broker or a ZooKeeper server, or a clear error."""
    markers = dict(_markers(plan))
    if plan.zk_node(name) is not None or any(b.name == name for b in plan.brokers):
        return name, markers[name]
    known = (f"brokers {', '.join(b.name for b in plan.brokers)}; ZooKeeper "
             f"{', '.join(n.name for n in plan.zk_nodes)}")
    if name in markers:
        raise LocalError(f"{name!r} is not a broker or ZooKeeper server; this cluster has: {known}")
    raise LocalError(f"unknown broker {name!r}; this cluster has: {known}")


def down(directory: Path, *, progress: Progress = _quiet) -> list[tuple[str, int]]:
    """Stop everything this cluster started — controller first (so it does not react to
    the brokers going away), then brokers, then ZooKeeper — each by its recorded PID.
    Returns ``(name, pid)`` of what was running."""
    plan = ClusterPlan.load(directory.resolve())
    zookeeper = {n.name for n in plan.zk_nodes}
    order = sorted(_markers(plan),
                   key=lambda nm: 0 if nm[0] == CONTROLLER else 2 if nm[0] in zookeeper else 1)
    stopped = []
    for name, marker in order:
        pid = procs.read_pid(plan.pid_dir, name)
        if pid is not None and procs.stop(pid, marker=marker):
            progress(f"stopped {name} (pid {pid})")
            stopped.append((name, pid))
        procs.remove_pid(plan.pid_dir, name)
    return stopped


def describe(plan: ClusterPlan) -> str:
    """Where the cluster's state lives, for ``local up`` to print."""
    lines = [
        f"state:     {plan.dir}  ({STATE_FILE}, pids/, logs/, data/)",
        f"zookeeper: {plan.zk_connect}",
    ]
    for g in plan.groups:
        lines.append(f"group {g.group}: bootstrap {','.join(b.address for b in g.brokers)}")
    if plan.controller_http_port:
        lines.append(f"controller: http://127.0.0.1:{plan.controller_http_port}/metrics")
    return "\n".join(lines)


def status_json(st: ClusterStatus) -> str:
    return json.dumps(st.to_json(), indent=2)
