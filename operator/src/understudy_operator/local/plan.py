"""The local cluster as data: its state directory, its groups and each process's command.

Why this module exists: ``local up`` decides everything (names, ports, flags, file paths)
before it starts anything, and ``local start BROKER`` must start a broker exactly as
``up`` did. So the decisions are pure functions over plain data, recorded once in
``<dir>/cluster.json``, and the supervisor (:mod:`.cluster`) only executes them.

State directory layout (``--dir``, default ``.understudy/local``)::

    cluster.json            this plan: ZooKeeper address, groups, every process's argv
    pids/<name>.pid         one PID per process (brokers, "controller", "zookeeper" or,
                            for an ensemble, "zk1".."zkN")
    logs/<name>.log         stdout+stderr of each process
    data/<broker>/          each broker's log, indexes and offsets
    zookeeper/              the private ZooKeeper's data and config (an ensemble: one
                            folder per node, zookeeper/zk1 ...)
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from understudy_broker.model import Permission
from understudy_broker.zklayout import (
    DEFAULT_CHROOT,
    BrokerSpec,
    FailoverPolicy,
    GroupConfig,
    LayoutError,
    ReplicationPolicy,
)

DEFAULT_DIR = Path(".understudy/local")
STATE_FILE = "cluster.json"
ZOOKEEPER = "zookeeper"
CONTROLLER = "controller"
HOST = "127.0.0.1"
SECURITY = "security"
#: The common name of every broker's certificate (a super user on every broker), and
#: the local secure cluster's administrator (a super user too).
BROKER_USER = "understudy-broker"
ADMIN_USER = "admin"


@dataclass(frozen=True, slots=True)
class SecurityFiles:
    """Where ``understudy local up --secure`` keeps its CA, the brokers' certificate, the
    admin's password and each group's secret (docs/security.md)."""

    dir: Path

    @property
    def ca_cert(self) -> Path:
        return self.dir / "ca.crt"

    @property
    def ca_key(self) -> Path:
        return self.dir / "ca.key"

    @property
    def broker_cert(self) -> Path:
        return self.dir / "broker.crt"

    @property
    def broker_key(self) -> Path:
        return self.dir / "broker.key"

    @property
    def admin_password(self) -> Path:
        return self.dir / f"{ADMIN_USER}.password"

    def group_secret(self, group: str) -> Path:
        return self.dir / f"{group}.secret"

    def broker_argv(self, group: str) -> list[str]:
        """The flags that turn a broker's TLS, SCRAM and ACLs on."""
        return ["--tls-cert", str(self.broker_cert.resolve()),
                "--tls-key", str(self.broker_key.resolve()),
                "--tls-ca", str(self.ca_cert.resolve()),
                "--require-auth", "--super-user", BROKER_USER, "--super-user", ADMIN_USER,
                "--group-secret-file", str(self.group_secret(group).resolve())]

    def client_argv(self) -> list[str]:
        """The client flags of the admin (any ``understudy`` client command)."""
        return ["--tls-ca", str(self.ca_cert.resolve()), "--user", ADMIN_USER,
                "--password-file", str(self.admin_password.resolve())]


class PlanError(ValueError):
    """The request cannot be planned or the recorded plan is unreadable."""


@dataclass(frozen=True, slots=True)
class Placement:
    """Where one process of the cluster runs: the address it listens on and is reached
    at, and the argv prefix that starts it there (``ip netns exec NAME`` for a host of a
    test's network namespaces, :mod:`understudy_harness.netns`). The default is every
    process on :data:`HOST`, started as it is."""

    host: str = HOST
    prefix: tuple[str, ...] = ()


#: Where each process goes, by name: a broker's name, :data:`ZOOKEEPER` (every server of
#: the ensemble) or :data:`CONTROLLER`.
Placer = Callable[[str], Placement]


def on_loopback(_name: str) -> Placement:
    """The default :data:`Placer`: everything on :data:`HOST`."""
    return Placement()


@dataclass(frozen=True, slots=True)
class ZkNode:
    """One ZooKeeper server of the cluster on ``host`` (started with ``prefix``, see
    :class:`Placement`). ``server_id`` 0 is a standalone server (the default, one node);
    an ensemble numbers its servers 1..N (their ``myid``) and each also listens on a
    quorum and an election port."""

    server_id: int
    port: int
    quorum_port: int = 0
    election_port: int = 0
    host: str = HOST
    prefix: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        """Its pid/log name: ``zookeeper`` standalone, ``zk<id>`` in an ensemble."""
        return f"zk{self.server_id}" if self.server_id else ZOOKEEPER

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.server_id, "port": self.port, "quorumPort": self.quorum_port,
                "electionPort": self.election_port, "host": self.host,
                "prefix": list(self.prefix)}

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> ZkNode:
        return cls(int(doc["id"]), int(doc["port"]), int(doc.get("quorumPort", 0)),
                   int(doc.get("electionPort", 0)), str(doc.get("host", HOST)),
                   tuple(str(a) for a in doc.get("prefix", ())))


def zk_hosts(nodes: Sequence[ZkNode]) -> str:
    """The connect string (no chroot) that lists every server of ``nodes``."""
    return ",".join(n.address for n in nodes)


@dataclass(frozen=True, slots=True)
class ProcessPlan:
    """One process of the cluster: its name (pid/log file stem), argv and the marker
    (an argv element) that identifies it in ``/proc``; ``host``: where its HTTP port is
    reached."""

    name: str
    argv: tuple[str, ...]
    marker: str
    http_port: int | None = None
    group: str | None = None
    host: str = HOST


@dataclass(frozen=True, slots=True)
class ClusterPlan:
    dir: Path
    #: The ZooKeeper servers: one standalone server, or every member of an ensemble.
    zk_nodes: tuple[ZkNode, ...]
    groups: tuple[GroupConfig, ...]
    processes: tuple[ProcessPlan, ...]
    #: Brokers take their permission from ZooKeeper and a controller runs (the product).
    #: ``False`` runs static brokers without failover: only tests that need two readers
    #: on purpose ask for it.
    coordinated: bool = True
    chroot: str = DEFAULT_CHROOT
    session_timeout_ms: int = 2000
    controller_http_port: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    #: TLS on every port, SCRAM and ACLs (``understudy local up --secure``).
    secure: bool = False

    @property
    def security(self) -> SecurityFiles:
        return SecurityFiles(self.dir / SECURITY)

    @property
    def zk_port(self) -> int:
        """The first ZooKeeper server's client port (the only one without an ensemble)."""
        return self.zk_nodes[0].port

    @property
    def zk_hosts(self) -> str:
        """Every ZooKeeper server's client address, comma-separated (no chroot)."""
        return zk_hosts(self.zk_nodes)

    def zk_node(self, name: str) -> ZkNode | None:
        return next((n for n in self.zk_nodes if n.name == name), None)

    @property
    def zk_connect(self) -> str:
        """Connect string with the chroot, as brokers and the controller take it."""
        return f"{self.zk_hosts}{self.chroot}"

    @property
    def pid_dir(self) -> Path:
        return self.dir / "pids"

    @property
    def log_dir(self) -> Path:
        return self.dir / "logs"

    @property
    def brokers(self) -> tuple[ProcessPlan, ...]:
        return tuple(p for p in self.processes if p.group is not None)

    def process(self, name: str) -> ProcessPlan:
        for p in self.processes:
            if p.name == name:
                return p
        known = ", ".join(p.name for p in self.brokers)
        raise PlanError(f"unknown broker {name!r}; this cluster has: {known}")

    def group_of(self, broker: str) -> GroupConfig:
        for g in self.groups:
            if any(b.name == broker for b in g.brokers):
                return g
        raise PlanError(f"unknown broker {broker!r}")

    def bootstrap(self, group: str) -> list[str]:
        for g in self.groups:
            if g.group == group:
                return [b.address for b in g.brokers]
        raise PlanError(f"unknown group {group!r}")

    def address(self, broker: str) -> str:
        """A broker's client address (``HOST:PORT``)."""
        for g in self.groups:
            for b in g.brokers:
                if b.name == broker:
                    return b.address
        raise PlanError(f"unknown broker {broker!r}")

    # ------------------------------------------------------------------ persistence

    def to_json(self) -> str:
        doc = {
            "version": 1,
            "zkPort": self.zk_port,
            "zkNodes": [n.to_dict() for n in self.zk_nodes],
            "chroot": self.chroot,
            "sessionTimeoutMs": self.session_timeout_ms,
            "controllerHttpPort": self.controller_http_port,
            "coordinated": self.coordinated,
            "groups": [json.loads(g.to_json()) for g in self.groups],
            "processes": [
                {
                    "name": p.name,
                    "argv": list(p.argv),
                    "marker": p.marker,
                    "httpPort": p.http_port,
                    "group": p.group,
                    "host": p.host,
                }
                for p in self.processes
            ],
            "extra": self.extra,
            "secure": self.secure,
        }
        return json.dumps(doc, indent=2) + "\n"

    @classmethod
    def load(cls, directory: Path) -> ClusterPlan:
        path = directory / STATE_FILE
        try:
            doc = json.loads(path.read_text())
        except FileNotFoundError:
            raise PlanError(
                f"no local cluster in {directory} (no {STATE_FILE}); start one with "
                f"'understudy local up --dir {directory}'"
            ) from None
        except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise PlanError(f"{path} is unreadable ({exc}); run 'understudy local down' and 'up' again") from None
        try:
            nodes = tuple(ZkNode.from_dict(n) for n in doc.get("zkNodes", ())) or (
                ZkNode(0, int(doc["zkPort"])),)
            return cls(
                dir=directory,
                zk_nodes=nodes,
                chroot=str(doc["chroot"]),
                session_timeout_ms=int(doc["sessionTimeoutMs"]),
                controller_http_port=doc.get("controllerHttpPort"),
                coordinated=bool(doc.get("coordinated", True)),
                groups=tuple(GroupConfig.from_json(json.dumps(g).encode()) for g in doc["groups"]),
                processes=tuple(
                    ProcessPlan(
                        name=str(p["name"]),
                        argv=tuple(str(a) for a in p["argv"]),
                        marker=str(p["marker"]),
                        http_port=p.get("httpPort"),
                        group=p.get("group"),
                        host=str(p.get("host", HOST)),
                    )
                    for p in doc["processes"]
                ),
                extra=dict(doc.get("extra", {})),
                secure=bool(doc.get("secure", False)),
            )
        except (KeyError, TypeError, ValueError, LayoutError) as exc:
            raise PlanError(f"{path} is malformed ({exc!r}); run 'understudy local down' and 'up' again") from None


def understudy_argv() -> list[str]:
    """How to run the ``understudy`` CLI with this interpreter (no PATH lookup)."""
    return [sys.executable, "-c", "from understudy_broker.cli import main; main()"]


def plan_cluster(
    *,
    directory: Path,
    groups: int,
    slaves: int,
    sync: bool,
    port: Callable[[], int],
    coordinated: bool = True,
    zk_port: int = 0,
    zk_nodes: Sequence[ZkNode] = (),
    session_timeout_ms: int = 2000,
    failover: FailoverPolicy | None = None,
    replication: ReplicationPolicy | None = None,
    chroot: str = DEFAULT_CHROOT,
    placement: Placer = on_loopback,
    secure: bool = False,
) -> ClusterPlan:
    """Name and wire the cluster: groups ``g1..gN``, brokers ``gK-0`` (master) and
    ``gK-1..gK-M`` (slaves, configured READ so they may act for reads). ``port`` hands
    out free ports. ``coordinated=False``: see :attr:`ClusterPlan.coordinated`. ZooKeeper:
    the servers ``zk_nodes`` (an ensemble), or else one standalone server on ``zk_port``.
    ``placement`` puts each broker and the controller on a host (the address a broker
    listens on and advertises in the group config, and its command prefix)."""
    if not 1 <= groups <= 50:
        raise PlanError(f"--groups must be 1-50, got {groups}")
    if not 0 <= slaves <= 8:
        raise PlanError(f"--slaves must be 0-8, got {slaves}")
    if replication is None:
        replication = ReplicationPolicy(min_insync=min(1, slaves))
    replication = dataclasses.replace(replication, sync=sync)
    configs = []
    for k in range(1, groups + 1):
        brokers = tuple(
            BrokerSpec(
                name=f"g{k}-{i}",
                ordinal=i,
                host=placement(f"g{k}-{i}").host,
                port=port(),
                replication_port=port(),
                http_port=port(),
                permission=Permission.FULL if i == 0 else Permission.READ,
            )
            for i in range(slaves + 1)
        )
        try:
            configs.append(
                GroupConfig(
                    group=f"g{k}",
                    brokers=brokers,
                    failover=failover or FailoverPolicy(),
                    replication=replication,
                    session_timeout_ms=session_timeout_ms,
                ).validate()
            )
        except LayoutError as exc:
            raise PlanError(str(exc)) from None
    nodes = tuple(zk_nodes) or (ZkNode(0, zk_port),)
    zk_connect = zk_hosts(nodes) + chroot
    procs = [
        broker_process(g, b, directory=directory, zk_connect=zk_connect if coordinated else None,
                       prefix=placement(b.name).prefix,
                       security=SecurityFiles(directory / SECURITY) if secure else None)
        for g in configs
        for b in g.brokers
    ]
    controller_port = None
    if coordinated:
        controller_port = port()
        procs.append(
            controller_process(
                groups=[g.group for g in configs],
                zk_connect=zk_connect,
                pid_dir=directory / "pids",
                http_port=controller_port,
                journal=transitions_log(directory),
                placement=placement(CONTROLLER),
            )
        )
    return ClusterPlan(
        dir=directory,
        zk_nodes=nodes,
        groups=tuple(configs),
        processes=tuple(procs),
        coordinated=coordinated,
        chroot=chroot,
        session_timeout_ms=session_timeout_ms,
        controller_http_port=controller_port,
        secure=secure,
    )


def broker_process(
    group: GroupConfig, b: BrokerSpec, *, directory: Path, zk_connect: str | None,
    prefix: Sequence[str] = (), security: SecurityFiles | None = None,
) -> ProcessPlan:
    """The ``understudy broker`` command for one broker of ``group`` (coordinated by the
    ZooKeeper at ``zk_connect``; static without one), after ``prefix``."""
    argv = [
        *prefix,
        *understudy_argv(),
        "broker",
        "--data-dir", str((directory / "data" / b.name).resolve()),
        "--host", b.host,
        "--port", str(b.port),
        "--http-port", str(b.http_port),
        "--replication-port", str(b.replication_port),
        "--name", b.name,
        "--group", group.group,
        "--role", b.role.value,
        "--permission", b.permission.label.lower(),
        # a group without slaves has nobody to replicate to: it acknowledges on its own
        "--sync" if group.replication.sync and group.slaves else "--async",
    ]  # fmt: skip
    if b.ordinal != 0:
        m = group.master
        argv += ["--master", f"{m.host}:{m.replication_port}"]
    rp = group.replication
    if rp.sync and group.slaves:
        argv += ["--min-insync-replicas", str(rp.min_insync), "--in-sync-replicas",
                 str(rp.copies), "--max-lag-bytes", str(rp.max_lag_bytes),
                 "--auto-degrade" if rp.auto_degrade else "--no-auto-degrade"]
    for peer in group.brokers:
        if peer.name != b.name:
            argv += ["--peer", f"{peer.name}={peer.address}"]
    if zk_connect is not None:
        argv += ["--zk", zk_connect, "--zk-session-timeout-ms", str(group.session_timeout_ms)]
    if security is not None:
        argv += security.broker_argv(group.group)
    return ProcessPlan(name=b.name, argv=tuple(argv), marker=b.name, http_port=b.http_port,
                       group=group.group, host=b.host)


def transitions_log(directory: Path) -> Path:
    """Where the local controller journals its transitions (see controller/journal.py)."""
    return directory / "logs" / "transitions.jsonl"


def controller_process(
    *, groups: Sequence[str], zk_connect: str, pid_dir: Path, http_port: int,
    journal: Path | None = None, placement: Placement | None = None,
) -> ProcessPlan:
    placement = placement or Placement()
    argv = [*placement.prefix, *understudy_argv(), "controller", "--zk", zk_connect]
    for g in groups:
        argv += ["--group", g]
    argv += ["--pid-dir", str(pid_dir.resolve()), "--http-port", str(http_port)]
    if placement.host != HOST:
        argv += ["--http-host", placement.host]
    if journal is not None:
        argv += ["--transitions-log", str(journal.resolve())]
    return ProcessPlan(name=CONTROLLER, argv=tuple(argv), marker="controller",
                       http_port=http_port, host=placement.host)
