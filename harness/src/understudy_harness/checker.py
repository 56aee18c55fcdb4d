"""The invariant checker: a recorded history in, a report out. Pure — no clock, no I/O.

Why this module exists: the drill, the kind chaos suite, the benchmark and the tests must
agree on what "lost", "duplicate", "rewind" and "one-reader violation" mean, or the same
run would pass in one place and fail in another. DESIGN.md ("Checker definitions") gives
the definitions; this module is their one implementation, over the typed events of
:mod:`understudy_harness.history` (or the equivalent JSON objects).

Definitions, precisely (``t`` is nanoseconds on the history's one clock):

* **Lost**: an id with a ``produce_ack`` that no consumer group delivered by the end of
  the history (the drill records its final drain before the history ends). An acked id
  that *some* group received but another did not is reported per group as
  ``skipped`` — from that consumer's point of view the message is gone, so it is a
  violation too.
* **Redelivery**: a ``deliver`` for a (cgroup, topic, queue, offset) that the same
  consumer group has already been delivered. Let *f* be the first delivery at that
  position and *d* the repeat. *The crash* is the latest disruption in ``(f.t, d.t]`` —
  a ``fault`` of any broker, or a group ``mode`` change (a failback closes consumer
  sessions just like a crash does). *L* is the group's committed offset for the queue
  (the highest ``commit`` at or before the crash; commits name the next offset to read).
  The repeat is a **duplicate, in flight** when ``f.offset >= L`` (it was inside the
  at-least-once window: delivered but not yet committed), and a **duplicate, rewind**
  otherwise, or when no disruption lies between the two deliveries.
* **Produced twice**: the same id delivered at a *different* position than before — the
  producer retried a send whose acknowledgement was lost, so the log holds two copies.
  Reported as ``duplicates_produce``; it is neither of the two above. Of those, a second
  copy on the *same* queue (``duplicates_same_queue``) breaks invariant 8: an idempotent
  producer's retry to the same queue is stored once. A copy on another queue (a retry
  moved to another group after an ambiguous failure, a hedge) is at-least-once, counted,
  not a violation.
* **Rewind**: a ``commit`` for (cgroup, topic, queue) lower than a commit before it.
* **One-reader violation**: from the ``perm`` events (each broker's effective permission,
  timestamped when it changed or was observed), any maximal interval during which two or
  more brokers of one group hold READ. Events with the same ``t`` are applied together, so
  a hand-over observed in one sample is not an overlap. Reported as a count and the summed
  overlap seconds. An overlap still open when the history ends is closed at its last event.

Per cycle (one ``fault`` event; the cycle window runs to the next fault of the same group,
or the end):

* **reads restored**: from the fault to the first instant at which a broker of the group
  *other than the faulted one* holds READ (for the drill: the acting slave's READ grant as
  sampled; ``0`` if one already did), or — when no slave took over — at which the faulted
  broker regains READ after having lost it (a short hang that never caused a failover).
  This is the server-side figure; a consumer sees its first record after the fault one
  client round trip plus its retry back-off later. *As consumers saw it*: from the fault to
  the first pull, sent after it and answered after failed ones (``read_restored``), that
  another broker of the group answered — or, when none did, the faulted broker itself
  (it read again without a failover: a partition from ZooKeeper, a slow election).
* **failback gap**: when a slave restored reads, the length of the interval with no READ
  holder in the group that ends when the faulted broker regains READ (``0`` if someone
  still held READ at that instant, which is then also a one-reader violation).
* **back-sync**: from the group's ``mode`` entering RECOVERING to its next NORMAL.
* **normal again**: from the fault to the group's next NORMAL ``mode`` event.
* **write stall**: the longest interval during which a producer with pending sends got no
  acknowledgement, in the window from the fault to the next broker fault (or the end):
  per topic (the workload runs one steady producer per topic, so it always has sends
  pending), the longest gap between consecutive ``produce_ack`` events that overlaps the
  window, up to the next fault (a gap that runs across the next fault is that fault's
  stall; the earlier cycle counts only its part before it); the cycle's figure is the
  largest over topics. It includes the failback, when the returning master takes writes
  back. ``None`` without acks on both sides.

Ordered topics (named by ``topic`` events with ``ordered`` true):

* **Order violation**: the first delivery of an acknowledged id ``x`` to a consumer group
  while an id acknowledged before ``x`` (on the same topic) has not been delivered to that
  group yet. Acknowledgement order is the order of the ``produce_ack`` events; deliveries
  are taken in the order they were recorded. Repeats of an id already delivered are
  duplicates (above), not order violations; an id the group never receives is counted as
  lost or skipped, and is left out of the order check (else every later delivery would
  count again for the same gap). Unacknowledged ids are not judged. A producer process
  that was paused (a ``producer-pause`` fault naming it, then a ``restart`` naming it when
  it was continued) reads its clock only once it runs again: the acknowledgements it
  records from the pause until ``PAUSE_GRACE_S`` after it was continued are dated at the
  pause (they answer sends made before it; after waking its lease is over and it sends
  nothing new for longer than that). Its ids are ``<producer>-<n>``.

Delayed messages and nacks (``produce_ack`` events with ``deliver_at_ms``, ``nack``
events; docs/delayed.md):

* **Scheduled lost**: a delayed id acknowledged and delivered to no consumer group by the
  end (also counted in *lost*), or a ``nack`` after which its consumer group never got
  the id again (a violation).
* **Delivered early**: a delivery of a delayed id before its ``deliver_at_ms`` (a
  violation; one clock on one machine).
* **Escape duplicates**: per consumer group, a delayed or handed-back id received at more
  positions (topic, queue, offset) than it was written for — once, plus once per ``nack``
  of it by that group. A due message written twice (by escape and by the master, or twice
  by escape; see the windows in docs/delayed.md) shows here, and so does a delayed send the
  producer re-sent after its acknowledgement was lost. Counted, not a violation: the
  at-least-once window.

Consumer-group members (the ``own`` events, from each member's ownership log):

* **Two members on one queue**: any instant at which two members of one consumer group
  both own the same queue — overlapping ``own`` intervals (``held`` true to false; one
  still open at the end closes there) of different members — or a ``deliver`` by a
  member at an instant it did not own the queue. Counted with the summed overlap.
* Member faults (``fault`` events whose kind starts with ``member-``, e.g. a member that
  crashed without committing) are disruptions for the duplicate rule above, and are not
  failover cycles.

Figures are ``None`` when the history lacks the events to compute them.

When each counted item happened (``Report.marks``, by :data:`MARKS` name): a lost or
skipped id at its first acknowledgement, a rewind at the lower commit, a one-reader or
two-member overlap at its start, a duplicate (of each cause) at the repeated delivery, an
escape duplicate at the delivery of the extra copy. Every count but *lost* and *skipped*
only grows as the history grows, and an item's time is where it first shows: counting the
marks in a window gives what a check of the history cut at the window's end adds to a
check cut at its start (the chaos soak's per-fault-kind table,
:mod:`understudy_harness.chaos`, attributes them to cycles this way).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from understudy_broker.model import Mode, Permission
from understudy_harness.history import (
    Commit,
    Deliver,
    Event,
    Fault,
    ModeChange,
    Nack,
    Own,
    Perm,
    ProduceAck,
    ReadRestored,
    Restart,
    TopicInfo,
    parse_events,
)

#: ``fault`` kinds that name a client, not a broker: a consumer-group member
#: (``member-crash``) or a producer instance (``producer-crash``).
CLIENT_FAULTS = ("member-", "producer-")
#: After a paused producer is continued: how long what it records may still be answers
#: it received while stopped (docs/local-and-drill.md).
PAUSE_GRACE_S = 1.0
NS_PER_MS = 1_000_000
NS_PER_S = 1_000_000_000
#: How many example ids/details a report keeps per category (the counts are exact).
EXAMPLES = 20
#: ``Report.marks`` names: lost and skipped ids, committed-offset rewinds, one-reader and
#: two-member overlaps, duplicates by cause (in flight, rewind, produced twice on another
#: queue, on the same queue, escape).
MARKS = ("lost", "skipped", "offset_rewinds", "one_reader", "two_member", "in_flight",
         "rewind", "produced_other_queue", "same_queue", "escape")


@dataclass(frozen=True, slots=True)
class Overlap:
    """Two or more brokers of ``group`` held READ from ``start`` for ``duration_s``."""

    group: str
    start: int
    duration_s: float
    brokers: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class SharedQueue:
    """Members ``members`` of ``cgroup`` both owned (or one pulled from) ``queue`` from
    ``start`` for ``duration_s``."""

    cgroup: str
    topic: str
    queue: int
    start: int
    duration_s: float
    members: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class OffsetRewind:
    cgroup: str
    topic: str
    queue: int
    t: int
    previous: int
    offset: int


@dataclass(frozen=True, slots=True)
class CycleReport:
    cycle: int
    group: str
    broker: str
    kind: str
    fault_t: int
    reads_restored_ms: float | None
    failback_gap_ms: float | None
    backsync_ms: float | None
    normal_again_ms: float | None
    write_stall_ms: float | None = None
    #: Fault -> the first pull a consumer sent that another broker of the group then
    #: answered, after failed ones (``read_restored``), or the faulted broker itself when
    #: no other did: reads restored as consumers see them, whether or not they had a
    #: backlog. None when no consumer recorded one.
    consumer_reads_restored_ms: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "cycle": self.cycle,
            "group": self.group,
            "broker": self.broker,
            "kind": self.kind,
            "reads_restored_ms": _r(self.reads_restored_ms),
            "failback_gap_ms": _r(self.failback_gap_ms),
            "backsync_ms": _r(self.backsync_ms),
            "normal_again_ms": _r(self.normal_again_ms),
            "write_stall_ms": _r(self.write_stall_ms),
            "consumer_reads_restored_ms": _r(self.consumer_reads_restored_ms),
        }


@dataclass(frozen=True, slots=True)
class Report:
    acked: int
    delivered: int
    lost_acked: int
    lost_examples: tuple[str, ...]
    skipped: Mapping[str, int]
    duplicates_inflight: int
    duplicates_rewind: int
    duplicates_produce: int
    offset_rewinds: int
    rewind_examples: tuple[OffsetRewind, ...]
    one_reader_violations: int
    one_reader_overlap_s: float
    overlaps: tuple[Overlap, ...]
    cycles: tuple[CycleReport, ...] = field(default_factory=tuple)
    two_member_violations: int = 0
    two_member_overlap_s: float = 0.0
    shared_queues: tuple[SharedQueue, ...] = field(default_factory=tuple)
    order_violations: int = 0
    order_examples: tuple[str, ...] = ()
    scheduled_lost: int = 0
    delivered_early: int = 0
    early_examples: tuple[str, ...] = ()
    escape_duplicates: int = 0
    duplicates_same_queue: int = 0
    #: When each counted item happened, by :data:`MARKS` name (see the module's
    #: definitions); not in :meth:`to_json`.
    marks: Mapping[str, tuple[int, ...]] = field(default_factory=dict)

    @property
    def violations(self) -> list[str]:
        """Human-readable invariant violations; empty when the run is clean."""
        out = []
        if self.lost_acked:
            out.append(f"{self.lost_acked} acknowledged message(s) lost")
        for cgroup, n in sorted(self.skipped.items()):
            if n:
                out.append(f"consumer group {cgroup} never received {n} acknowledged message(s)")
        if self.duplicates_rewind:
            out.append(f"{self.duplicates_rewind} duplicate(s) from a rewind")
        if self.duplicates_same_queue:
            out.append(f"{self.duplicates_same_queue} message(s) stored twice on the same "
                       "queue by a retried send (invariant 8)")
        if self.offset_rewinds:
            out.append(f"{self.offset_rewinds} committed-offset rewind(s)")
        if self.one_reader_violations:
            out.append(
                f"{self.one_reader_violations} one-reader violation(s), "
                f"{self.one_reader_overlap_s:.3f}s of overlap"
            )
        if self.two_member_violations:
            out.append(
                f"{self.two_member_violations} time(s) two members on one queue, "
                f"{self.two_member_overlap_s:.3f}s in all"
            )
        if self.order_violations:
            out.append(f"{self.order_violations} order violation(s) on ordered topics")
        if self.scheduled_lost > self.lost_acked:
            out.append(f"{self.scheduled_lost - self.lost_acked} delayed or handed-back "
                       "message(s) never delivered")
        if self.delivered_early:
            out.append(f"{self.delivered_early} delayed message(s) delivered before their "
                       "time")
        return out

    @property
    def ok(self) -> bool:
        return not self.violations

    def figures(self, name: str) -> list[float]:
        values = [getattr(c, name) for c in self.cycles]
        return [v for v in values if v is not None]

    def to_json(self) -> dict[str, Any]:
        """The drill's ``--json`` document (the contract keys plus detail)."""
        restored = self.figures("reads_restored_ms")
        gaps = self.figures("failback_gap_ms")
        backsync = self.figures("backsync_ms")
        stalls = self.figures("write_stall_ms")
        seen = self.figures("consumer_reads_restored_ms")
        return {
            "ok": self.ok,
            "violations": self.violations,
            "acked": self.acked,
            "delivered": self.delivered,
            "lost_acked": self.lost_acked,
            "lost_examples": list(self.lost_examples),
            "skipped": dict(self.skipped),
            "duplicates_inflight": self.duplicates_inflight,
            "duplicates_rewind": self.duplicates_rewind,
            "duplicates_produce": self.duplicates_produce,
            "duplicates_same_queue": self.duplicates_same_queue,
            "offset_rewinds": self.offset_rewinds,
            "one_reader_violations": self.one_reader_violations,
            "one_reader_overlap_s": round(self.one_reader_overlap_s, 6),
            "reads_restored_ms_p50": _r(percentile(restored, 50)),
            "reads_restored_ms_p99": _r(percentile(restored, 99)),
            "failback_gap_ms_p50": _r(percentile(gaps, 50)),
            "failback_gap_ms_p99": _r(percentile(gaps, 99)),
            "backsync_ms_p50": _r(percentile(backsync, 50)),
            "backsync_ms_p99": _r(percentile(backsync, 99)),
            "write_stall_ms_p50": _r(percentile(stalls, 50)),
            "write_stall_ms_p99": _r(percentile(stalls, 99)),
            "consumer_reads_restored_ms_p50": _r(percentile(seen, 50)),
            "consumer_reads_restored_ms_p99": _r(percentile(seen, 99)),
            "two_member_violations": self.two_member_violations,
            "two_member_overlap_s": round(self.two_member_overlap_s, 6),
            "order_violations": self.order_violations,
            "order_examples": list(self.order_examples),
            "scheduled_lost": self.scheduled_lost,
            "delivered_early": self.delivered_early,
            "early_examples": list(self.early_examples),
            "escape_duplicates": self.escape_duplicates,
            "cycles": [c.to_json() for c in self.cycles],
        }


def percentile(values: Sequence[float], p: float) -> float | None:
    """Nearest-rank percentile (``p`` in 0-100); ``None`` for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def _r(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def check(history: Iterable[Event | Mapping[str, Any]]) -> Report:
    """Judge a history. Accepts typed events or their JSON objects, in any order (they are
    ordered by ``t``; ties keep their recorded order). Raises
    :class:`~understudy_harness.history.HistoryError` on a malformed event."""
    events = sorted(parse_events(history), key=lambda e: e.t)
    acks = [e for e in events if isinstance(e, ProduceAck)]
    delivers = [e for e in events if isinstance(e, Deliver)]
    commits = [e for e in events if isinstance(e, Commit)]
    perms = [e for e in events if isinstance(e, Perm)]
    modes = [e for e in events if isinstance(e, ModeChange)]
    faults = [e for e in events if isinstance(e, Fault)]
    owns = [e for e in events if isinstance(e, Own)]
    end = events[-1].t if events else 0
    broker_faults = [f for f in faults if not f.kind.startswith(CLIENT_FAULTS)]

    lost_t, lost_examples, skipped, skipped_t = _losses(acks, delivers)
    nacks = [e for e in events if isinstance(e, Nack)]
    inflight, rewind, other_queue, same_queue = _duplicates(
        delivers, commits, faults, modes, {(n.cgroup, n.id) for n in nacks})
    rewinds = _offset_rewinds(commits)
    timelines = {g: _holders(ps) for g, ps in _by_group(perms).items()}
    overlaps = [o for g, tl in sorted(timelines.items()) for o in _overlaps(g, tl, end)]
    ack_times = _ack_times_by_topic(acks)
    restored_reads = [e for e in events if isinstance(e, ReadRestored)]
    group_of = {p.broker: p.group for p in perms}
    cycles = [dataclasses.replace(
        c, write_stall_ms=_write_stall(c.fault_t, broker_faults, ack_times),
        consumer_reads_restored_ms=_consumer_restored(c, broker_faults, restored_reads, group_of))
        for c in _cycles(broker_faults, timelines, modes)]
    shared = _shared_queues(owns, delivers, end)
    ordered = {e.topic for e in events if isinstance(e, TopicInfo) and e.ordered}
    restarts = [e for e in events if isinstance(e, Restart)]
    disorder = _order_violations(_paused_acks_redated(acks, faults, restarts), delivers,
                                 ordered)
    sched_lost, early, escape_t = _scheduled(acks, delivers, nacks)
    marks = {"lost": lost_t, "skipped": skipped_t, "offset_rewinds": [r.t for r in rewinds],
             "one_reader": [o.start for o in overlaps], "two_member": [x.start for x in shared],
             "in_flight": inflight, "rewind": rewind, "produced_other_queue": other_queue,
             "same_queue": same_queue, "escape": escape_t}
    return Report(
        acked=len({a.id for a in acks}),
        delivered=len(delivers),
        lost_acked=len(lost_t),
        lost_examples=lost_examples,
        skipped=skipped,
        duplicates_inflight=len(inflight),
        duplicates_rewind=len(rewind),
        duplicates_produce=len(other_queue) + len(same_queue),
        duplicates_same_queue=len(same_queue),
        offset_rewinds=len(rewinds),
        rewind_examples=tuple(rewinds[:EXAMPLES]),
        one_reader_violations=len(overlaps),
        one_reader_overlap_s=sum(o.duration_s for o in overlaps),
        overlaps=tuple(overlaps[:EXAMPLES]),
        cycles=tuple(cycles),
        two_member_violations=len(shared),
        two_member_overlap_s=sum(x.duration_s for x in shared),
        shared_queues=tuple(shared[:EXAMPLES]),
        order_violations=len(disorder),
        order_examples=tuple(disorder[:EXAMPLES]),
        scheduled_lost=sched_lost,
        delivered_early=len(early),
        early_examples=tuple(early[:EXAMPLES]),
        escape_duplicates=len(escape_t),
        marks={name: tuple(sorted(marks[name])) for name in MARKS},
    )


# ----------------------------------------------------------------------------- messages


def _losses(
    acks: list[ProduceAck], delivers: list[Deliver]
) -> tuple[list[int], tuple[str, ...], dict[str, int], list[int]]:
    """``(lost, examples, skipped per consumer group, skipped)``; ``lost`` and ``skipped``
    are the first acknowledgement times of those ids."""
    acked: dict[str, int] = {}
    for a in acks:
        acked.setdefault(a.id, a.t)
    by_cgroup: dict[str, set[str]] = defaultdict(set)
    for d in delivers:
        by_cgroup[d.cgroup].add(d.id)
    anywhere = set().union(*by_cgroup.values()) if by_cgroup else set()
    lost = sorted(acked.keys() - anywhere)
    missed = {cg: (acked.keys() & anywhere) - ids for cg, ids in sorted(by_cgroup.items())}
    skipped_t = [acked[i] for ids in missed.values() for i in ids]
    return ([acked[i] for i in lost], tuple(lost[:EXAMPLES]),
            {cg: len(ids) for cg, ids in missed.items()}, skipped_t)


def _scheduled(acks: list[ProduceAck], delivers: list[Deliver], nacks: list[Nack]
               ) -> tuple[int, list[str], list[int]]:
    """Delayed messages and nacks (see the module's definitions): scheduled ids lost,
    deliveries before the due time, and when each copy written more often than asked for
    was first delivered."""
    due = {a.id: a.deliver_at_ms for a in acks if a.deliver_at_ms is not None}
    handed_back: dict[tuple[str, str], int] = defaultdict(int)
    for n in nacks:
        handed_back[(n.cgroup, n.id)] += 1
    anywhere = {d.id for d in delivers}
    lost = sum(1 for i in due if i not in anywhere)
    # A handed-back message must come again to its group after the nack.
    last_delivery: dict[tuple[str, str], int] = {}
    for d in delivers:
        last_delivery[(d.cgroup, d.id)] = d.t
    lost += sum(1 for n in nacks if last_delivery.get((n.cgroup, n.id), -1) <= n.t)
    early: list[str] = []
    positions: dict[tuple[str, str], dict[tuple[str, int, int], int]] = defaultdict(dict)
    for d in delivers:
        at = due.get(d.id)
        if at is not None and d.t < at * 1_000_000:
            early.append(f"{d.cgroup} got {d.id} {(at * 1_000_000 - d.t) / 1e6:.1f} ms early")
        if at is not None or (d.cgroup, d.id) in handed_back:
            positions[(d.cgroup, d.id)].setdefault((d.topic, d.queue, d.offset), d.t)
    extra = [t for key, where in positions.items()
             for t in sorted(where.values())[1 + handed_back.get(key, 0):]]
    return lost, early, extra


def _paused_acks_redated(acks: list[ProduceAck], faults: list[Fault],
                         restarts: list[Restart]) -> list[ProduceAck]:
    """``acks`` (in time order) with those a paused producer recorded on waking dated at
    its pause (see the module's definitions), re-sorted stably."""
    windows: list[tuple[str, int, int]] = []
    for f in faults:
        if f.kind != "producer-pause":
            continue
        resumed = next((r.t for r in restarts if r.broker == f.broker and r.t >= f.t), None)
        if resumed is not None:
            windows.append((f"{f.broker}-", f.t, resumed + int(PAUSE_GRACE_S * NS_PER_S)))
    if not windows:
        return acks
    out = []
    for a in acks:
        for prefix, start, end in windows:
            if start < a.t <= end and a.id.startswith(prefix):
                a = dataclasses.replace(a, t=start)
                break
        out.append(a)
    return sorted(out, key=lambda a: a.t)


def _order_violations(acks: list[ProduceAck], delivers: list[Deliver],
                      ordered: set[str]) -> list[str]:
    """Invariant 7 (see the module's definitions): one entry per first delivery that came
    while an id acknowledged before it was still missing for its consumer group."""
    if not ordered:
        return []
    delivered = {(d.cgroup, d.topic, d.id) for d in delivers if d.topic in ordered}
    cgroups = {d.cgroup for d in delivers if d.topic in ordered}
    # Per (cgroup, topic): the acknowledged ids in acknowledgement order, leaving out those
    # the group never received (lost or skipped, counted there).
    ranks: dict[tuple[str, str], dict[str, int]] = {}
    order: dict[tuple[str, str], list[str]] = {}
    for a in acks:
        if a.topic not in ordered:
            continue
        for cg in cgroups:
            key = (cg, a.topic)
            r = ranks.setdefault(key, {})
            if a.id not in r and (cg, a.topic, a.id) in delivered:
                r[a.id] = len(r)
                order.setdefault(key, []).append(a.id)
    got: dict[tuple[str, str], set[str]] = defaultdict(set)
    next_missing: dict[tuple[str, str], int] = defaultdict(int)
    out: list[str] = []
    for d in delivers:
        key = (d.cgroup, d.topic)
        rank = ranks.get(key, {}).get(d.id)
        if rank is None or d.id in got[key]:
            continue  # not an acknowledged id of an ordered topic, or a repeat
        got[key].add(d.id)
        ids, i = order[key], next_missing[key]
        if rank > i:
            out.append(f"{d.cgroup} got {d.id} before {ids[i]} on {d.topic}")
        while i < len(ids) and ids[i] in got[key]:
            i += 1
        next_missing[key] = i
    return out


def _duplicates(
    delivers: list[Deliver], commits: list[Commit], faults: list[Fault], modes: list[ModeChange],
    nacked: set[tuple[str, str]] | None = None,
) -> tuple[list[int], list[int], list[int], list[int]]:
    """When each duplicate was delivered: ``(in flight, rewind, produced twice on another
    queue, on the same queue)``; an id its group handed back is expected at a new position
    (the retry topic): not "produced twice" (see *escape duplicates*)."""
    nacked = nacked or set()
    disruptions = sorted([f.t for f in faults] + [m.t for m in modes])
    commit_log: dict[tuple[str, str, int], list[Commit]] = defaultdict(list)
    for c in commits:
        commit_log[(c.cgroup, c.topic, c.queue)].append(c)
    first_at: dict[tuple[str, str, int, int], Deliver] = {}
    position_of: dict[tuple[str, str], tuple[str, int, int]] = {}
    inflight: list[int] = []
    rewind: list[int] = []
    other_queue: list[int] = []
    same_queue: list[int] = []
    for d in delivers:
        pos = (d.cgroup, d.topic, d.queue, d.offset)
        first = first_at.get(pos)
        if first is None:
            first_at[pos] = d
            seen = position_of.setdefault((d.cgroup, d.id), (d.topic, d.queue, d.offset))
            if seen != (d.topic, d.queue, d.offset) and (d.cgroup, d.id) not in nacked:
                (same_queue if seen[:2] == (d.topic, d.queue) else other_queue).append(d.t)
            continue
        crash = _last_in(disruptions, after=first.t, upto=d.t)
        if crash is None:
            rewind.append(d.t)
            continue
        committed = _committed_at(commit_log[(d.cgroup, d.topic, d.queue)], crash)
        (inflight if first.offset >= committed else rewind).append(d.t)
    return inflight, rewind, other_queue, same_queue


def _last_in(times: list[int], *, after: int, upto: int) -> int | None:
    """The latest time in ``(after, upto]`` from a sorted list."""
    best = None
    for t in times:
        if t > upto:
            break
        if t > after:
            best = t
    return best


def _committed_at(log: list[Commit], t: int) -> int:
    """The committed offset as of ``t``: the highest commit at or before it (0 if none)."""
    return max((c.offset for c in log if c.t <= t), default=0)


def _offset_rewinds(commits: list[Commit]) -> list[OffsetRewind]:
    high: dict[tuple[str, str, int], int] = {}
    out = []
    for c in commits:
        key = (c.cgroup, c.topic, c.queue)
        prev = high.get(key)
        if prev is not None and c.offset < prev:
            out.append(OffsetRewind(c.cgroup, c.topic, c.queue, c.t, prev, c.offset))
        else:
            high[key] = c.offset
    return out


# ---------------------------------------------------------------------------- readers

# A group's READ-holder timeline: (t, holders from t on), one entry per distinct t.
Timeline = list[tuple[int, frozenset[str]]]


def _by_group(perms: list[Perm]) -> dict[str, list[Perm]]:
    out: dict[str, list[Perm]] = defaultdict(list)
    for p in perms:
        out[p.group].append(p)
    return out


def _holders(perms: list[Perm]) -> Timeline:
    current: set[str] = set()
    timeline: Timeline = []
    for p in perms:
        if Permission.READ in p.effective:
            current.add(p.broker)
        else:
            current.discard(p.broker)
        snapshot = frozenset(current)
        if timeline and timeline[-1][0] == p.t:
            timeline[-1] = (p.t, snapshot)
        else:
            timeline.append((p.t, snapshot))
    return timeline


def _overlaps(group: str, timeline: Timeline, end: int) -> list[Overlap]:
    out = []
    start: int | None = None
    who: set[str] = set()
    for i, (t, holders) in enumerate(timeline):
        if len(holders) >= 2:
            if start is None:
                start, who = t, set()
            who |= holders
        elif start is not None:
            out.append(Overlap(group, start, (t - start) / NS_PER_S, tuple(sorted(who))))
            start = None
        if i == len(timeline) - 1 and start is not None:
            out.append(Overlap(group, start, (max(end, t) - start) / NS_PER_S, tuple(sorted(who))))
    return out


def _holders_at(timeline: Timeline, t: int) -> frozenset[str]:
    current: frozenset[str] = frozenset()
    for at, holders in timeline:
        if at > t:
            break
        current = holders
    return current


def _cycles(
    faults: list[Fault], timelines: Mapping[str, Timeline], modes: list[ModeChange]
) -> list[CycleReport]:
    out = []
    for i, f in enumerate(faults):
        later = [g.t for g in faults[i + 1 :] if g.group == f.group]
        until = later[0] if later else None
        timeline = [
            (t, h)
            for t, h in timelines.get(f.group, [])
            if t >= f.t and (until is None or t < until)
        ]
        before = _holders_at(timelines.get(f.group, []), f.t)
        group_modes = [
            m for m in modes if m.group == f.group and m.t >= f.t and (until is None or m.t < until)
        ]
        restored = _reads_restored(f, before, timeline)
        restored_t = None if restored is None else restored[0]
        gap = None
        if restored is not None and restored[1]:
            gap = _failback_gap(f, [(f.t, before), *timeline], restored[0])
        out.append(
            CycleReport(
                cycle=f.cycle,
                group=f.group,
                broker=f.broker,
                kind=f.kind,
                fault_t=f.t,
                reads_restored_ms=None if restored_t is None else (restored_t - f.t) / NS_PER_MS,
                failback_gap_ms=gap,
                backsync_ms=_backsync(group_modes),
                normal_again_ms=_normal_again(f, group_modes),
            )
        )
    return out


def _consumer_restored(c: CycleReport, faults: list[Fault], reads: list[ReadRestored],
                       group_of: Mapping[str, str]) -> float | None:
    """ms from the fault to the first ``read_restored`` sent at or after it that another
    broker of the faulted group answered (or, when none did, the faulted broker), before
    the group's next fault."""
    until = min((f.t for f in faults if f.group == c.group and f.t > c.fault_t), default=None)
    mine = [r for r in reads if r.t >= c.fault_t and (until is None or r.t < until)
            and group_of.get(r.broker) == c.group]
    first = min((r.t for r in mine if r.broker != c.broker), default=None)
    if first is None:
        first = min((r.t for r in mine), default=None)
    return None if first is None else (first - c.fault_t) / NS_PER_MS


def _reads_restored(
    f: Fault, before: frozenset[str], timeline: Timeline
) -> tuple[int, bool] | None:
    """When reads came back after ``f``, and whether a broker other than the faulted one
    brought them back (``False``: the faulted broker itself regained READ first)."""
    if before - {f.broker}:
        return f.t, True
    master_out = f.broker not in before
    for t, holders in timeline:
        if holders - {f.broker}:
            return t, True
        if f.broker not in holders:
            master_out = True
        elif master_out:
            return t, False
    return None


def _failback_gap(f: Fault, timeline: Timeline, restored_t: int) -> float | None:
    """Length of the no-READ-holder interval that ends when the faulted broker regains
    READ after someone else restored reads; ``0`` when the hand-over left no gap."""
    master_out = False
    gap_start: int | None = None
    for t, holders in timeline:
        if f.broker in holders and master_out and t >= restored_t:
            if holders - {f.broker} or gap_start is None:
                return 0.0
            return (t - gap_start) / NS_PER_MS
        if f.broker not in holders:
            master_out = True
        if holders:
            gap_start = None
        elif gap_start is None:
            gap_start = t
    return None


def _backsync(modes: list[ModeChange]) -> float | None:
    start: int | None = None
    for m in modes:
        if m.mode is Mode.RECOVERING and start is None:
            start = m.t
        elif m.mode is Mode.NORMAL and start is not None:
            return (m.t - start) / NS_PER_MS
    return None


def _normal_again(f: Fault, modes: list[ModeChange]) -> float | None:
    left_normal = False
    for m in modes:
        if m.mode is not Mode.NORMAL:
            left_normal = True
        elif left_normal:
            return (m.t - f.t) / NS_PER_MS
    return None


# ----------------------------------------------------------------- producers and members


def _ack_times_by_topic(acks: list[ProduceAck]) -> list[list[int]]:
    """Each topic's acknowledgement times, in order (``acks`` is sorted by time)."""
    by_topic: dict[str, list[int]] = defaultdict(list)
    for a in acks:
        by_topic[a.topic].append(a.t)
    return list(by_topic.values())


def _write_stall(fault_t: int, faults: list[Fault], ack_times: list[list[int]]) -> float | None:
    """The longest ack gap (ms) overlapping ``[fault_t, next broker fault)``, per topic,
    cut at the next fault."""
    until = min((f.t for f in faults if f.t > fault_t), default=None)
    best: float | None = None
    for times in ack_times:
        if not times or times[0] > fault_t or times[-1] < fault_t:
            continue  # this producer was not running across the fault
        for prev, nxt in itertools.pairwise(times):
            if nxt < fault_t:
                continue
            if until is not None and prev >= until:
                break
            gap = ((nxt if until is None else min(nxt, until)) - prev) / NS_PER_MS
            best = gap if best is None or gap > best else best
    return best


Interval = tuple[int, int, str]  # start, end, member


def _shared_queues(owns: list[Own], delivers: list[Deliver], end: int) -> list[SharedQueue]:
    intervals: dict[tuple[str, str, int], list[Interval]] = defaultdict(list)
    open_at: dict[tuple[str, str, int, str], int] = {}
    for o in owns:
        key = (o.cgroup, o.topic, o.queue, o.member)
        if o.held:
            open_at.setdefault(key, o.t)
        elif key in open_at:
            intervals[key[:3]].append((open_at.pop(key), o.t, o.member))
    for (cgroup, topic, queue, member), start in open_at.items():
        intervals[(cgroup, topic, queue)].append((start, end, member))
    out: list[SharedQueue] = []
    for (cgroup, topic, queue), spans in sorted(intervals.items()):
        spans.sort()
        for i, (_s1, e1, m1) in enumerate(spans):
            for s2, e2, m2 in spans[i + 1:]:
                if s2 >= e1:
                    break
                if m2 != m1:
                    out.append(SharedQueue(cgroup, topic, queue, s2,
                                           (min(e1, e2) - s2) / NS_PER_S, (m1, m2)))
    members_seen = {(o.cgroup, o.topic, o.queue) for o in owns}
    for d in delivers:
        where = (d.cgroup, d.topic, d.queue)
        if d.member is None or where not in members_seen:
            continue  # not a member-mode consumer: nothing to judge
        if not any(s <= d.t <= e and m == d.member for s, e, m in intervals[where]):
            out.append(SharedQueue(d.cgroup, d.topic, d.queue, d.t, 0.0, (d.member,)))
    return sorted(out, key=lambda x: x.start)
