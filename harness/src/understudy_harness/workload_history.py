"""Assemble one history from the pieces a cluster run leaves in different places.

Why this module exists: in the kind chaos suite the traffic runs in a Job, the permission
changes are logged by each broker pod, and the faults and modes are seen by the test on the
host. The shared checker needs all of it as one history on one clock. These pure functions
do the assembling: decode the history the workload Job prints in its log and merge it with
the other pieces in time order (each broker's ``GET /permissions`` answer becomes ``perm``
events in :mod:`.permevents`). Every piece uses ``time.time_ns``; kind nodes are containers
on the test host's kernel, so the clocks agree.
"""

from __future__ import annotations

import base64
import binascii
import gzip
import json
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final

from understudy_harness.history import Event, HistoryError, parse_event

SUMMARY_PREFIX: Final = "SUMMARY "
HISTORY_BEGIN: Final = "HISTORY-BEGIN"
HISTORY_END: Final = "HISTORY-END"


@dataclass(frozen=True, slots=True)
class WorkloadOutput:
    """What the workload Job printed: its one-line summary and its history's events."""

    summary: dict[str, Any]
    events: list[Event]


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
