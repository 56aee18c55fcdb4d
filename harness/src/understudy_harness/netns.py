"""Network namespaces for real partitions: hosts on a private bridge, each host-to-host
path cut, healed, or made lossy and slow on its own.

Why this module exists: a partition is not a dead process. A master cut from ZooKeeper
but not from its slave, or from both but not from a client, runs on believing what it
last heard; only a network that really drops packets shows what the product does then.
The user-space relay of ``tests/test_failover_faults.py`` cuts one TCP link of one
process; this cuts paths between hosts, for every protocol at once.

Topology (:class:`Network`): a *hub* namespace holding a Linux bridge, and per host a
namespace with one veth ``eth0`` (address ``10.77.0.<k>/24``) whose peer is a port of the
bridge. Everything lives in namespaces created here: nothing is added to the namespace
the tests run in, and no route leads anywhere else. A process is put on a host with the
argv prefix ``ip netns exec <netns>`` (:attr:`NetHost.prefix`; ``ip`` execs, so the PID is
the program's); code of the test process runs on a host in a thread that entered the
namespace (:meth:`Network.call`: a network namespace belongs to a thread, and the
threads and processes it starts inherit it).

* :meth:`Network.cut` ``(a, b)``: each side's INPUT hook drops packets from the other
  (``iptables -I INPUT -s <peer> -j DROP``). Packets leave the sender and are lost on
  the way, in both directions; connections stay open and retransmit, exactly what a dark
  network path looks like. Every other path keeps working. :meth:`Network.heal` removes
  the two rules.
* :meth:`Network.impair` ``(a, b, loss=, delay_ms=)``: on each side, packets from the
  other are dropped with probability ``loss`` (``-m statistic``) and the rest held
  ``delay_ms`` before delivery (``-j NFQUEUE`` into :mod:`understudy_harness.nfqdelay`,
  one process per side, because this machine's kernel has no ``sch_netem``). Each
  direction of the link gets both.

Names: every namespace is ``usnet-<pid>-<n>-<host>`` (the bridge's: ``...-hub``), so the
namespaces of a killed run (its pid gone) are found and removed by
:func:`remove_leftovers`. :meth:`Network.close` stops the delay processes by PID, kills
by PID whatever still runs inside its namespaces (only programs started there by the
test) and deletes them, which removes the veths and the bridge with them.

Needs root, ``iproute2`` and ``iptables``; :func:`unavailable` says why a machine cannot
(the kernel's own words when it refuses ``ip netns add``).
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import os
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Self, TypeVar

T = TypeVar("T")

PREFIX = "usnet"
SUBNET = "10.77.0"
IFNAME = "eth0"
BRIDGE = "br0"
CLONE_NEWNET = 0x40000000
_SBIN = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
_runs = itertools.count(1)


class NetnsError(RuntimeError):
    """A namespace, link or rule could not be made or removed; the message has the
    command and what it printed."""


class NetnsUnavailable(NetnsError):
    """This machine cannot run namespace tests; the message says why."""


def _tool(name: str) -> str:
    found = shutil.which(name, path=_SBIN)
    if found is None:
        raise NetnsUnavailable(f"'{name}' is not installed (Debian package "
                               f"{'iproute2' if name in ('ip', 'tc') else name}; "
                               "run 'make setup')")
    return found


def _run(argv: Sequence[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([_tool(argv[0]), *argv[1:]], capture_output=True, text=True,
                          check=False, stdin=subprocess.DEVNULL)
    if check and done.returncode != 0:
        raise NetnsError(f"{' '.join(argv)}: {done.stderr.strip() or done.returncode}")
    return done


def unavailable() -> str | None:
    """Why this machine cannot run the namespace tests (the tool that is missing, or
    the kernel's answer to ``ip netns add`` and to ``iptables`` inside a namespace), or
    ``None`` when it can."""
    name = f"{PREFIX}-{os.getpid()}-probe"
    try:
        _tool("iptables")
        done = _run(["ip", "netns", "add", name], check=False)
    except NetnsUnavailable as exc:
        return str(exc)
    if done.returncode != 0:
        return f"the kernel refused 'ip netns add': {done.stderr.strip() or done.returncode}"
    try:
        rules = _run(["ip", "netns", "exec", name, "iptables", "-w", "-S"], check=False)
        if rules.returncode != 0:
            return f"iptables does not work in a network namespace: {rules.stderr.strip()}"
    finally:
        _run(["ip", "netns", "del", name], check=False)
    return None


def list_namespaces() -> list[str]:
    """Every network namespace ``ip netns`` knows by name."""
    out = _run(["ip", "netns", "list"], check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _kill_inside(netns: str) -> list[int]:
    """SIGKILL (by PID, woken first) every process in ``netns``, one of ours; returns
    their PIDs."""
    pids = [int(p) for p in _run(["ip", "netns", "pids", netns], check=False).stdout.split()
            if p.isdigit()]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
            os.kill(pid, signal.SIGKILL)
    return pids


def remove_leftovers() -> list[str]:
    """Delete the namespaces of runs whose process is gone (a test killed before its
    teardown), with whatever still runs inside them; returns their names."""
    removed = []
    for netns in list_namespaces():
        parts = netns.split("-")
        if len(parts) < 3 or parts[0] != PREFIX or not parts[1].isdigit():
            continue
        if os.path.exists(f"/proc/{parts[1]}"):
            continue  # its run is alive (or the pid was reused: left alone)
        _kill_inside(netns)
        _run(["ip", "netns", "del", netns], check=False)
        removed.append(netns)
    return removed


def _enter(netns: str) -> None:
    """Move the calling thread into ``netns``."""
    fd = os.open(f"/run/netns/{netns}", os.O_RDONLY)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise NetnsError(f"setns({netns}): {os.strerror(err)}")
    finally:
        os.close(fd)


@dataclass(frozen=True, slots=True)
class NetHost:
    """One host of a :class:`Network`: its namespace and its address on the bridge."""

    name: str
    netns: str
    address: str

    @property
    def prefix(self) -> tuple[str, ...]:
        """The argv prefix that runs a program on this host."""
        return (_tool("ip"), "netns", "exec", self.netns)


@dataclass(slots=True)
class _Delay:
    host: str
    proc: subprocess.Popen[bytes]


class Network:
    """Hosts ``names`` on one bridge; see the module docstring. ``start()`` builds it
    (or raises with what failed, having removed what it made), ``close()`` removes it;
    also a context manager."""

    def __init__(self, names: Sequence[str], *, subnet: str = SUBNET) -> None:
        if not names or len(set(names)) != len(names) or len(names) > 200:
            raise ValueError(f"hosts must be 1-200 distinct names, got {list(names)}")
        run = f"{PREFIX}-{os.getpid()}-{next(_runs)}"
        self.hub = f"{run}-hub"
        self.hosts = {n: NetHost(n, f"{run}-{n}", f"{subnet}.{k + 2}")
                      for k, n in enumerate(names)}
        self._made: list[str] = []
        self._rules: dict[frozenset[str], list[tuple[str, tuple[str, ...]]]] = {}
        self._delays: dict[frozenset[str], list[_Delay]] = {}
        self._cut: set[frozenset[str]] = set()
        self._queues = itertools.count(1)
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ build, remove

    def start(self) -> Self:
        try:
            self._add(self.hub)
            _run(["ip", "-n", self.hub, "link", "add", BRIDGE, "type", "bridge"])
            _run(["ip", "-n", self.hub, "link", "set", BRIDGE, "up"])
            for k, h in enumerate(self.hosts.values()):
                self._add(h.netns)
                port = f"p{k}"
                _run(["ip", "-n", h.netns, "link", "add", IFNAME, "type", "veth", "peer",
                      "name", port, "netns", self.hub])
                _run(["ip", "-n", self.hub, "link", "set", port, "master", BRIDGE, "up"])
                _run(["ip", "-n", h.netns, "addr", "add", f"{h.address}/24", "dev", IFNAME])
                _run(["ip", "-n", h.netns, "link", "set", IFNAME, "up"])
                _run(["ip", "-n", h.netns, "link", "set", "lo", "up"])
        except BaseException:
            self.close()
            raise
        return self

    def _add(self, netns: str) -> None:
        done = _run(["ip", "netns", "add", netns], check=False)
        if done.returncode != 0:
            raise NetnsUnavailable(f"the kernel refused 'ip netns add': {done.stderr.strip()}")
        self._made.append(netns)

    def close(self) -> list[int]:
        """Remove everything: the delay processes (by PID), then each namespace with any
        process still inside it (by PID). Returns those PIDs (a caller that stopped its
        own processes expects none)."""
        with self._lock:
            delays = [d for ds in self._delays.values() for d in ds]
            self._delays.clear()
            self._rules.clear()
            self._cut.clear()
        for d in delays:
            _stop(d.proc)
        leftovers: list[int] = []
        for netns in reversed(self._made):
            leftovers += _kill_inside(netns)
            _run(["ip", "netns", "del", netns], check=False)
        self._made.clear()
        return leftovers

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ hosts

    def host(self, name: str) -> NetHost:
        try:
            return self.hosts[name]
        except KeyError:
            raise ValueError(f"no host {name!r}; hosts: {', '.join(self.hosts)}") from None

    def address(self, name: str) -> str:
        return self.host(name).address

    def popen(self, name: str, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        """Start ``argv`` on host ``name`` (``subprocess.Popen`` keywords pass through)."""
        return subprocess.Popen([*self.host(name).prefix, *argv], **kwargs)

    def call(self, name: str, fn: Callable[[], T]) -> T:
        """Run ``fn`` in a new thread inside host ``name``'s namespace and return its
        result (or raise its exception). Sockets, threads and processes it creates are on
        that host; the calling thread is not moved."""
        netns = self.host(name).netns
        box: list[tuple[bool, Any]] = []

        def target() -> None:
            try:
                _enter(netns)
                box.append((True, fn()))
            except BaseException as exc:
                box.append((False, exc))

        thread = threading.Thread(target=target, name=f"netns-{name}")
        thread.start()
        thread.join()
        ok, value = box[0]
        if not ok:
            raise value
        result: T = value
        return result

    # ------------------------------------------------------------------ faults

    def _iptables(self, host: str, *args: str) -> None:
        _run(["ip", "netns", "exec", self.host(host).netns, "iptables", "-w", *args])

    def _rule(self, pair: frozenset[str], host: str, verb: str, chain_rule: tuple[str, ...]
              ) -> None:
        self._iptables(host, verb, "INPUT", *chain_rule)
        self._rules.setdefault(pair, []).append((host, chain_rule))

    def cut(self, a: str, b: str) -> None:
        """Drop every packet between hosts ``a`` and ``b``, both ways (idempotent)."""
        pair = frozenset((a, b))
        with self._lock:
            if pair in self._cut:
                return
            self._cut.add(pair)
            for me, peer in ((a, b), (b, a)):
                self._rule(pair, me, "-I", ("-s", self.address(peer), "-j", "DROP"))

    def heal(self, a: str, b: str) -> None:
        """Undo :meth:`cut` and :meth:`impair` between ``a`` and ``b``."""
        pair = frozenset((a, b))
        with self._lock:
            rules = self._rules.pop(pair, [])
            delays = self._delays.pop(pair, [])
            self._cut.discard(pair)
        for host, rule in rules:
            self._iptables(host, "-D", "INPUT", *rule)
        for d in delays:  # after the rules: nothing new is queued, what waits is given back
            _stop(d.proc)

    def heal_all(self) -> None:
        with self._lock:
            pairs = list({*self._rules, *self._delays})
        for pair in pairs:
            self.heal(*sorted(pair))

    def impair(self, a: str, b: str, *, loss: float = 0.0, delay_ms: float = 0.0) -> None:
        """Lose ``loss`` of the packets between ``a`` and ``b`` and delay the rest by
        ``delay_ms``, each direction (:meth:`heal` removes it). Raises
        :class:`NetnsUnavailable` where the kernel has no NFQUEUE."""
        if not 0.0 <= loss < 1.0 or delay_ms < 0:
            raise ValueError(f"loss must be in [0, 1) and delay >= 0, got {loss}, {delay_ms}")
        pair = frozenset((a, b))
        for me, peer in ((a, b), (b, a)):
            src = ("-s", self.address(peer))
            if loss:
                with self._lock:
                    self._rule(pair, me, "-A", (*src, "-m", "statistic", "--mode", "random",
                                                "--probability", f"{loss:.4f}", "-j", "DROP"))
            if delay_ms:
                queue = next(self._queues)
                proc = self.popen(me, [sys.executable, "-m", "understudy_harness.nfqdelay",
                                       "--queue", str(queue), "--delay-ms", f"{delay_ms:g}"],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL, start_new_session=True)
                with self._lock:
                    self._delays.setdefault(pair, []).append(_Delay(me, proc))
                _wait_bound(proc)
                with self._lock:
                    self._rule(pair, me, "-A", (*src, "-j", "NFQUEUE", "--queue-num",
                                                str(queue), "--queue-bypass"))


def _wait_bound(proc: subprocess.Popen[bytes], timeout_s: float = 10.0) -> None:
    """Wait for a delay process to say ``bound``; raise with what it said otherwise."""
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout_s
    said = b""
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 0.1)
        if ready:
            chunk = os.read(proc.stdout.fileno(), 4096)
            said += chunk
            if b"bound" in said:
                return
            if not chunk:
                break
    _stop(proc)
    raise NetnsUnavailable("cannot delay packets with NFQUEUE here: "
                           + (said.decode(errors="replace").strip() or "no answer"))


def _stop(proc: subprocess.Popen[bytes], timeout_s: float = 5.0) -> None:
    """SIGTERM one process by PID (it gives its packets back), SIGKILL if it lingers."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout_s)
    if proc.stdout is not None:
        proc.stdout.close()
