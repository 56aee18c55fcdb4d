"""Assemble one history from the pieces a cluster run leaves in different places.

Why this module exists: in the kind chaos suite the traffic runs in a Job, the permission
changes are logged by each broker pod, and the faults and modes are seen by the test on the
host. The shared checker needs all of it as one history on one clock. These pure functions
do the assembling: decode the history the workload Job prints in its log, turn each broker's
``GET /permissions`` answer into ``perm`` events (ending a SIGKILLed incarnation's READ at
the kill, as the drill does), and merge everything in time order. Every piece uses
``time.time_ns``; kind nodes are containers on the test host's kernel, so the clocks agree.

Kubernetes twist: a broker in a container is PID 1 in every incarnation, so the log's
``pid`` cannot tell incarnations apart the way it does on one machine. A kill the test
performed is what separates them (:func:`split_incarnations`).
"""

from __future__ import annotations

import base64
import binascii
import gzip
import json
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from understudy_broker.permlog import PermissionChange, PermissionLogError
from understudy_operator.drill import LoggedChange, perm_events_from_log
from understudy_operator.history import Event, Fault, HistoryError, Perm, parse_event

#: Fault kinds that end the broker process without a last log line.
KILL_KINDS: Final = frozenset({"kill", "kill-9"})
SUMMARY_PREFIX: Final = "SUMMARY "
HISTORY_BEGIN: Final = "HISTORY-BEGIN"
HISTORY_END: Final = "HISTORY-END"


@dataclass(frozen=True, slots=True)
class WorkloadOutput:
    """What the workload Job printed: its one-line summary and its history's events."""

    summary: dict[str, Any]
    events: list[Event]


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
    """Number the broker's incarnations by the kills between its lines: a line after the
    k-th kill gets a pid distinct from every line before it (the container's own pid is
    the same, 1, each time)."""
    ordered = sorted(kills)
    out = []
    for ch in changes:
        before = sum(1 for k in ordered if k < ch.t_ns)
        out.append(LoggedChange(t=ch.t_ns, effective=ch.effective, pid=ch.pid + (before << 32)))
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


def parse_workload_logs(logs: str) -> WorkloadOutput:
    """Decode the workload Job's log: a ``SUMMARY {json}`` line and the history, gzipped
    and base64-encoded between ``HISTORY-BEGIN`` and ``HISTORY-END`` lines. Anything else
    in the log is ignored; a missing or damaged part is a :class:`HistoryError`."""
    summary: dict[str, Any] | None = None
    chunks: list[str] = []
    inside = False
    ended = False
    for raw in logs.splitlines():
        line = raw.strip()
        if line == HISTORY_BEGIN:
            inside, chunks = True, []
        elif line == HISTORY_END:
            inside, ended = False, True
        elif inside:
            chunks.append(line)
        elif line.startswith(SUMMARY_PREFIX):
            try:
                doc = json.loads(line[len(SUMMARY_PREFIX):])
            except json.JSONDecodeError as exc:
                raise HistoryError(f"workload summary is not JSON: {exc}") from None
            if not isinstance(doc, dict):
                raise HistoryError("workload summary is not a JSON object")
            summary = doc
    if summary is None:
        raise HistoryError("workload log has no SUMMARY line (did the workload finish?)")
    if not ended:
        raise HistoryError(f"workload log has no complete {HISTORY_BEGIN}..{HISTORY_END} block")
    try:
        text = gzip.decompress(base64.b64decode("".join(chunks), validate=True)).decode("utf-8")
    except (binascii.Error, OSError, EOFError, zlib.error, UnicodeDecodeError) as exc:
        raise HistoryError(f"workload history block is damaged: {exc}") from None
    return WorkloadOutput(summary=summary, events=parse_history_text(text, source="workload history"))


def parse_history_text(text: str, *, source: str) -> list[Event]:
    """Events of a JSONL history given as text (strict, like :func:`.history.read_history`
    but without a torn-tail allowance: a transferred file is whole or damaged)."""
    events: list[Event] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{source}:{number}"
        try:
            doc = json.loads(line)
        except json.JSONDecodeError as exc:
            raise HistoryError(f"{where}: not JSON: {exc}") from None
        if not isinstance(doc, dict):
            raise HistoryError(f"{where}: expected a JSON object, got {type(doc).__name__}")
        ev = parse_event(doc, where=where)
        if ev is not None:
            events.append(ev)
    return events


def merge_events(*sources: Iterable[Event]) -> list[Event]:
    """All events of ``sources`` in time order (stable: equal times keep source order)."""
    merged = [ev for src in sources for ev in src]
    merged.sort(key=lambda ev: ev.t)
    return merged
