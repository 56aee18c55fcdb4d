"""Fixtures that run real broker processes on 127.0.0.1.

Every broker is the ``understudy broker`` console script in its own process group; the
fixture that starts it stops it by PID (SIGTERM, then SIGKILL of the group) even when the
test fails, and a test can ``kill9()`` or ``restart()`` it on purpose.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from understudy_broker import protocol as p
from understudy_operator.zkserver import free_port

UNDERSTUDY = str(Path(sys.executable).with_name("understudy"))


def _die_with_parent() -> None:
    """Linux: the broker gets SIGTERM if pytest itself is killed (no teardown then)."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


@dataclass
class BrokerProc:
    name: str
    data_dir: Path
    port: int
    http_port: int
    replication_port: int | None
    extra: list[str]
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0
    history: list[int] = field(default_factory=list)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        if self.proc is None:
            raise RuntimeError(f"{self.name} is not running")
        return self.proc.pid

    def argv(self) -> list[str]:
        args = [
            UNDERSTUDY, "broker",
            "--data-dir", str(self.data_dir),
            "--port", str(self.port),
            "--http-port", str(self.http_port),
            "--name", self.name,
            "--log-level", "WARNING",
        ]
        if self.replication_port is not None:
            args += ["--replication-port", str(self.replication_port)]
        return args + self.extra

    def start(self, *, timeout_s: float = 15.0) -> BrokerProc:
        self.starts += 1
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child
        try:
            self.proc = subprocess.Popen(
                self.argv(),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        finally:
            log.close()
        self.history.append(self.proc.pid)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.log()}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), 0.2):
                return self
            time.sleep(0.05)
        self.kill9()
        raise RuntimeError(f"{self.name} did not listen within {timeout_s}s:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self, *, timeout_s: float = 10.0) -> int | None:
        """SIGTERM and wait; SIGKILL the group if it does not exit. Returns the exit code."""
        proc, self.proc = self.proc, None
        if proc is None:
            return None
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)
        return proc.returncode

    def kill9(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(5)

    def restart(self) -> BrokerProc:
        self.stop()
        return self.start()


class Cluster:
    """Brokers started by one test; all stopped at the end."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.brokers: list[BrokerProc] = []

    def master(self, name: str = "m", *, extra: list[str] | None = None, start: bool = True) -> BrokerProc:
        b = BrokerProc(
            name=name,
            data_dir=self.root / name,
            port=free_port(),
            http_port=free_port(),
            replication_port=free_port(),
            extra=list(extra or []),
            log_path=self.root / f"{name}.log",
        )
        self.brokers.append(b)
        return b.start() if start else b

    def slave(
        self, master: BrokerProc, name: str = "s", *, extra: list[str] | None = None, start: bool = True
    ) -> BrokerProc:
        b = BrokerProc(
            name=name,
            data_dir=self.root / name,
            port=free_port(),
            http_port=free_port(),
            replication_port=None,
            extra=["--role", "slave", "--master", f"127.0.0.1:{master.replication_port}",
                   *(extra or [])],
            log_path=self.root / f"{name}.log",
        )
        self.brokers.append(b)
        return b.start() if start else b

    def stop_all(self) -> None:
        for b in self.brokers:
            b.stop()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path)
    try:
        yield c
    finally:
        c.stop_all()


@pytest.fixture(scope="module")
def module_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(tmp_path_factory.mktemp("brokers"))
    try:
        yield c
    finally:
        c.stop_all()


# ---- a tiny raw client for tests that need exact frames ------------------------------


async def raw_request(
    address: str, op: int, body: bytes = b"", *, epoch: int = 0, timeout_s: float = 5.0
) -> p.Frame:
    """One request on a fresh connection; returns the response frame (any status)."""
    host, port = address.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(p.encode_frame(request_id=7, op=op, epoch=epoch, body=body))
        return await read_frame(reader, timeout_s=timeout_s)
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


async def read_frame(reader: asyncio.StreamReader, *, timeout_s: float = 5.0) -> p.Frame:
    dec = p.FrameDecoder()
    while True:
        frame = dec.next_frame()
        if isinstance(frame, p.Frame):
            return frame
        data = await asyncio.wait_for(reader.read(65536), timeout_s)
        if not data:
            raise ConnectionError("closed before a full frame arrived")
        dec.feed(data)


async def wait_caught_up(master: BrokerProc, slave: BrokerProc, *, timeout_s: float = 15.0) -> int:
    """Wait until the slave's max physical offset equals the master's; return it."""
    deadline = time.monotonic() + timeout_s
    while True:
        m = p.HeartbeatResponse.decode((await raw_request(master.address, p.Op.HEARTBEAT, b"{}")).body)
        s = p.HeartbeatResponse.decode((await raw_request(slave.address, p.Op.HEARTBEAT, b"{}")).body)
        if m.max_phys == s.max_phys:
            return m.max_phys
        if time.monotonic() > deadline:
            raise TimeoutError(f"slave at {s.max_phys}, master at {m.max_phys}")
        await asyncio.sleep(0.05)


class Wire:
    """The helpers above, handed to tests as a fixture (importlib mode cannot import
    conftest as a module)."""

    raw_request = staticmethod(raw_request)
    read_frame = staticmethod(read_frame)
    wait_caught_up = staticmethod(wait_caught_up)
    free_port = staticmethod(free_port)


@pytest.fixture
def wire() -> type[Wire]:
    return Wire
