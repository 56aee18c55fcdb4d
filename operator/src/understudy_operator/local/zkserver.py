"""A private ZooKeeper server from the Debian ``zookeeper`` package.

Why this module exists: the local cluster (``understudy local up``), the drill and every
test that needs coordination start their own ZooKeeper on 127.0.0.1, on a free port, with a
short tick so that session expiry is fast (1 s sessions expire in ~1.1-1.4 s). kazoo's own
test harness hard-codes a 2 s tick and needs extra jars; this is simpler and matches what
the product runs against.

The server is a child process in its own process group; :meth:`ZooKeeperServer.stop` kills
that group by PID and waits, so nothing outlives its owner.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

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


@dataclass
class ZooKeeperServer:
    """One standalone ZooKeeper server.

    ``min_session_ms``/``max_session_ms`` bound what clients may negotiate; the server
    clamps a requested session timeout into that range.
    """

    data_dir: Path
    port: int = 0
    host: str = "127.0.0.1"
    tick_ms: int = 500
    min_session_ms: int = 1000
    max_session_ms: int = 10000
    heap_mb: int = 256
    process: subprocess.Popen[bytes] | None = None

    @property
    def connect(self) -> str:
        """The connect string (``host:port``), without a chroot."""
        return f"{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

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
        (conf / "zoo.cfg").write_text(
            "\n".join(
                [
                    f"tickTime={self.tick_ms}",
                    f"dataDir={self.data_dir / 'data'}",
                    f"clientPort={self.port}",
                    f"clientPortAddress={self.host}",
                    f"minSessionTimeout={self.min_session_ms}",
                    f"maxSessionTimeout={self.max_session_ms}",
                    "4lw.commands.whitelist=ruok,srvr,stat,mntr,cons",
                    "admin.enableServer=false",
                    "maxClientCnxns=0",
                    "",
                ]
            )
        )
        (conf / "log4j.properties").write_text(LOG4J.format(log=self.data_dir / "zookeeper.log"))
        cmd = [
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
            str(conf / "zoo.cfg"),
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

    def stop(self, *, timeout: float = 10.0) -> None:
        """Stop the server by PID (its whole process group) and wait for it."""
        proc = self.process
        if proc is None:
            return
        stop_group(proc, timeout=timeout)
        self.process = None

    def __enter__(self) -> ZooKeeperServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
