"""What every test suite needs, once: processes stopped by PID, polling, raw requests.

Why this module exists: the broker, operator, harness and SLA suites all start real
processes (brokers, controllers) on 127.0.0.1, wait for conditions that have no event to
wait on, and speak raw frames to a broker. Each suite used to carry its own copy of each
(five to ten of some). These are the one copy; the fixtures built on them are in
:mod:`understudy_harness.pytest_plugin`. Being a module of an installed package (not a
``conftest.py``), it can be imported by any test file.

Nothing here asserts a duration: a timeout only bounds a hang, and its failure says what
was being waited for.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import importlib.util
import inspect
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType, ModuleType
from typing import Any, Self, TypeVar

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from understudy_broker import protocol as p
from understudy_broker.client import request_once
from understudy_broker.model import Permission
from understudy_broker.zkclient import close_client, make_client
from understudy_broker.zklayout import BrokerSpec, GroupConfig, decode_isr, isr_path
from understudy_operator.local.plan import understudy_argv
from understudy_operator.local.ports import free_port

T = TypeVar("T")
P = TypeVar("P", bound="Process")

#: ``understudy ...`` with this interpreter (no PATH lookup).
UNDERSTUDY = understudy_argv()


# ----------------------------------------------------------------------- polling


async def eventually(
    cond: Callable[[], Any],
    what: str = "",
    within_s: float = 20.0,
    *,
    interval_s: float = 0.02,
    tolerate: tuple[type[BaseException], ...] = (),
) -> Any:
    """Poll ``cond`` (sync or async) until it returns something truthy, and return that.
    Exceptions of the ``tolerate`` types count as "not yet" (a check that looks into
    objects still being created). Raises ``AssertionError`` naming ``what`` and the last
    value after ``within_s``: that bounds a hang, it is not a timing assertion."""
    deadline = time.monotonic() + within_s
    last: Any = None
    while True:
        try:
            result = cond()
            if inspect.isawaitable(result):
                result = await result
            last = result
            if result:
                return result
        except tolerate as exc:
            last = exc
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or cond}: last={last!r}")
        await asyncio.sleep(interval_s)


def load_script(path: Path, name: str) -> ModuleType:
    """Import a script that is not in a package (``bench/*.py``, ``charts/tools/*.py``) as
    module ``name``, registered in ``sys.modules`` (its dataclasses look their module up)."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def wait_until(cond: Callable[[], T], what: str = "", within_s: float = 20.0, *,
               interval_s: float = 0.05, ok: Callable[[T], object] = bool) -> T:
    """:func:`eventually` for synchronous tests. With ``ok``, ``cond`` is a reading and
    ``ok`` judges it, so a timeout reports the last reading itself."""
    deadline = time.monotonic() + within_s
    while True:
        result = cond()
        if ok(result):
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or cond}: last={result!r}")
        time.sleep(interval_s)


# ----------------------------------------------------------------------- signals


def _interrupted(signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")


def end_on_sigterm() -> None:
    """SIGTERM (a CI job's timeout, ``kill``, a closed terminal) ends the process as
    Ctrl-C does, by unwinding, so that every ``finally`` and fixture stops the servers it
    started, by PID; Python's default ends it at once. Only from the main thread, and only
    over the default (a handler of the caller's own stays): the test runs' plugin and the
    benchmark scripts."""
    if (threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL):
        signal.signal(signal.SIGTERM, _interrupted)


# ----------------------------------------------------------------------- ZooKeeper


K = TypeVar("K", bound=KazooClient)


@contextlib.contextmanager
def _started(client: K) -> Iterator[K]:
    client.start(timeout=10)
    try:
        yield client
    finally:
        close_client(client)


def zk_session(connect: str, *, timeout_s: float = 5.0) -> contextlib.AbstractContextManager[Any]:
    """A started (synchronous) kazoo client on ``connect`` for a test to read and write
    znodes directly, the way a person or a misbehaving party would; stopped afterwards."""
    return _started(make_client(connect, timeout_s=timeout_s))


class CountingClient(KazooClient):  # type: ignore[misc]
    """A real kazoo client that counts, by path, the calls its DataWatch and ChildrenWatch
    recipes make to their functions (the first read, then one per notification): what a
    cluster view is notified of (kazoo sets its recipes on the instance)."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.calls: dict[str, int] = {}
        for recipe in ("DataWatch", "ChildrenWatch"):
            setattr(self, recipe, self._counted(self.__dict__[recipe]))

    def _counted(self, real: Any) -> Callable[..., Any]:
        def watch(path: str, func: Any, *args: Any, **kw: Any) -> Any:
            def counted(*a: Any) -> Any:
                self.calls[path] = self.calls.get(path, 0) + 1
                return func(*a)
            return real(path, counted, *args, **kw)
        return watch


def counting_session(connect: str) -> contextlib.AbstractContextManager[CountingClient]:
    """A started :class:`CountingClient` on ``connect``, stopped afterwards."""
    return _started(CountingClient(hosts=connect, timeout=2.0))


def isr_record(zk: Any, group: str) -> frozenset[str] | None:
    """The group's in-sync record (``/groups/<g>/isr``) as a started kazoo client reads it;
    None while there is none."""
    try:
        return decode_isr(zk.get(isr_path(group))[0])
    except NoNodeError:
        return None


def paper_group(group: str, *names: str) -> GroupConfig:
    """A valid config for brokers that never run (the first is the master, the rest
    slaves; ports are placeholders): for tests of what reads and writes the znodes."""
    return GroupConfig(group=group, brokers=tuple(
        BrokerSpec(name, i, "127.0.0.1", 3 * i + 1, 3 * i + 2, 3 * i + 3,
                   Permission.FULL if i == 0 else Permission.READ)
        for i, name in enumerate(names)
    )).validate()


# ----------------------------------------------------------------------- raw frames


async def raw_request(address: str, op: int, body: bytes = b"", *, epoch: int = 0,
                      timeout_s: float = 5.0) -> p.Frame:
    """One request on a fresh connection; the response frame whatever its status."""
    return await request_once(address, p.Op(op), body, epoch=epoch, timeout_s=timeout_s)


async def read_frame(reader: asyncio.StreamReader, *, timeout_s: float = 5.0) -> p.Frame:
    """The next whole frame from ``reader`` (for tests that write raw bytes themselves)."""
    dec = p.FrameDecoder()
    while True:
        frame = dec.next_frame()
        if isinstance(frame, p.Frame):
            return frame
        async with asyncio.timeout(timeout_s):
            data = await reader.read(65536)
        if not data:
            raise ConnectionError("closed before a full frame arrived")
        dec.feed(data)


async def heartbeat(address: str) -> p.HeartbeatResponse:
    frame = await raw_request(address, p.Op.HEARTBEAT, b"{}")
    return p.HeartbeatResponse.decode(frame.body)


async def queue_bodies(address: str, topic: str, queue: int) -> list[bytes]:
    """Every body stored in one queue of the broker at ``address``, from its start, in
    offset order (plain PULLs, no consumer group)."""
    out: list[bytes] = []
    offset = 0
    while True:
        frame = await request_once(address, p.Op.PULL,
                                   p.PullRequest(topic, queue, offset, 1 << 20, 0).encode(),
                                   timeout_s=10)
        resp = p.PullResponse.decode(frame.body)
        if not resp.records:
            return out
        out += [r.body for r in resp.records]
        offset = resp.next_offset


async def wait_caught_up(master: str, slave: str, *, within_s: float = 15.0) -> int:
    """Wait until the slave's log ends where the master's does; returns that offset."""

    async def same() -> tuple[int] | None:  # a tuple: offset 0 is a valid answer
        m, s = await heartbeat(master), await heartbeat(slave)
        return (m.max_phys,) if m.max_phys == s.max_phys else None

    (end,) = await eventually(same, f"{slave} to catch up with {master}", within_s=within_s,
                              interval_s=0.05)
    return int(end)


# ----------------------------------------------------------------------- process figures


def rss_mib(pid: int) -> float:
    """A process's resident memory (``VmRSS``), in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def open_fds(pid: int) -> int:
    """How many file descriptors a process has open."""
    return len(os.listdir(f"/proc/{pid}/fd"))


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time a process has used."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# ----------------------------------------------------------------------- processes


def _die_with_parent() -> None:
    """Linux: the child gets SIGTERM if the test process itself is killed (no teardown)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


@dataclass
class Process:
    """One server process started by a test, in its own process group, stopped by PID.

    ``port``: :meth:`start` returns once something listens there. ``pid_file``: the PID
    is written there at every start (the local controller's process table reads it).
    ``pids`` lists every incarnation."""

    name: str
    argv: list[str]
    log_path: Path
    port: int | None = None
    pid_file: Path | None = None
    proc: subprocess.Popen[bytes] | None = None
    pids: list[int] = field(default_factory=list)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        if self.proc is None:
            raise RuntimeError(f"{self.name} is not running")
        return self.proc.pid

    def poll(self) -> int | None:
        """The exit code once the current incarnation exited (``None`` while it runs)."""
        return None if self.proc is None else self.proc.poll()

    @property
    def starts(self) -> int:
        return len(self.pids)

    def start(self, *, wait_port: bool = True, timeout_s: float = 15.0) -> Self:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.command(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True, preexec_fn=_die_with_parent,
            )
        self.pids.append(self.proc.pid)
        if self.pid_file is not None:
            self.pid_file.parent.mkdir(parents=True, exist_ok=True)
            self.pid_file.write_text(str(self.proc.pid))
        if not wait_port or self.port is None:
            return self
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.log()}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), 0.2):
                return self
            time.sleep(0.05)
        self.kill9()
        raise RuntimeError(f"{self.name} did not listen within {timeout_s}s:\n{self.log()}")

    def command(self) -> list[str]:
        """The argv a start runs (read at every start)."""
        return self.argv

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

    def kill9(self) -> int:
        """SIGKILL the process group; returns ``time.time_ns()`` taken once it is gone."""
        proc, self.proc = self.proc, None
        if proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)
        return time.time_ns()

    def restart(self) -> Self:
        self.stop()
        return self.start()


@dataclass
class BrokerProc(Process):
    """An ``understudy broker`` with its data directory and ports (``argv`` is unused);
    ``extra`` flags follow the ones this builds (``--data-dir``, ``--port``, ``--http-port``, ``--name``,
    ``--replication-port`` for a master)."""

    data_dir: Path = Path()
    http_port: int = 0
    replication_port: int | None = None
    extra: list[str] = field(default_factory=list)
    log_level: str = "WARNING"

    def command(self) -> list[str]:
        """Built at every start, so a test may change ``extra`` before (re)starting."""
        args = [
            *UNDERSTUDY, "broker",
            "--data-dir", str(self.data_dir),
            "--port", str(self.port),
            "--http-port", str(self.http_port),
            "--name", self.name,
            "--log-level", self.log_level,
        ]
        if self.replication_port is not None:
            args += ["--replication-port", str(self.replication_port)]
        return args + self.extra


class Brokers:
    """Brokers (and other processes) started by one test; all stopped at its end."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.procs: list[Process] = []

    def add(self, proc: P) -> P:
        self.procs.append(proc)
        return proc

    def master(self, name: str = "m", *, extra: list[str] | None = None,
               start: bool = True) -> BrokerProc:
        b = BrokerProc(name=name, argv=[], log_path=self.root / f"{name}.log", port=free_port(),
                       data_dir=self.root / name, http_port=free_port(),
                       replication_port=free_port(), extra=list(extra or []))
        self.add(b)
        return b.start() if start else b

    def slave(self, master: BrokerProc, name: str = "s", *, extra: list[str] | None = None,
              start: bool = True) -> BrokerProc:
        b = BrokerProc(name=name, argv=[], log_path=self.root / f"{name}.log", port=free_port(),
                       data_dir=self.root / name, http_port=free_port(),
                       extra=["--role", "slave", "--master",
                              f"127.0.0.1:{master.replication_port}", *(extra or [])])
        self.add(b)
        return b.start() if start else b

    def stop_all(self) -> None:
        for proc in reversed(self.procs):
            proc.stop()


class SmallDisk:
    """A tmpfs of a chosen size mounted on a test's directory: a real filesystem that
    fills up (``ENOSPC`` from the kernel, not a mock). :meth:`resize` grows or shrinks it
    in place (``mount -o remount``), the way a volume is grown when space returns;
    :meth:`unmount` (by the fixture, whatever the outcome) removes it. Needs root: where
    the machine refuses the mount, :meth:`mount` raises :class:`PermissionError` with the
    kernel's reason."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.mounted = False

    def _mount(self, *opts: str) -> None:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", ",".join(opts), "tmpfs",
                               str(self.path)], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise PermissionError(f"cannot mount a tmpfs on {self.path}: "
                                  f"{done.stderr.strip() or done.returncode}")

    def mount(self, size_bytes: int) -> Path:
        self.path.mkdir(parents=True, exist_ok=True)
        self._mount(f"size={size_bytes}")
        self.mounted = True
        return self.path

    def resize(self, size_bytes: int) -> None:
        self._mount("remount", f"size={size_bytes}")

    def free_bytes(self) -> int:
        st = os.statvfs(self.path)
        return st.f_bavail * st.f_frsize

    def unmount(self) -> None:
        if self.mounted:
            subprocess.run(["umount", "-l", str(self.path)], check=False)
            self.mounted = False


class PartitionProxy:
    """A TCP relay between one broker and ZooKeeper that can black-hole the link.

    ``cut()`` makes it a silent partition: established connections stay open but every
    byte is dropped in both directions, and new connections are accepted and left
    silent (counted in ``silent``) — exactly what the broker's kernel sees when a network
    path goes dark, so its ZooKeeper session expires on the server while its process runs
    on. ``heal()`` closes the dead connections (the client reconnects at once) and relays
    again. Cut before a client starts, it holds that client's connect for as long as a
    test likes.
    """

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.listener.getsockname()[1])
        self._cut = threading.Event()
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._socks: list[socket.socket] = []
        self.silent = 0  # connections accepted while cut
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _track(self, *socks: socket.socket) -> None:
        with self._lock:
            self._socks.extend(socks)

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if self._cut.is_set():
                self._track(client)  # silent: never connected upstream, never answered
                self.silent += 1
                continue
            try:
                server = socket.create_connection(self.upstream, timeout=2)
            except OSError:
                client.close()
                continue
            self._track(client, server)
            threading.Thread(target=self._relay, args=(client, server), daemon=True).start()

    def _relay(self, a: socket.socket, b: socket.socket) -> None:
        peers = {a: b, b: a}
        try:
            while not self._closed.is_set():
                ready, _, _ = select.select([a, b], [], [], 0.2)
                for s in ready:
                    data = s.recv(65536)
                    if not data:
                        return
                    if not self._cut.is_set():
                        peers[s].sendall(data)
        except OSError:
            return
        finally:
            a.close()
            b.close()

    def cut(self) -> None:
        self._cut.set()

    def heal(self) -> None:
        with self._lock:
            socks, self._socks = self._socks, []
        for s in socks:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()
        self._cut.clear()

    def close(self) -> None:
        self._closed.set()
        # A thread blocked in accept() is not woken by close() from another thread on
        # Linux (close then waited its 5 s join and left the thread behind); shutdown()
        # wakes it.
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()
        self.heal()
        self._thread.join(5)
