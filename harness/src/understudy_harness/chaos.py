"""The chaos soak's fault kinds, their rotation, and the checker's verdict per kind. Pure.

Why this module exists: ``understudy drill --faults mixed`` (``make chaos``) runs many
cycles of different faults over one cluster, and a single verdict for the whole run says
nothing about which fault broke what. This module decides which fault each cycle injects
(deterministically, so a failure can be reproduced) and splits the one checker's report
(:func:`understudy_harness.checker.check`) by fault kind. The faults themselves are
injected by :mod:`understudy_harness.chaosfaults`.

Attribution: the soak runs one cycle at a time (each heals its fault and waits for NORMAL
before the next begins), so a cycle's window runs from its fault to the next cycle's fault
(the last one's to the end of the run, drain included). Every counted item is charged to
the cycle whose window holds its time (``Report.marks``: a rewind at the lower commit, an
overlap at its start, a duplicate at the repeated delivery) — what a check of the history
cut at the window's end adds to one cut at its start. Items before the first fault are a
row of their own. A *lost* (or skipped) id is charged by its acknowledgement instead, to
the first cycle not yet healed when it was acknowledged: an id acknowledged in the steady
stretch before a fault, or during it, is lost by that fault or its healing, not by the
cycle before.
"""

from __future__ import annotations

import bisect
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from understudy_harness.checker import Report, percentile

#: Every fault kind, in rotation order.
KINDS: Final = ("kill", "hang", "zk_expiry", "partition_master_zk", "partition_master_slave",
                "island_master", "zk_leader_loss", "disk_full")
#: The kinds that need the group placed across network namespaces.
NETNS_KINDS: Final = ("partition_master_zk", "partition_master_slave", "island_master")
#: The row of items that came before the first fault.
BEFORE_FAULTS: Final = "before_faults"
#: The checker's marks that are invariant violations (the others are counted only).
VIOLATION_MARKS: Final = ("lost", "skipped", "offset_rewinds", "one_reader", "two_member",
                          "rewind", "same_queue")
#: ``duplicates`` keys: the checker's marks of each cause (:data:`~.checker.MARKS`).
DUPLICATE_CAUSES: Final = ("in_flight", "rewind", "produced_other_queue", "same_queue",
                           "escape")


def rotation(kinds: Sequence[str], groups: Sequence[str], cycles: int,
             seed: int | None = None) -> list[tuple[str, str]]:
    """Cycle ``n``'s ``(kind, group)`` at index ``n - 1``: rounds of every kind. Without
    ``seed`` the kinds keep their order and the group moves on by one each cycle and by
    one more each round (so each kind meets every group); with ``seed``, each round's
    order and each cycle's group come from ``random.Random(seed)``."""
    if not kinds or not groups:
        raise ValueError("rotation needs at least one kind and one group")
    rng = None if seed is None else random.Random(seed)
    out: list[tuple[str, str]] = []
    while len(out) < cycles:
        n = len(out)
        if rng is None:
            order = list(kinds)
            picks = [groups[(n + i + n // len(kinds)) % len(groups)] for i in range(len(kinds))]
        else:
            order = rng.sample(list(kinds), len(kinds))
            picks = [rng.choice(list(groups)) for _ in kinds]
        out += list(zip(order, picks, strict=True))
    return out[:cycles]


@dataclass(frozen=True, slots=True)
class KindSummary:
    """One fault kind's row: its cycles and what the checker counted in their windows."""

    kind: str
    cycles: int = 0
    lost_acked: int = 0
    missed_by_a_consumer_group: int = 0
    offset_rewinds: int = 0
    one_reader_violations: int = 0
    two_member_violations: int = 0
    duplicates: Mapping[str, int] = field(
        default_factory=lambda: dict.fromkeys(DUPLICATE_CAUSES, 0))
    consumer_reads_restored_ms: tuple[float, ...] = ()
    reads_restored_ms: tuple[float, ...] = ()
    write_stall_ms: tuple[float, ...] = ()
    #: Cycles of this kind that did not complete (the drill's errors say why).
    incomplete: int = 0
    #: Why this kind did not run here; ``None`` when it ran (or could have).
    skipped: str | None = None
    #: When each violation charged to this kind happened (ns on the history's clock), by
    #: checker mark name: where to look in the history and the logs.
    violations_at: Mapping[str, tuple[int, ...]] = field(default_factory=dict)

    @property
    def violations(self) -> int:
        return (self.lost_acked + self.missed_by_a_consumer_group + self.offset_rewinds
                + self.one_reader_violations + self.two_member_violations
                + self.duplicates["rewind"] + self.duplicates["same_queue"])

    def to_json(self) -> dict[str, Any]:
        """The ``chaos.json`` object of this kind (the contract keys, then detail)."""
        def p(values: tuple[float, ...], q: float) -> float | None:
            got = percentile(values, q)
            return None if got is None else round(got, 3)

        return {
            "cycles": self.cycles,
            "lost_acked": self.lost_acked,
            "offset_rewinds": self.offset_rewinds,
            "one_reader_violations": self.one_reader_violations,
            "two_member_violations": self.two_member_violations,
            "duplicates": dict(self.duplicates),
            "consumer_reads_restored_ms_p99": p(self.consumer_reads_restored_ms, 99),
            "write_stall_ms_p99": p(self.write_stall_ms, 99),
            "consumer_reads_restored_ms_p50": p(self.consumer_reads_restored_ms, 50),
            "write_stall_ms_p50": p(self.write_stall_ms, 50),
            "reads_restored_ms_p50": p(self.reads_restored_ms, 50),
            "reads_restored_ms_p99": p(self.reads_restored_ms, 99),
            "missed_by_a_consumer_group": self.missed_by_a_consumer_group,
            "incomplete": self.incomplete,
            "skipped": self.skipped,
            "violations_at_ns": {k: list(v) for k, v in self.violations_at.items()},
        }


def summarize(report: Report, *, heals: Mapping[int, int],
              kinds: Sequence[str] = KINDS, skipped: Mapping[str, str] | None = None,
              incomplete: Mapping[str, int] | None = None) -> list[KindSummary]:
    """One row per kind of ``kinds`` (and any other kind a cycle had), then a
    :data:`BEFORE_FAULTS` row when something was counted before the first fault.
    ``heals``: each cycle's heal time (its ``restart`` event) by cycle number; a cycle
    without one heals at the next fault. ``skipped``: kinds that could not run, with the
    reason. See the module's docstring for how items are charged to cycles."""
    skipped = skipped or {}
    incomplete = incomplete or {}
    cycles = sorted(report.cycles, key=lambda c: c.fault_t)
    starts = [c.fault_t for c in cycles]
    ends = [heals.get(c.cycle, starts[i + 1] if i + 1 < len(starts) else None)
            for i, c in enumerate(cycles)]
    counts: dict[str, dict[str, int]] = {}
    at: dict[str, dict[str, list[int]]] = {}

    def charge(row: str, name: str, t: int) -> None:
        counts.setdefault(row, {})[name] = counts.get(row, {}).get(name, 0) + 1
        if name in VIOLATION_MARKS:
            at.setdefault(row, {}).setdefault(name, []).append(t)

    for name, times in report.marks.items():
        for t in times:
            if name in ("lost", "skipped"):
                i = _first_unhealed(ends, t)
            else:
                i = bisect.bisect_right(starts, t) - 1
            charge(BEFORE_FAULTS if i is None or i < 0 else cycles[i].kind, name, t)
    order = list(dict.fromkeys([*kinds, *(c.kind for c in cycles)]))
    if counts.get(BEFORE_FAULTS):
        order.append(BEFORE_FAULTS)
    rows = []
    for kind in order:
        mine = [c for c in cycles if c.kind == kind]
        got = counts.get(kind, {})

        def figures(name: str, mine: list[Any] = mine) -> tuple[float, ...]:
            return tuple(v for c in mine if (v := getattr(c, name)) is not None)

        rows.append(KindSummary(
            kind=kind, cycles=len(mine), lost_acked=got.get("lost", 0),
            missed_by_a_consumer_group=got.get("skipped", 0),
            offset_rewinds=got.get("offset_rewinds", 0),
            one_reader_violations=got.get("one_reader", 0),
            two_member_violations=got.get("two_member", 0),
            duplicates={cause: got.get(cause, 0) for cause in DUPLICATE_CAUSES},
            consumer_reads_restored_ms=figures("consumer_reads_restored_ms"),
            reads_restored_ms=figures("reads_restored_ms"),
            write_stall_ms=figures("write_stall_ms"),
            incomplete=incomplete.get(kind, 0), skipped=skipped.get(kind),
            violations_at={k: tuple(v) for k, v in at.get(kind, {}).items()}))
    return rows


def _first_unhealed(ends: Sequence[int | None], t: int) -> int | None:
    """The first cycle whose heal is at or after ``t`` (the last cycle if every one healed
    before it); ``None`` without cycles."""
    for i, end in enumerate(ends):
        if end is None or t <= end:
            return i
    return len(ends) - 1 if ends else None


def to_json(rows: Sequence[KindSummary]) -> dict[str, Any]:
    """``chaos.json``: one object per fault kind, by kind."""
    return {r.kind: r.to_json() for r in rows}
