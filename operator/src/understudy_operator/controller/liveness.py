"""Pluggable liveness sources: what the platform says about each broker's process.

Why this module exists: DESIGN splits down-signals into *certain* (the process exited, the
container terminated — act at once, on the event) and *ambiguous* (stopped, unreachable —
confirm over several checks). Where that knowledge comes from differs by platform — the
process table in local mode, pod and container status under Kubernetes — while the
controller is the same code. A :class:`LivenessSource` answers ``process_state(broker)``
and calls its listeners when a certain death happens, so the driver can wake at once
instead of waiting for its periodic check.

:class:`ProcessTableLiveness` (local mode) reads ``<pid-dir>/<broker>.pid``. For each pid
it opens a pidfd (``os.pidfd_open``) and registers it with the event loop: the kernel
makes a pidfd readable when that very process exits, so an exit is an *event*, immune to
pid reuse while the fd is open. ``/proc/<pid>/stat`` state ``T``/``t`` means stopped
(ambiguous); ``Z``/``X`` means exited (a zombie cannot serve).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from understudy_operator.controller.observe import ProcessState

log = logging.getLogger(__name__)

Listener = Callable[[str], None]


class LivenessSource(Protocol):
    """Process/container state per broker."""

    def track(self, brokers: Iterable[str]) -> None:
        """Set the brokers to follow (the group configs name them)."""
        ...

    def process_state(self, broker: str) -> ProcessState:
        """The broker's process state now (may do a cheap local read)."""
        ...

    def subscribe(self, listener: Listener) -> None:
        """Call ``listener(broker)`` on the loop when a broker's process certainly exits."""
        ...

    def close(self) -> None: ...


class NullLiveness:
    """No platform evidence: every broker is ``UNKNOWN`` and decisions rest on ZooKeeper."""

    def track(self, brokers: Iterable[str]) -> None:
        return None

    def process_state(self, broker: str) -> ProcessState:
        return ProcessState.UNKNOWN

    def subscribe(self, listener: Listener) -> None:
        return None

    def close(self) -> None:
        return None


def _read_small(path: str | Path, size: int) -> bytes:
    """The first ``size`` bytes of a small file, by ``os.open``/``os.read``: every check of
    every group reads each broker's ``/proc/<pid>/stat`` (and its pid file when no pidfd
    follows the process), and through ``pathlib`` those reads were over half of the
    controller's event-loop time at rest (``bench/scale.py``, 20 groups, py-spy: 58 us a
    broker, 17 us this way)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.read(fd, size)
    finally:
        os.close(fd)


def read_pid_file(path: Path) -> int | None:
    """The pid in ``path``, or ``None`` if the file is missing or malformed (logged)."""
    try:
        text = _read_small(path, 4096).decode("ascii", errors="replace").strip()
    except FileNotFoundError:
        return None
    except OSError as exc:
        log.warning("cannot read pid file %s: %s", path, exc)
        return None
    if not text.isdigit() or int(text) <= 0:
        log.warning("pid file %s does not hold a pid: %r", path, text[:40])
        return None
    return int(text)


def proc_state_letter(pid: int) -> str | None:
    """The state letter from ``/proc/<pid>/stat`` (``R``, ``S``, ``T``, ``Z``, ...), or
    ``None`` if the process does not exist. The command name may contain spaces and
    parentheses, so parse after the *last* ``)``."""
    try:
        raw = _read_small(f"/proc/{pid}/stat", 4096)
    except (FileNotFoundError, ProcessLookupError):
        return None
    except OSError:
        return None
    tail = raw[raw.rfind(b")") + 1 :].split()
    return tail[0].decode("ascii", "replace") if tail else None


def classify(letter: str | None) -> ProcessState:
    if letter is None or letter in ("Z", "X", "x"):
        return ProcessState.EXITED
    if letter in ("T", "t"):
        return ProcessState.STOPPED
    return ProcessState.RUNNING


@dataclass
class _Tracked:
    pid: int
    fd: int | None
    exited: bool = False


class ProcessTableLiveness:
    """Local-mode liveness from pid files and the process table (see module docstring).

    A missing pid file means ``UNKNOWN`` (not yet started by this cluster, or removed);
    a pid file whose process is gone means ``EXITED``.
    """

    def __init__(self, pid_dir: Path, loop: asyncio.AbstractEventLoop) -> None:
        self._dir = pid_dir
        self._loop = loop
        self._brokers: set[str] = set()
        self._tracked: dict[str, _Tracked] = {}
        self._listeners: list[Listener] = []

    def track(self, brokers: Iterable[str]) -> None:
        wanted = set(brokers)
        for gone in self._brokers - wanted:
            self._forget(gone)
        self._brokers = wanted
        for name in wanted:
            self.process_state(name)  # open pidfds now, so exits are events from here on

    def subscribe(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def process_state(self, broker: str) -> ProcessState:
        """What the process table says of ``broker``'s process now. While its pidfd is
        open the pid cannot have moved to another process (a broker that restarts exits
        first, and the pidfd reports it): only ``/proc/<pid>/stat`` is read, for a stop.
        Otherwise the pid file is read again (started, restarted or removed): every check
        of every group asks, and the pid file was half of this call's time."""
        tracked = self._tracked.get(broker)
        if tracked is None or tracked.fd is None or tracked.exited:
            pid = read_pid_file(self._dir / f"{broker}.pid")
            if pid is None:
                self._forget(broker)
                return ProcessState.UNKNOWN
            if tracked is None or tracked.pid != pid:
                self._forget(broker)
                tracked = self._open(broker, pid)
            if tracked.exited:
                return ProcessState.EXITED
        state = classify(proc_state_letter(tracked.pid))
        if state is ProcessState.EXITED:
            # Seen here before the pidfd's readiness reached the loop (a busy loop runs
            # the check first): this is the exit's event, announced now. Otherwise a
            # check could act on the exit (FENCING, SLAVE_CONSUME, the slave's READ) and
            # the exit event be dated after it, as a drill's SLA once showed.
            self._on_exit(broker, tracked.pid)
        return state

    def _open(self, broker: str, pid: int) -> _Tracked:
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            tracked = _Tracked(pid=pid, fd=None, exited=True)
        except OSError as exc:  # no pidfd support: fall back to /proc polling
            log.debug("pidfd_open(%d) failed: %s", pid, exc)
            tracked = _Tracked(pid=pid, fd=None)
        else:
            tracked = _Tracked(pid=pid, fd=fd)
            self._loop.add_reader(fd, self._on_exit, broker, pid)
        self._tracked[broker] = tracked
        return tracked

    def _on_exit(self, broker: str, pid: int) -> None:
        tracked = self._tracked.get(broker)
        if tracked is None or tracked.pid != pid:
            return
        if tracked.fd is not None:
            self._loop.remove_reader(tracked.fd)
            os.close(tracked.fd)
            tracked.fd = None
        tracked.exited = True
        log.info("broker %s: process %d exited", broker, pid)
        for listener in self._listeners:
            listener(broker)

    def _forget(self, broker: str) -> None:
        tracked = self._tracked.pop(broker, None)
        if tracked is not None and tracked.fd is not None:
            self._loop.remove_reader(tracked.fd)
            with contextlib.suppress(OSError):
                os.close(tracked.fd)

    def close(self) -> None:
        for name in list(self._tracked):
            self._forget(name)
