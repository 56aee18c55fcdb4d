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
from understudy_operator.local.procs import pid_file, proc_state_letter, read_pid_file

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
        self._pid_files: dict[str, str] = {}  # broker -> its pid file, named once

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
        of every group asks, and the pid file was half of this call's time (its path is
        built once per broker: ``pathlib`` was a third of that half in a 20-group failover)."""
        tracked = self._tracked.get(broker)
        if tracked is None or tracked.fd is None or tracked.exited:
            path = self._pid_files.get(broker)
            if path is None:
                path = self._pid_files[broker] = str(pid_file(self._dir, broker))
            pid = read_pid_file(path)
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
