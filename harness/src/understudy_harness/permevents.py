"""Permission events from the brokers' permission-change logs.

Why this module exists: the checker judges "one reader" from every broker's own log of
when it held effective READ (``<data-dir>/permissions.jsonl``, served as
``GET /permissions``). The drill reads those files after a local run; the kind suite
fetches them from each pod. Both turn a log into ``perm`` events the same way, here: a
broker killed with SIGKILL writes nothing at its death, so its READ is ended at the kill
the run recorded. Pure functions over plain data.

Kubernetes twist: a broker in a container is PID 1 in every incarnation, so the log's
``pid`` cannot tell incarnations apart the way it does on one machine. Each process marks
its first line (``"start": true``), and that is what separates them; in a log without the
marks (written by an older broker) the kills the test performed do
(:func:`split_incarnations`).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from understudy_broker.ha.permlog import PermissionChange, PermissionLogError
from understudy_broker.model import Permission
from understudy_harness.history import Fault, HistoryError, Perm

#: Fault kinds that end the broker process without a last log line.
KILL_KINDS: Final = frozenset({"kill", "kill-9"})


@dataclass(frozen=True, slots=True)
class LoggedChange:
    """One line of a broker's permission-change log (``permissions.jsonl``)."""

    t: int  # time.time_ns()
    effective: Permission
    pid: int


def perm_events_from_log(
    *, group: str, broker: str, role: str, changes: Sequence[LoggedChange], faults: Sequence[Fault]
) -> list[Perm]:
    """Turn one broker's permission-change log into ``perm`` events.

    A broker killed with SIGKILL writes nothing at its death, so an incarnation (one pid)
    whose last line still holds READ is ended at the drill's ``kill`` of that broker, or —
    for a death the drill did not cause — when the next incarnation writes its first line.
    The kill is recorded just before the signal, so the incarnation may still write a line
    between the two (a master that just took FULL back when the next cycle kills it): the
    kill that ends an incarnation is the first one after its *first* line, and its READ
    ends at that kill or at its last line, whichever is later. Pure.
    """
    kills = sorted(f.t for f in faults if f.broker == broker and f.kind == "kill")

    def killed(first: int, last: int, before: int | None) -> int | None:
        """When the incarnation that wrote lines ``first``..``last`` stopped reading by a
        kill (a kill after ``first``, and before the next incarnation's first line)."""
        k = next((k for k in kills if k >= first and (before is None or k <= before)), None)
        return None if k is None else max(k, last)

    out: list[Perm] = []
    prev: LoggedChange | None = None
    first = 0  # the current incarnation's first line
    for ch in changes:
        if prev is not None and ch.pid != prev.pid:
            if Permission.READ in prev.effective:
                end = killed(first, prev.t, ch.t)
                out.append(Perm(ch.t if end is None else end, group, broker, Permission.NONE,
                                role))
            first = ch.t
        elif prev is None:
            first = ch.t
        out.append(Perm(ch.t, group, broker, ch.effective, role))
        prev = ch
    if prev is not None and Permission.READ in prev.effective:
        end_at = killed(first, prev.t, None)
        if end_at is not None:
            out.append(Perm(end_at, group, broker, Permission.NONE, role))
    return out


def parse_permission_log(text: str, *, source: str) -> list[PermissionChange]:
    """Parse a broker's ``GET /permissions`` answer (NDJSON); a bad line is a
    :class:`HistoryError` naming ``source`` and the line number."""
    out = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            out.append(PermissionChange.from_json(line))
        except PermissionLogError as exc:
            raise HistoryError(f"{source}:{number}: {exc}") from None
    return out


def split_incarnations(changes: Sequence[PermissionChange], *, kills: Sequence[int]) -> list[LoggedChange]:
    """Number the broker's incarnations so that each gets a pid distinct from every other
    (a container's own pid is 1 each time): at each line marked as its process's first
    (``start``), or, in a log without those marks, at each kill between its lines.

    The kills are only a fallback: a kill is recorded just before its signal, so a line
    the dying process writes in between (a master taking FULL back as the next cycle
    kills it) would be counted to the next incarnation, whose READ would then seem to
    start at that line, during the broker's downtime."""
    marked = any(ch.start for ch in changes)
    ordered = sorted(kills)
    out = []
    starts = 0
    for ch in changes:
        starts += ch.start
        incarnation = starts if marked else bisect.bisect_left(ordered, ch.t_ns)  # kills before it
        out.append(LoggedChange(t=ch.t_ns, effective=ch.effective, pid=ch.pid + (incarnation << 32)))
    return out


def broker_perm_events(
    *, group: str, broker: str, role: str, changes: Sequence[PermissionChange], faults: Sequence[Fault]
) -> list[Perm]:
    """``perm`` events for one broker: its logged changes, with READ ended at each kill
    (``kill``/``kill-9``) of that broker that the log cannot show. A deleted pod stops
    gracefully and logs its own NONE, so ``delete-pod`` needs no help."""
    kills = [Fault(f.t, f.cycle, "kill", f.broker, f.group) for f in faults if f.broker == broker and f.kind in KILL_KINDS]
    logged = split_incarnations(changes, kills=[k.t for k in kills])
    return perm_events_from_log(group=group, broker=broker, role=role, changes=logged, faults=kills)
