"""The per-broker permission-change log: ``<data-dir>/permissions.jsonl``.

Why this module exists: invariant 1 ("one reader") is judged after the fact from every
broker's own record of when it held effective READ (DESIGN "Checker definitions"). Metrics
scraped every second cannot show a 50 ms overlap; a log written by the broker at the
instant its permission changes can. Each line is one JSON object::

    {"t_ns": 1763683200123456789, "group": "g1", "broker": "g1-0",
     "effective": "FULL", "epoch": 7, "pid": 4242}

``t_ns`` is ``time.time_ns()`` (one clock for every broker on one machine), ``effective``
the permission name, ``epoch`` the group epoch the broker had applied, ``pid`` the process
that wrote it (a restarted broker appends to the same file, so the pid tells incarnations
apart). A line is written when the pair (effective, epoch) changes, when the broker starts
(its first value, marked ``"start": true``; no other line has the key) and when it stops
cleanly (``NONE``). In a container every incarnation is PID 1, so the start mark is what
tells them apart there. A broker killed with SIGKILL
writes nothing at its death: a checker must end that incarnation's READ at the kill.

Each line is flushed to the operating system before :meth:`PermissionLog.record` returns,
so it survives the process being killed. A write error is logged and never stops the
broker: the data path does not depend on this record.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from understudy_broker.model import Permission

log = logging.getLogger(__name__)

FILE_NAME = "permissions.jsonl"
CONTENT_TYPE = "application/x-ndjson"


class PermissionLogError(ValueError):
    """A line of the log is not a permission change; the message names the line."""


@dataclass(frozen=True, slots=True)
class PermissionChange:
    """One line of the log."""

    t_ns: int
    group: str
    broker: str
    effective: Permission
    epoch: int
    pid: int
    #: The first line its process wrote (absent from logs written before the mark).
    start: bool = False

    def to_json(self) -> str:
        doc: dict[str, object] = {
            "t_ns": self.t_ns, "group": self.group, "broker": self.broker,
            "effective": self.effective.label, "epoch": self.epoch, "pid": self.pid}
        if self.start:
            doc["start"] = True
        return json.dumps(doc, separators=(",", ":"))

    @classmethod
    def from_json(cls, line: str) -> PermissionChange:
        try:
            doc = json.loads(line)
            if not isinstance(doc, dict):
                raise TypeError("not an object")
            t_ns, epoch, pid = doc["t_ns"], doc["epoch"], doc.get("pid", 0)
            if not all(isinstance(v, int) and not isinstance(v, bool) for v in (t_ns, epoch, pid)):
                raise TypeError("t_ns, epoch and pid must be integers")
            start = doc.get("start", False)
            if not isinstance(start, bool):
                raise TypeError("start must be true or false")
            return cls(t_ns=t_ns, group=str(doc["group"]), broker=str(doc["broker"]),
                       effective=Permission.parse(str(doc["effective"])), epoch=epoch, pid=pid,
                       start=start)
        except (ValueError, KeyError, TypeError) as exc:
            raise PermissionLogError(f"not a permission change: {exc}") from None


def lapse_time_ns(*, now_ns: int, now_clock: float, lapsed_at_clock: float) -> int:
    """The wall-clock instant a read lease lapsed, from the lease clock.

    A broker learns that its lease lapsed from a timer, which fires late when the process
    was stopped (SIGSTOP, a VM pause). Effective READ ended at the lapse itself — every
    request checks the lease at the moment it is served — so the log records that instant:
    ``now`` minus how long ago, on the lease clock, the lease ran out.
    """
    ago_s = max(0.0, now_clock - lapsed_at_clock)
    return now_ns - int(ago_s * 1e9)


class PermissionLog:
    """Appends :class:`PermissionChange` lines to ``path``. Not thread-safe (one loop)."""

    def __init__(
        self,
        path: Path,
        *,
        group: str,
        broker: str,
        clock_ns: Callable[[], int] = time.time_ns,
    ) -> None:
        self.path = path
        self.group = group
        self.broker = broker
        self._clock_ns = clock_ns
        self._pid = os.getpid()
        self._file: IO[str] | None = None
        self._last: PermissionChange | None = None

    @property
    def last(self) -> PermissionChange | None:
        """The newest change this process recorded."""
        return self._last

    def open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - long-lived

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def record(self, effective: Permission, epoch: int, *, t_ns: int | None = None,
               force: bool = False) -> PermissionChange | None:
        """Append a line if (effective, epoch) changed (or ``force``); returns it.

        ``t_ns`` backdates the line (a lease lapse noticed late); it never goes before the
        previous line, so the file stays ordered.
        """
        last = self._last
        if not force and last is not None and (last.effective, last.epoch) == (effective, epoch):
            return None
        now = self._clock_ns() if t_ns is None else t_ns
        if last is not None:
            now = max(now, last.t_ns)
        change = PermissionChange(t_ns=now, group=self.group, broker=self.broker,
                                  effective=Permission(effective), epoch=epoch, pid=self._pid,
                                  start=last is None)
        self._last = change
        if self._file is not None:
            try:
                self._file.write(change.to_json() + "\n")
                self._file.flush()
            except OSError as exc:
                log.error("permission log %s: write failed: %s", self.path, exc)
        return change


def read_changes(path: Path) -> Iterator[PermissionChange]:
    """The changes in ``path``, oldest first. A torn or foreign line (a crash in the middle
    of a write, a stray edit) is skipped with a warning naming it; nothing is lost around it."""
    try:
        f = open(path, encoding="utf-8", errors="replace")  # noqa: SIM115 - closed below
    except FileNotFoundError:
        return
    with f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                yield PermissionChange.from_json(line)
            except PermissionLogError as exc:
                log.warning("%s:%d skipped: %s", path, number, exc)

