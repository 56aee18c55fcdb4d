"""A private ZooKeeper server from the Debian ``zookeeper`` package.

Why this module exists: the local cluster (``understudy local up``), the drill and every
test that needs coordination start their own ZooKeeper on 127.0.0.1, on a free port, with a
short tick so that session expiry is fast (1 s sessions expire in ~1.1-1.4 s). kazoo's own
test harness hard-codes a 2 s tick and needs extra jars; this is simpler and matches what
the product runs against.

The server is a child process in its own process group; :meth:`ZooKeeperServer.stop` kills
that group by PID and waits, so nothing outlives its owner.

:class:`ZooKeeperEnsemble` runs several such servers as one ensemble on 127.0.0.1 (each
with its own client, quorum and election port, ``myid`` and process), so that a test or
``understudy local up --zk-ensemble 3`` can kill the leader, or a majority, by PID and
bring them back. With one member it is exactly the standalone server above.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from understudy_operator.local.plan import Placement, ZkNode, zk_hosts
from understudy_operator.local.ports import free_port
from understudy_operator.local.procs import stop_group

JARS = (
    "/usr/share/java/zookeeper.jar",
    "/usr/share/java/slf4j-log4j12.jar",
    "/usr/share/java/log4j-1.2.jar",
)

LOG4J = """log4j.rootLogger=INFO, FILE
log4j.appender.FILE=org.apache.log4j.FileAppender
log4j.appender.FILE.File={log}
log4j.appender.FILE.layout=org.apache.log4j.PatternLayout
log4j.appender.FILE.layout.ConversionPattern=%d{{ISO8601}} [%t] %-5p %c{{1}} - %m%n
"""


#: An ensemble's ``initLimit`` and ``syncLimit`` as times (converted to ticks): a follower
#: gets this long to connect and sync to a new leader, and to stay in step with it. The
#: same values as the Helm chart's ZooKeeper (``initLimitTicks``/``syncLimitTicks`` at its
#: 200 ms tick).
INIT_LIMIT_MS = 10_000
SYNC_LIMIT_MS = 4_000

#: What ``srvr`` says a server is doing while it serves clients.
SERVING_MODES = ("leader", "follower", "standalone", "observer")


class ZooKeeperUnavailable(RuntimeError):
    """ZooKeeper is not installed or did not start; the message says what to do."""


def four_letter(host: str, port: int, command: str, *, timeout: float = 1.0) -> str:
    """Send a ZooKeeper four-letter command (``ruok``, ``srvr``, ``cons``, ``mntr``)."""
    with socket.create_connection((host, port), timeout=timeout) as s:
        s.sendall(command.encode("ascii"))
        chunks = []
        while True:
            data = s.recv(65536)
            if not data:
                break
            chunks.append(data)
    return b"".join(chunks).decode("utf-8", "replace")


def server_mode(host: str, port: int, *, timeout: float = 1.0) -> str | None:
    """What the server at ``host:port`` does now, from ``srvr``: ``leader``, ``follower``,
    ``standalone`` (or ``observer``); ``None`` while it serves no clients (an ensemble
    member without a quorum, still electing) or cannot be reached."""
    try:
        text = four_letter(host, port, "srvr", timeout=timeout)
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "Mode" and value.strip() in SERVING_MODES:
            return value.strip()
    return None


@dataclass
class ZooKeeperServer:
    """One ZooKeeper server: standalone, or member ``server_id`` of ``ensemble`` (every
    member, this one included, as each member's ``zoo.cfg`` lists them).

    ``min_session_ms``/``max_session_ms`` bound what clients may negotiate; the server
    clamps a requested session timeout into that range. ``prefix`` goes before the
    ``java`` command (``ip netns exec NAME``: a server in a test's network namespace, on
    that namespace's ``host``).
    """

    data_dir: Path
    port: int = 0
    host: str = "127.0.0.1"
    tick_ms: int = 500
    min_session_ms: int = 1000
    max_session_ms: int = 10000
    heap_mb: int = 256
    process: subprocess.Popen[bytes] | None = None
    server_id: int = 0
    ensemble: tuple[ZkNode, ...] = ()
    prefix: tuple[str, ...] = ()

    @property
    def connect(self) -> str:
        """The connect string (``host:port``), without a chroot."""
        return f"{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    @property
    def config_path(self) -> Path:
        """Its ``zoo.cfg``: on its command line, so it is the marker that tells this
        server's PID from a reused one."""
        return self.data_dir / "conf" / "zoo.cfg"

    def mode(self) -> str | None:
        """``leader``, ``follower``, ``standalone`` or ``None``: see :func:`server_mode`."""
        return server_mode(self.host, self.port, timeout=0.5)

    def _config(self) -> str:
        lines = [
            f"tickTime={self.tick_ms}",
            f"dataDir={self.data_dir / 'data'}",
            f"clientPort={self.port}",
            f"clientPortAddress={self.host}",
            f"minSessionTimeout={self.min_session_ms}",
            f"maxSessionTimeout={self.max_session_ms}",
            "4lw.commands.whitelist=ruok,srvr,stat,mntr,cons",
            "admin.enableServer=false",
            "maxClientCnxns=0",
        ]
        if self.ensemble:
            lines += [f"initLimit={math.ceil(INIT_LIMIT_MS / self.tick_ms)}",
                      f"syncLimit={math.ceil(SYNC_LIMIT_MS / self.tick_ms)}"]
            lines += [f"server.{n.server_id}={self.host}:{n.quorum_port}:{n.election_port}"
                      for n in self.ensemble]
        return "\n".join([*lines, ""])

    def start(self, *, timeout: float = 30.0) -> str:
        """Start the server and wait until it answers ``imok``; returns the connect string."""
        java = shutil.which("java")
        missing = [j for j in JARS if not Path(j).exists()]
        if java is None or missing:
            raise ZooKeeperUnavailable(
                "ZooKeeper needs a Java runtime and the Debian 'zookeeper' package "
                f"(missing: {', '.join(missing) or 'java'}); run 'make setup'"
            )
        if self.port == 0:
            self.port = free_port(self.host)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        conf = self.data_dir / "conf"
        conf.mkdir(exist_ok=True)
        self.config_path.write_text(self._config())
        if self.server_id:
            (self.data_dir / "data").mkdir(exist_ok=True)
            (self.data_dir / "data" / "myid").write_text(f"{self.server_id}\n")
        (conf / "log4j.properties").write_text(LOG4J.format(log=self.data_dir / "zookeeper.log"))
        cmd = [
            *self.prefix,
            java,
            f"-Xmx{self.heap_mb}m",
            "-XX:+UseSerialGC",
            # C1 only: the C2 compiler was half of this server's CPU for minutes after
            # start (310 of 680 ms in 10 s of a two-group cluster at 2000 msg/s), in bursts
            # at the first failovers, taken from the brokers on a laptop's shared cores.
            "-XX:TieredStopAtLevel=1",
            "-Dzookeeper.root.logger=INFO,FILE",
            f"-Dlog4j.configuration=file:{conf / 'log4j.properties'}",
            "-cp",
            ":".join([str(conf), *JARS]),
            "org.apache.zookeeper.server.quorum.QuorumPeerMain",
            str(self.config_path),
        ]
        out = (self.data_dir / "stdout.log").open("ab")
        try:
            self.process = subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        finally:
            out.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ZooKeeperUnavailable(
                    f"ZooKeeper exited with {self.process.returncode}; see {self.data_dir}/stdout.log"
                )
            try:
                if four_letter(self.host, self.port, "ruok", timeout=0.5).startswith("imok"):
                    return self.connect
            except OSError:
                pass
            time.sleep(0.05)
        self.stop()
        raise ZooKeeperUnavailable(f"ZooKeeper did not answer 'ruok' within {timeout:.0f}s")

    def wait_serving(self, *, timeout: float = 30.0) -> str:
        """Wait until the server serves clients (an ensemble member: has joined a quorum);
        returns its mode."""
        deadline = time.monotonic() + timeout
        while True:
            mode = self.mode()
            if mode is not None:
                return mode
            if self.process is not None and self.process.poll() is not None:
                raise ZooKeeperUnavailable(
                    f"ZooKeeper exited with {self.process.returncode}; see {self.data_dir}/stdout.log")
            if time.monotonic() > deadline:
                raise ZooKeeperUnavailable(
                    f"ZooKeeper at {self.connect} serves no clients after {timeout:.0f}s "
                    "(no quorum?)")
            time.sleep(0.05)

    def stop(self, *, timeout: float = 10.0) -> None:
        """Stop the server by PID (its whole process group) and wait for it."""
        proc = self.process
        if proc is None:
            return
        stop_group(proc, timeout=timeout)
        self.process = None

    def kill(self) -> None:
        """``kill -9`` the server (its process group, by PID) and reap it: a crash."""
        proc, self.process = self.process, None
        if proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)

    def __enter__(self) -> ZooKeeperServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@dataclass
class ZooKeeperEnsemble:
    """ZooKeeper servers on 127.0.0.1 that form one ensemble, each its own process.

    Member ``k`` (``server.k``, ``myid`` k) lives in ``root/zk<k>``; one member is a
    standalone server in ``root`` itself, exactly :class:`ZooKeeperServer` alone. Members
    are stopped, killed and restarted one by one (``nodes[i].stop()``, ``.kill()``,
    ``.start()``, all by PID); :attr:`connect` lists every member, so a client moves to a
    surviving one on its own.
    """

    nodes: tuple[ZooKeeperServer, ...]

    @classmethod
    def build(cls, root: Path, members: Sequence[ZkNode], *, tick_ms: int = 500,
              min_session_ms: int = 1000, max_session_ms: int = 10000,
              heap_mb: int = 256) -> ZooKeeperEnsemble:
        """The servers for ``members`` (as recorded; nothing starts)."""
        ensemble = tuple(members) if len(members) > 1 else ()
        return cls(tuple(
            ZooKeeperServer(root / m.name if ensemble else root, port=m.port, host=m.host,
                            tick_ms=tick_ms, min_session_ms=min_session_ms,
                            max_session_ms=max_session_ms, heap_mb=heap_mb,
                            server_id=m.server_id if ensemble else 0, ensemble=ensemble,
                            prefix=m.prefix)
            for m in members
        ))

    @classmethod
    def on_free_ports(cls, root: Path, *, size: int = 3, port: Callable[[], int] = free_port,
                      tick_ms: int = 500, min_session_ms: int = 1000,
                      max_session_ms: int = 10000, heap_mb: int = 256,
                      placement: Placement | None = None) -> ZooKeeperEnsemble:
        """``size`` members with fresh ports (one member: a standalone server), all on
        ``placement`` (default: 127.0.0.1, started as it is)."""
        if size < 1:
            raise ValueError(f"an ensemble needs at least one server, got {size}")
        at = placement or Placement()
        members = ([ZkNode(0, port(), host=at.host, prefix=at.prefix)] if size == 1 else
                   [ZkNode(k, port(), port(), port(), at.host, at.prefix)
                    for k in range(1, size + 1)])
        return cls.build(root, members, tick_ms=tick_ms, min_session_ms=min_session_ms,
                         max_session_ms=max_session_ms, heap_mb=heap_mb)

    @property
    def members(self) -> tuple[ZkNode, ...]:
        """What to record to rebuild these servers with :meth:`build`."""
        if len(self.nodes) == 1:
            node = self.nodes[0]
            return (ZkNode(0, node.port, host=node.host, prefix=node.prefix),)
        return self.nodes[0].ensemble

    @property
    def connect(self) -> str:
        """Every member's ``host:port``, comma-separated, without a chroot."""
        return zk_hosts(self.members)

    @property
    def quorum(self) -> int:
        return len(self.nodes) // 2 + 1

    def start(self, *, timeout: float = 60.0) -> str:
        """Start every member, then wait until each serves clients (a quorum formed and
        everyone joined it); returns :attr:`connect`. On failure everything started is
        stopped again."""
        deadline = time.monotonic() + timeout
        try:
            for node in self.nodes:
                node.start(timeout=max(1.0, deadline - time.monotonic()))
            for node in self.nodes:
                node.wait_serving(timeout=max(1.0, deadline - time.monotonic()))
        except BaseException:
            self.stop()
            raise
        return self.connect

    def stop(self, *, timeout: float = 10.0) -> None:
        """Stop every member that runs, by PID."""
        for node in self.nodes:
            node.stop(timeout=timeout)

    def modes(self) -> list[str | None]:
        """Each member's :meth:`ZooKeeperServer.mode`, in member order."""
        return [node.mode() for node in self.nodes]

    def leader(self) -> ZooKeeperServer | None:
        """The member that says it leads (the standalone server of a one-member one)."""
        for node in self.nodes:
            if node.mode() in ("leader", "standalone"):
                return node
        return None

    def wait_leader(self, *, timeout: float = 30.0,
                    among: Sequence[ZooKeeperServer] | None = None) -> ZooKeeperServer:
        """Wait until one of ``among`` (default: every member) leads and returns it."""
        candidates = tuple(among) if among is not None else self.nodes
        deadline = time.monotonic() + timeout
        while True:
            for node in candidates:
                if node.mode() in ("leader", "standalone"):
                    return node
            if time.monotonic() > deadline:
                raise ZooKeeperUnavailable(f"no leader among {len(candidates)} ZooKeeper "
                                           f"servers after {timeout:.0f}s: {self.modes()}")
            time.sleep(0.02)

    def __enter__(self) -> ZooKeeperEnsemble:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
